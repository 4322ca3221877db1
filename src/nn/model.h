// The Llama-style decoder, traced into IR (MaxText's parameter and checkpoint names).
//   token embedding -> L x [RMSNorm -> causal GQA self-attention with RoPE -> residual
//                          -> RMSNorm -> gated MLP (SiLU(x Wi0) * x Wi1) Wo -> residual]
//   -> RMSNorm -> output projection (untied, or tied to the embedding) -> softmax cross-entropy in f32.
// No biases. Layer parameters are stacked [L, ...]; with scan_layers the layers run under one scan over
// them, otherwise unrolled over slices of the same stacked parameters: the same arithmetic either way.
// Each layer is a remat region (jax.checkpoint) with remat_policy; with layers_per_group the scan runs
// over groups, each group a remat region with group_remat_policy holding a scan over its layers' regions
// (JAX's nested jax.checkpoint: a group's backward recomputes its forward with remat_policy applied to its
// layers).
// Mixed precision: weights are stored in precision.param; activations and matmuls run in
// precision.compute, each layer casting its own matmul kernels inside the scanned body, as one allocation
// (a convert_group: weight-derived, so under remat it is recomputed, never stacked); mp_cast=upfront casts
// every layer's kernels before the loop instead. RMSNorm scales stay in the param dtype; RMSNorm
// statistics, the logits and the loss run in f32, the attention scores too unless both float32_qk_product
// and float32_logits are off; the softmax op computes in f32 whatever its input, its probabilities in the
// compute dtype.
//
//   nn::ModelConfig c = ...;
//   ir::Graph g = nn::loss_graph(c, /*batch=*/8, /*seq=*/128);   // (params..., inputs, targets) -> loss
//   std::vector<exec::Array> params = nn::init_params(c, /*seed=*/0);
#pragma once

#include "nn/checkpoint_names.h"

#include "exec/exec.h"
#include "ir/ir.h"
#include "nn/precision.h"
#include "remat/policy.h"

#include <optional>
#include <span>
#include <string>
#include <vector>

