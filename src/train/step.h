// The training step as one graph (docs/design.md, "The data path"): loss and gradients (accumulated over microbatches by a
// scan), global-norm clipping, the warmup + cosine learning rate and the AdamW update, so that later
// passes (remat, planning) see the whole step.
#pragma once

#include "nn/nn.h"
#include "parallel/parallel.h"
#include "remat/remat.h"

namespace remat::train {

// jmp's DynamicLossScale, for f16 compute (bf16 needs none): the loss is multiplied by `scale` before
// differentiation and the gradients divided by it; a step whose gradients are not all finite is skipped
// (parameters and moments kept) and the scale divided by `factor` (not below `min_scale`, >= 1: unscaling
// never overflows a finite gradient); after `period` finite steps in a row it is multiplied by `factor`.
struct LossScaleConfig {
  bool enabled = false;
  double initial = 32768;  // 2^15
  int64_t period = 2000;
  double factor = 2;
  double min_scale = 1;
};

struct OptimizerConfig {
  double learning_rate = 1e-3;         // peak learning rate
  int64_t warmup_steps = 100;          // linear warmup from lr/warmup to lr
  int64_t schedule_steps = 1000;       // length of warmup + cosine decay (usually the number of steps)
  double final_lr_fraction = 0.1;      // the cosine decays to learning_rate * this
  double b1 = 0.9;                     // Adam beta1
  double b2 = 0.95;                    // Adam beta2
  double eps = 1e-8;                   // Adam epsilon
  double weight_decay = 0.1;           // decoupled weight decay (AdamW), on every parameter
  double clip_norm = 1.0;              // global gradient norm threshold; 0 disables clipping
  LossScaleConfig loss_scale;          // dynamic loss scaling (f16)
};

struct StepShape {
  int64_t batch = 8;           // sequences per microbatch
  int64_t seq = 128;           // tokens per sequence
  int64_t accumulation = 1;    // microbatches per step (gradient accumulation)
  // Every rank of the model's mesh (nn::ModelConfig::mesh: data and fsdp) takes `accumulation` microbatches of
  // the global batch; the loss and gradient sums are reduced over them, in rank order, before the mean.
};

// Under a pipeline, an action of the rank's schedule and the origins (ir::Node::origin) of the ops it traced,
// [first, end): a program's node comes from the action whose span holds its origin — a recomputed one from the
// backward of that microbatch and chunk. How a profile's kernel calls are told apart by action (the trace).
struct ActionSpan {
  parallel::Action action;
  uint64_t first = 0, end = 0;
};

// The action among `actions` (in tracing order: their origins increase) that traced the op of this origin; null
// for an op traced outside every action (the update after the schedule).
const ActionSpan* action_of(const std::vector<ActionSpan>& actions, uint64_t origin);

// A program and its typed signature (ir/signature.h): every argument and result named, with its role.
struct Program {
  ir::Graph graph;
  ir::Signature signature;
  std::vector<ActionSpan> actions;  // pipeline steps only
};

// (params P..., inputs i32[k,B,T], targets i32[k,B,T]) -> (loss, grads P...): the mean loss and its
// gradients over k microbatches. k > 1 runs the microbatches under a scan whose carry sums the gradients.
// Remat regions follow the model's remat_policy; `decider` (optional) records every residual's decision.
// Results: `loss` (metric), `grad/<param>` (output).
Program grads_program(const nn::ModelConfig& model, const StepShape& shape, rematerialize::Decider* decider = nullptr);

// (params P..., m P..., v P..., step i32[], inputs i32[k,B,T], targets i32[k,B,T])
//   -> (loss, grad_norm, lr, params' P..., m' P..., v' P...).
// Arguments: parameters by their path, moments `opt_m/<path>` and `opt_v/<path>` (optimizer_state), `step`
// (the updates done before this one, 0 for the first), `inputs` and `targets` (batch). With loss scaling
// `loss_scale` f32[] and `loss_scale_count` i32[] (loss_scale) come after `step`, and the results end with
// their new values and the metric `finite` (1 if the update was applied, 0 if skipped). Every new value
// is a result named as the argument it updates (Signature::updates()).
Program step_program(const nn::ModelConfig& model, const StepShape& shape, const OptimizerConfig& opt,
                     rematerialize::Decider* decider = nullptr);

// Pipeline parallelism: the step of rank `rank` of the `stage` axis — its chunks' parameters (stage_param_specs
// of pipeline_parts, each named by pipeline_arg_name), their moments, `step` (and the loss scale), `inputs`
// [m,B,T] if it holds the first stage and `targets` [m,B,T] if it holds the last — running its actions of
// `schedule` in order: forward and backward of one microbatch through one chunk (the stage traced as the
// whole model traces those layers: the remat policy once, on each layer's region, names kept), sends and
// receives of activations and their gradients, the gradients summed over the microbatches in order. Then
// the loss (the last stage's, all-reduced over the stage axis), the mean over the data-parallel ranks and
// the update as step_program's, the gradient norm over every stage's rows. With the same microbatches, the
// ranks' results are bit-identical to step_program's with gradient_accumulation_steps = m. `decider` records
// the first microbatch of each chunk. Results as step_program's (for its own parameters).
Program pipeline_step_program(const nn::ModelConfig& model, const StepShape& shape, const OptimizerConfig& opt,
                              const parallel::Schedule& schedule, int64_t rank, rematerialize::Decider* decider = nullptr);
// Evaluation and sampling under a pipeline: rank `rank`'s part of the forward of one batch — (its chunks'
// parameters, `inputs` i32[1,B,T] on the first stage's rank, `targets` i32[1,B,T] on the last's for the loss)
// -> the metric `loss` or the output `logits` f32[B,T,V], the last stage's, all-reduced over the stage axis so
// that every rank has it (bit-identical to loss_program's / logits_program's).
enum class Forward { loss, logits };
Program pipeline_forward_program(const nn::ModelConfig& model, int64_t batch, int64_t seq,
                                 const parallel::PipelineShape& shape, int64_t rank, Forward what);
// FLOPs of each virtual stage's forward and backward (recomputes included) of one microbatch [batch, seq], for its
// layers only (under its policy: nn::stage_remat_policy): the simulator's costs (parallel::simulate). Where the
// schedule splits backwards, the backward is split as the step splits it (W recomputes what it reads of B's
// recomputes) and `weight` is W's share; else 0.
std::vector<parallel::Costs> stage_costs(const nn::ModelConfig& model, const parallel::Schedule& schedule,
                                         int64_t batch, int64_t seq);
// The model's parts on pipeline rank `rank`: chunk j is virtual stage j·p + rank (circular placement).
std::vector<nn::StagePart> pipeline_parts(const nn::ModelConfig& model, const parallel::PipelineShape& shape, int64_t rank);
// The layers' policy of rank `rank`'s chunks (nn::stage_remat_policy), as written; distinct ones joined by " | ".
std::string rank_remat_policy(const nn::ModelConfig& model, const parallel::PipelineShape& shape, int64_t rank);
// A stage parameter's argument name: its path, with the layers it holds for stacked layer parameters
// ("decoder/layers/mlp/wo/kernel[4:8]").
std::string pipeline_arg_name(const nn::ParamSpec& spec, const nn::StagePart& part);

// Evaluation: (params P..., inputs i32[B,T], targets i32[B,T]) -> the metric `loss`.
Program loss_program(const nn::ModelConfig& model, int64_t batch, int64_t seq);
// Sampling: (params P..., inputs i32[B,T]) -> `logits` f32[B,T,V].
Program logits_program(const nn::ModelConfig& model, int64_t batch, int64_t seq);
// Generation with a KV cache (nn::prefill_graph, nn::decode_graph; decode.cpp): (params P..., inputs
// i32[B,P]) -> `logits` f32[B,V], `cache/key`, `cache/value` (outputs) of `max_length` positions; and
// (params P..., inputs i32[B,1], position i32[], cache/key, cache/value (batch)) -> `logits`, `new_cache/key`,
// `new_cache/value`, new values the caller copies into its cache arguments (a dynamic_update_slice reads the
// cache it writes, so the planner cannot donate it).
Program prefill_program(const nn::ModelConfig& model, int64_t batch, int64_t prompt, int64_t max_length);
Program decode_program(const nn::ModelConfig& model, int64_t batch, int64_t max_length);

// The learning rate of update `step` (an integer scalar, 0-based) as the step graph traces it, an f32 scalar:
// linear warmup over warmup_steps up to the peak, then cosine decay to final_lr_fraction · peak at
// schedule_steps, flat after.
ir::Tensor learning_rate(ir::Builder& b, const OptimizerConfig& opt, ir::Tensor step);

}  // namespace remat::train
