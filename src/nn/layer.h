// Internal to nn/: the decoder layer's parts that model.cpp traces training with and decode.cpp traces
// generation with (one layer function for both). Not a public header: callers outside nn/ use model.h.
#pragma once

#include "nn/model.h"

#include <utility>
#include <vector>

namespace remat::nn::detail {

// One layer's weights. Under fused_qkv `qkv` [D, H+2KV, Dh] replaces query, key and value; under fused_mlp
// `wi` [D, 2, F] replaces wi0 and wi1 (the absent ones are null tensors).
struct LayerWeights {
  ir::Tensor attn_norm, query, key, value, qkv, out, mlp_norm, wi0, wi1, wi, wo;
};

// The layer's parameters in param_specs() order (after the embedding): each name, and where it goes.
struct LayerParam {
  const char* name;  // the parameter path's module (decoder/layers/<...>) and the remat region input's name
  ir::Tensor LayerWeights::*field;
};
std::vector<LayerParam> layer_params(const ModelConfig& c);

// Decoding (decode.cpp): one layer's key and value caches [B,S,KV,Dh] and the position (an i32 scalar) of the
// first of the T tokens the layer is computing. append() writes their keys and values [B,T,KV,Dh] there (RoPE
// already applied), keeps the updated caches in `key` and `value`, and returns them: attention then reads the
// whole cache, the mask hiding every position after each query's own.
struct KvCache {
  ir::Tensor key, value, position;
  std::pair<ir::Tensor, ir::Tensor> append(ir::Tensor new_key, ir::Tensor new_value);
};

// Tables shared by every layer: RoPE cos/sin [T, Dh/2] of the T query positions and the mask [T, S] of the keys
// each sees (training: S = T, causal); when decoding, `cache` (else null).
struct LayerConsts {
  ir::Tensor cos, sin, mask;
  KvCache* cache = nullptr;
};

// The tables for positions 0..seq-1 and the causal mask [seq, seq].
LayerConsts layer_consts(ir::Builder& b, const ModelConfig& c, int64_t seq);
// One decoder layer (attention and MLP blocks with their norms and residuals), no remat region around it.
ir::Tensor decoder_layer(ir::Builder& b, const ModelConfig& c, ir::Tensor x, const LayerWeights& weights,
                         const LayerConsts& k);
// A layer's weights from its parameters in param_specs order (after the embedding).
LayerWeights layer_weights(const ModelConfig& c, std::span<const ir::Tensor> w);
// The token embedding of inputs i32[B,T]: [B,T,D] in the compute dtype.
ir::Tensor embed(ir::Builder& b, const ModelConfig& c, ir::Tensor table, const ParamSpec& spec, ir::Tensor inputs);
// The final norm and the logits [B,T,V] in f32.
ir::Tensor head(ir::Builder& b, const ModelConfig& c, ir::Tensor x, ir::Tensor norm, const ParamSpec& norm_spec,
                ir::Tensor out, const ParamSpec& out_spec);
// Logits [..., V] as the matmul gives them (the compute dtype, f32 with logits_dot_in_fp32) from hidden states
// [..., D] and the output kernel [D,V] (the embedding [V,D] when tied); the loss reads them in f32.
ir::Tensor logits_of(const ModelConfig& c, ir::Tensor x, ir::Tensor out);
// The loss (loss.cpp): the mean cross-entropy of logits [B,T,V] against targets i32[B,T]; and the same over
// num_vocab_tiling chunks of the normed hidden states x [B,T,D] and the output kernel `out`, projected chunk by
// chunk. Under packing=false (padded_targets) the mean is over the targets >= 0.
ir::Tensor cross_entropy(ir::Builder& b, const ModelConfig& c, ir::Tensor logits, ir::Tensor targets);
ir::Tensor tiled_cross_entropy(ir::Builder& b, const ModelConfig& c, ir::Tensor x, ir::Tensor out, ir::Tensor targets);
// The model's parameters as graph params, in param_specs order.
std::vector<ir::Tensor> declare_params(ir::Builder& b, const ModelConfig& c);

}  // namespace remat::nn::detail