namespace remat::nn {

struct ModelConfig {
  int64_t vocab_size = 256;          // tokens (bytes)
  int64_t emb_dim = 128;             // D
  int64_t num_decoder_layers = 4;    // L
  int64_t num_heads = 4;             // H, query heads
  int64_t num_kv_heads = 4;          // KV, key/value heads (grouped-query attention when < H)
  int64_t head_dim = 32;             // Dh
  int64_t mlp_dim = 512;             // F
  double rope_theta = 10000;         // RoPE max timescale
  double rms_eps = 1e-6;             // RMSNorm epsilon
  bool logits_via_embedding = false; // tie the output projection to the embedding
  bool scan_layers = true;           // run the layers under a scan (else unrolled)
  int64_t layers_per_group = 0;      // > 0: a scan over groups of this many layers, each a scan (double scan)
  rematerialize::Policy remat_policy = rematerialize::parse_policy("full");  // of each layer; kind none: no
                                                                            // remat region (nor group region)
  // Of each group (layers_per_group > 0): what crosses groups. Its default keeps only the groups' inputs.
  rematerialize::Policy group_remat_policy = rematerialize::parse_policy("nothing_saveable");
  // Under a pipeline (pipeline_stage_remat_policies): the layers' policy of each virtual stage k, entry
  // k % size (one per virtual stage, or one per rank for all of its chunks); empty: remat_policy everywhere.
  std::vector<rematerialize::Policy> stage_remat_policies;
  names::Naming checkpoint_naming = names::Naming::maxtext;  // the checkpoint names the layer's tensors carry
  bool fused_qkv = false;            // q, k, v as one matmul against [D, H+2KV, Dh], named qkv_proj (MaxText's)
  bool fused_mlp = false;            // gate and up as one matmul against [D, 2, F], named mlpwi (MaxText's)
  PrecisionPolicy precision;         // param (master weights), compute (activations, matmuls) dtypes
  bool cast_upfront = false;         // cast every layer's kernels to the compute dtype before the layers (mp_cast=upfront)
                                     // instead of each layer casting its own weights where it uses them
  bool flash_attention = false;      // attention: flash (one fused op, ir/ops.h) instead of dot_product (primitives)
  // Stability knobs with MaxText's names (no effect when compute is f32):
  bool float32_qk_product = true;    // attention q.k in f32 (q and k cast up); else in the compute dtype
  bool float32_logits = true;        // attention scores cast up to f32 before the softmax (if not already)
  bool logits_dot_in_fp32 = false;   // the vocabulary projection in f32; else in the compute dtype, cast up
  int64_t num_vocab_tiling = 1;      // > 1: the output projection and loss over this many chunks of the batch's
                                     // tokens (MaxText's key; it chunks tokens, not the vocabulary), [B,T,V]
                                     // logits never all live
  bool padded_targets = false;       // packing=false: targets < 0 are padding, and the loss is the mean over the
                                     // targets >= 0 (1 when there are none); else over every target
  // Distribution: the mesh one step runs on, and which logical parameter axis is sharded over which mesh
  // axis. With fsdp > 1 (FSDP, ZeRO-3) every parameter is a shard along its embed dimension; the model
  // all-gathers each where it is used (a layer's weights inside the layer, cast to the compute dtype
  // first), and the batch is split over the data and fsdp ranks. With tensor = t > 1 (Megatron-LM's tensor
  // parallelism) the heads, kv heads, MLP width and vocabulary are split t ways, each rank computing its
  // heads and its part of the MLP and of the vocabulary on the same sequences (docs/parallelism.md): sums
  // over `tensor` leave each parallel block; kv heads fewer than t are held whole and each rank reads the
  // one its query heads use (Megatron replicates them so).
  Mesh mesh;
  AxisMapping axis_rules = {{"embed", "fsdp"}, {"heads", "tensor"}, {"kv_heads", "tensor"}, {"mlp", "tensor"},
                            {"vocab", "tensor"}};
  // Sequence parallelism (MaxText's tensor_sequence; Korthikanti et al. 2022): under tensor > 1 the
  // activations between the parallel blocks (norms, residual adds, the layer input) are split along the
  // sequence over `tensor`: an all-gather enters each block and a reduce-scatter leaves it.
  bool sequence_parallel = false;
};

// Checks the shapes fit together; errors name the config key.
void validate(const ModelConfig& c);

// The checkpoint names the model's layer carries (its naming and fusions).
inline names::Vocabulary vocabulary(const ModelConfig& c) { return {c.checkpoint_naming, c.fused_qkv, c.fused_mlp}; }

// How the layer of `c` spells the names MaxText presets and `custom` keys write: what the policy parser is
// handed, so that remat/ need not know the layer.
rematerialize::Spelling policy_spelling(const ModelConfig& c);

// Policy text as the layer of `c` spells it (the parser, handed policy_spelling(c)).
inline rematerialize::Policy parse_remat_policy(const std::string& text, const ModelConfig& c,
                                                const rematerialize::CustomKeys& keys = {}) {
  return rematerialize::parse_policy(text, policy_spelling(c), keys);
}

enum class Init { normal, ones };

struct ParamSpec {
  std::string path;  // e.g. "decoder/layers/mlp/wi_0/kernel"
  ir::Type type;     // of this device's part: the whole parameter, or its shard
  Init init;
  double std;        // for Init::normal
  std::vector<std::string> axes;  // the logical name of each dimension (layers, embed, heads, kv, mlp, vocab, ...)
  int64_t shard_dim = -1;         // the dimension split over `fsdp` (axis_rules); -1: whole along it
  int64_t shards = 1;             // the parts it is split into (that axis's size)
  int64_t tensor_dim = -1;        // the dimension split over `tensor`; -1: every tensor rank holds it whole
  int64_t tensor_shards = 1;
  // The dimension axis_rules maps to `fsdp`, whether or not the mesh splits it (-1: none): a reduction that
  // keeps it sums in the same order sharded or not.
  int64_t fsdp_dim = -1;
  ir::Type whole_type() const;    // the whole parameter's
  bool stacked() const;           // one slice per decoder layer along dimension 0 (the `layers` axis)
};

// One pipeline stage's part of the model: decoder layers [first_layer, first_layer + num_layers), after the
// token embedding (`embedding`: the first stage) and before the final norm, output projection and loss
// (`head`: the last stage). A stage traces the same ops as the whole model does for its part.
struct StagePart {
  int64_t first_layer = 0, num_layers = 0;
  bool embedding = false, head = false;
  bool operator==(const StagePart&) const = default;
};

// The parameter tree in a fixed order: the order of the graphs' leading params and of init_params(). Under
// FSDP each is this device's shard; a dimension that the mesh axis does not divide is refused (naming the
// parameter, the config keys and the sizes that would divide it).
std::vector<ParamSpec> param_specs(const ModelConfig& c);
int64_t param_count(const ModelConfig& c);

// Which block of each parameter a rank holds: its coordinates along the mesh axes `fsdp` and `tensor`.
struct ShardIndex {
  int64_t fsdp = 0, tensor = 0;
};

// Deterministic initialisation from a seed (normal std 0.02; output projections 0.02 / sqrt(2L); norms 1).
// Fused kernels are the unfused draws stacked, so fused and unfused models start from the same weights.
std::vector<exec::Array> init_params(const ModelConfig& c, uint64_t seed);
// The same values written into existing arrays of the parameters' types (an executable's own buffers).
// Under FSDP or tensor parallelism, the rank's block `at` of the values one device would hold: each
// parameter is drawn whole into a temporary, one at a time, and its block kept.
void init_params(const ModelConfig& c, uint64_t seed, std::span<exec::Array> into, ShardIndex at = {});

// The parameters of pipeline stages `parts` (stage_param_specs of each, one after another): the same values as
// the rows of init_params(c, seed, .., at) they hold (each parameter drawn whole into a temporary, one at a time).
void init_stage_params(const ModelConfig& c, uint64_t seed, std::span<const StagePart> parts, std::span<exec::Array> into,
                       ShardIndex at = {});

// The parameters of `c` (with its fusions) from those of the same model unfused: qkv_proj = [query | key |
// value] along the head axis, wi = [wi_0, wi_1] along a new axis 2; the rest as they are.
std::vector<exec::Array> fuse_params(const ModelConfig& c, std::span<const exec::Array> unfused);

// (params..., inputs i32[B,T], targets i32[B,T]) -> (loss f32[]), plus logits f32[B,T,V] when asked.
enum class LossResults { loss, loss_and_logits };
ir::Graph loss_graph(const ModelConfig& c, int64_t batch, int64_t seq, LossResults results = LossResults::loss);

// Traces the loss into `b` from existing tensors (used inside larger step graphs).
ir::Tensor trace_loss(ir::Builder& b, const ModelConfig& c, std::span<const ir::Tensor> params, ir::Tensor inputs,
                      ir::Tensor targets, ir::Tensor* logits_out = nullptr);

// The stage's parameters, in param_specs order: the embedding (if), every layer parameter with its rows
// [first_layer, first_layer + num_layers) only, the final norm and the output kernel (if). A tied output
// projection (logits_via_embedding) on a stage without the embedding is refused.
std::vector<ParamSpec> stage_param_specs(const ModelConfig& c, const StagePart& part);

// Where each part of the model lies in a list of parameters in param_specs (or stage_param_specs) order.
struct ParamLayout {
  std::optional<size_t> embedding;    // the token embedding (the first stage's)
  size_t first_layer = 0, layers = 0;  // the stacked layer parameters: [first_layer, first_layer + layers)
  std::optional<size_t> norm, out;    // the final norm and the output kernel (the last stage's; `out` is the
                                      // embedding when logits_via_embedding ties them)
  // The layer parameters of `params`.
  template <class T>
  std::span<const T> layers_of(std::span<const T> params) const { return params.subspan(first_layer, layers); }
};
ParamLayout param_layout(const ModelConfig& c, const StagePart& part);
ParamLayout param_layout(const ModelConfig& c);  // the whole model's (param_specs)

// The activation one pipeline stage hands the next for B sequences of T tokens: [B,T,D] in the compute dtype,
// or under sequence parallelism the rank's [B,T/t,D] slice.
ir::Type stage_activation(const ModelConfig& c, int64_t batch, int64_t seq);

// The policy of the stage's layers: its entry of stage_remat_policies (the stage's index is first_layer /
// num_layers: stages are of equal size), else remat_policy.
const rematerialize::Policy& stage_remat_policy(const ModelConfig& c, const StagePart& part);

// Traces the stage: from inputs i32[B,T] (with the embedding) or the activation [B,T,D] the previous stage
// sent, to the activation the next stage takes, or (with the head) the mean loss given targets, else the logits.
ir::Tensor trace_stage(ir::Builder& b, const ModelConfig& c, const StagePart& part, std::span<const ir::Tensor> params,
                       ir::Tensor in, std::optional<ir::Tensor> targets);

// (params..., inputs i32[B,T]) -> logits f32[B,T,V], for sampling.
ir::Graph logits_graph(const ModelConfig& c, int64_t batch, int64_t seq);

// Generation with a KV cache (decode.cpp), on one device (no fsdp, tensor or pipeline split), the layers under
// a scan whatever scan_layers says and the attention as dot products (never flash): the same arithmetic as
// logits_graph's at each position. The caches are `cache/key` and `cache/value` [L,B,S,KV,Dh] in the compute
// dtype, S = `max_length` positions, each layer's keys after RoPE.
// Prefill: (params..., inputs i32[B,P]) -> (logits f32[B,V] of the last position, cache/key, cache/value),
// the caches holding positions 0..P-1 and zeros after.
ir::Graph prefill_graph(const ModelConfig& c, int64_t batch, int64_t prompt, int64_t max_length);
// Decode: (params..., inputs i32[B,1], position i32[], cache/key, cache/value) -> (logits f32[B,V],
// new_cache/key, new_cache/value): the token at `position` (< max_length) attends over positions 0..position
// of the caches, its own keys and values written at `position` in the new caches.
ir::Graph decode_graph(const ModelConfig& c, int64_t batch, int64_t max_length);

}  // namespace remat::nn
