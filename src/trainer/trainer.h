// The training loop behind `remat train`: data, the compiled programs (the training step, evaluation,
// sampling: each planned, the latter two reading the step's parameter buffers; trainer/programs.h), progress,
// evaluation, metrics (JSONL), checkpoints (train/checkpoint_manager.h), a generated sample at the end, and
// the process's peak memory next to the plans'. What the config derives before anything compiles (the mesh,
// the pipeline schedule, the step's shape) is `plan_run`, shared with `remat plan`.
#pragma once

#include "compile/compile.h"
#include "parallel/parallel.h"
#include "train/data.h"

#include <map>
#include <optional>
#include <string>

namespace remat::trainer {

struct RunConfig {
  nn::ModelConfig model;
  train::StepShape shape;
  train::OptimizerConfig optimizer;
  int64_t steps = 600;                 // optimizer updates
  uint64_t init_seed = 0;              // parameter initialisation
  uint64_t data_seed = 0;              // batch sampling
  train::DataConfig data;              // dataset_type, dataset_path, eval_dataset_path, ... (train/data.h)
  train::TokenizerConfig tokenizer;    // tokenizer_type, tokenizer_path (train/tokenizer.h)
  int64_t eval_interval = 100;         // validation every this many steps (and at the end)
  int64_t eval_steps = 8;              // validation batches per evaluation
  int64_t log_period = 25;             // progress line every this many steps
  std::string run_dir;                 // metrics.jsonl goes here
  std::string sample_prompt = "The ";  // generation at the end
  int64_t sample_length = 200;         // tokens to generate
  double sample_temperature = 0.0;     // 0 = greedy
  bool remat_allow_unmatched = false;  // policy names matching no checkpoint name: warn instead of fail
  bool fusion = true;                  // fuse elementwise chains into single kernels (compile::Request::fuse)
  std::string dump_ir_after;           // `--dump-ir`: print every program compiled after this pass
  bool enable_profiler = false;        // trace one step (trace.json in run_dir): a track per rank
  int64_t skip_first_n_steps_for_profiler = 1;  // the traced step comes after these (the last if fewer)
  bool enable_checkpointing = false;   // save checkpoints; resume from the run's latest complete one
  int64_t checkpoint_period = 100;     // save every this many steps (and at the end)
  int64_t max_checkpoints = 2;         // complete checkpoints kept (older ones deleted); 0: all
  std::string load_parameters_path;    // start from these saved parameters (a checkpoint file or folder)
  std::map<std::string, std::string> config_values;  // every config key's final value (saved, compared on resume)
  int64_t ici_data_parallelism = 1;    // data-parallel ranks within a host; -1: the ranks left
  int64_t dcn_data_parallelism = -1;   // across hosts; -1: the ranks left
  int64_t ici_fsdp_parallelism = 1;    // FSDP ranks within a host; -1: the ranks left
  int64_t dcn_fsdp_parallelism = 1;    // across hosts; -1: the ranks left
  int64_t ici_tensor_parallelism = 1;  // tensor-parallel ranks within a host (Megatron's layout)
  int64_t dcn_tensor_parallelism = 1;  // across hosts
  int64_t ici_tensor_sequence_parallelism = 1;  // tensor parallelism with the sequence split between the blocks
  int64_t dcn_tensor_sequence_parallelism = 1;
  int64_t ici_pipeline_parallelism = 1;          // pipeline stages
  int64_t num_pipeline_microbatches = -1;        // -1: the stages
  int64_t num_layers_per_pipeline_stage = -1;  // -1: derived (pipeline_schedule in run_plan.cpp)
  int64_t num_pipeline_repeats = -1;             // chunks per rank; -1: layers / (stages x layers per stage)
  std::string pipeline_schedule = "gpipe";       // gpipe | 1f1b | interleaved_1f1b
};

// What a run's config derives before anything compiles, the same for `remat train` (its launched ranks) and
// `remat plan` (one device of the mesh the config describes).
struct RunPlan {
  nn::Mesh replicas;                            // the data, fsdp and tensor axes: one stage's ranks (ModelConfig::mesh)
  bool sequence_parallel = false;               // the tensor axis splits the sequence too (ModelConfig's)
  std::optional<parallel::Schedule> pipeline;   // when ici_pipeline_parallelism > 1 (the stages: an outer axis)
  train::StepShape shape;                       // one device's step: under a pipeline, one microbatch's
};

// The run's plan over `ranks` launched processes (0 where none are, as for `remat plan`). CHECKs that the
// ranks split into the stages and the parallelism keys, and that the pipeline fits the model and the batch.
RunPlan plan_run(const RunConfig& config, int64_t ranks);

// The pipeline schedule the config asks for (keys ici_pipeline_parallelism, num_pipeline_microbatches,
// num_layers_per_pipeline_stage, num_pipeline_repeats, pipeline_schedule), CHECKed to fit the model.
parallel::Schedule pipeline_schedule(const RunConfig& config);

// The step's shape under a pipeline (MaxText's batch): per_device_batch_size on every device, stages included;
// a replica's sequences (its stages' share) cut into the schedule's microbatches. CHECKs that they divide and
// that gradient_accumulation_steps is 1 (the microbatches accumulate).
train::StepShape pipeline_step_shape(const RunConfig& config, const parallel::Schedule& schedule);

// The mesh of `ranks` processes (0 where none are launched, as for `remat plan`: a -1 is then 1): data =
// ici x dcn data parallelism, fsdp = ici x dcn fsdp parallelism, tensor = the product of the tensor and
// tensor_sequence keys (the last axis, varying fastest over the ranks: neighbours in a node), the one -1
// among the data and fsdp keys filled so that the product is `ranks`. CHECKs that it divides.
nn::Mesh mesh_of(const RunConfig& config, int64_t ranks);

// The model as one device of the run holds it: `config.model` on the plan's mesh (its shards, its part of the
// batch, its collectives), sequence-parallel as the plan says.
nn::ModelConfig device_model(const RunConfig& config, const RunPlan& plan);

// The plan's mesh in words: "2 data-parallel x 2 tensor-parallel (sequence-parallel)"; "one device".
std::string mesh_text(const RunPlan& plan);

struct RunResult {
  double train_loss = 0;       // last step's loss
  double validation_loss = 0;  // final evaluation, nats per token
  double validation_loss_per_byte = 0;  // the same per byte of text; 0 where the bytes per token are unknown
  int64_t peak_rss = 0;        // the process's peak resident bytes (VmHWM) at the end
  int64_t baseline_rss = 0;    // resident bytes before the first compile (binary, libraries, data)
  int64_t planned_bytes = 0;   // the programs' plans: owned arguments and arenas of step, evaluation, sampling
};

RunResult run(const RunConfig& config);

// The validation loss as printed: "2.1234 nats/token", then ", 0.5678 nats/byte" where that is known.
std::string validation_loss_str(const RunResult& r);

}  // namespace remat::trainer
