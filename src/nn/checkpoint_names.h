// The checkpoint names of a decoder layer: the one place that says which tensor carries which name, in
// the two namings remat speaks (`checkpoint_naming`):
//  - maxtext (the default): MaxText's names, so MaxText remat policies and name lists carry over unchanged.
//  - axlearn: AXLearn's `<Class>.<name>` names (axlearn/common/attention.py, `_remat_name`), so a policy
//    written for an AXLearn config (regexes over those names) selects the same tensors here.
// Every matmul of a layer that multiplies an activation by a weight carries one of these names.
//
//   role                  maxtext              axlearn                                    tensor
//   decoder_layer_input   decoder_layer_input  TransformerLayer.input                     x entering the layer [B,T,D]
//   query_proj            query_proj           GroupedQueryAttention.q_proj               h . Wq, after RoPE [B,T,H,Dh]
//   key_proj              key_proj             GroupedQueryAttention.k_proj               h . Wk, after RoPE [B,T,KV,Dh]
//   value_proj            value_proj           GroupedQueryAttention.v_proj               h . Wv [B,T,KV,Dh]
//   context               context              GroupedQueryAttention.context              probs . v, before Wo [B,T,H,Dh]
//   out_proj              out_proj             GroupedQueryAttention.o_proj               context . Wo [B,T,D]
//   attention_residual    (none)               TransformerAttentionLayer.residual_add     x + out_proj [B,T,D]
//   mlpwi_0               mlpwi_0              TransformerFeedForwardLayer.linear1_0      h . W_wi_0 (gate, before SiLU) [B,T,F]
//   mlpwi_1               mlpwi_1              TransformerFeedForwardLayer.linear1_1      h . W_wi_1 (up) [B,T,F]
//   mlpwo                 mlpwo                TransformerFeedForwardLayer.linear2        (silu(gate) * up) . W_wo [B,T,D]
//   mlp_residual          (none)               TransformerFeedForwardLayer.mlp_residual   x + mlpwo, the layer output [B,T,D]
//   qkv_proj              qkv_proj             -                                          fused_qkv: h . W_qkv, before the split
//                                                                                         and RoPE [B,T,H+2KV,Dh]
//   mlpwi                 mlpwi                -                                          fused_mlp: h . W_wi [B,T,2,F]
//
// MaxText's fusions (fused_qkv, fused_mlp) replace names: under fused_qkv the layer has qkv_proj instead of
// query_proj, key_proj and value_proj; under fused_mlp, mlpwi instead of mlpwi_0 and mlpwi_1. Their kernels:
//   decoder/layers/self_attention/qkv_proj/kernel  [L, D, H+2KV, Dh]  (q heads, then k, then v; MaxText's
//                                                   [D, 3, H, Dh] has the same layout when KV = H)
//   decoder/layers/mlp/wi/kernel                   [L, D, 2, F]       (MaxText's wi: gate, then up)
// They are MaxText's: AXLearn names fused projections after the split, so they need checkpoint_naming=maxtext.
//
// AXLearn's class for Llama-style attention is GroupedQueryAttention (it covers KV = H too). The two residual
// names are the ones seed 001's Neuron change adds to AXLearn's TransformerAttentionLayer and
// TransformerFeedForwardLayer; MaxText has no names there, so under maxtext the residual adds are unnamed.
// MaxText presets (full, minimal, ...) list MaxText names; under axlearn or a fusion they are translated by
// this table.
#pragma once

#include <array>
#include <string_view>

namespace remat::nn::names {

enum class Naming { maxtext, axlearn };

struct Name {
  std::string_view maxtext, axlearn;  // maxtext empty: the tensor has no MaxText name
};

inline constexpr Name kDecoderLayerInput{"decoder_layer_input", "TransformerLayer.input"};
inline constexpr Name kQueryProj{"query_proj", "GroupedQueryAttention.q_proj"};
inline constexpr Name kKeyProj{"key_proj", "GroupedQueryAttention.k_proj"};
inline constexpr Name kValueProj{"value_proj", "GroupedQueryAttention.v_proj"};
inline constexpr Name kContext{"context", "GroupedQueryAttention.context"};
inline constexpr Name kOutProj{"out_proj", "GroupedQueryAttention.o_proj"};
inline constexpr Name kAttentionResidual{"", "TransformerAttentionLayer.residual_add"};
inline constexpr Name kMlpWi0{"mlpwi_0", "TransformerFeedForwardLayer.linear1_0"};
inline constexpr Name kMlpWi1{"mlpwi_1", "TransformerFeedForwardLayer.linear1_1"};
inline constexpr Name kMlpWo{"mlpwo", "TransformerFeedForwardLayer.linear2"};
inline constexpr Name kMlpResidual{"", "TransformerFeedForwardLayer.mlp_residual"};

inline constexpr Name kQkvProj{"qkv_proj", ""};
inline constexpr Name kMlpWi{"mlpwi", ""};

inline constexpr std::array<Name, 13> kAll = {kDecoderLayerInput, kQueryProj, kKeyProj, kValueProj,   kContext,
                                              kOutProj,           kAttentionResidual, kMlpWi0, kMlpWi1, kMlpWo,
                                              kMlpResidual,       kQkvProj, kMlpWi};

// The names a layer carries: its naming and MaxText's fusions.
struct Vocabulary {
  Naming naming = Naming::maxtext;
  bool fused_qkv = false, fused_mlp = false;
  bool operator==(const Vocabulary&) const = default;
};

// The name under `naming`; empty when the tensor has none.
constexpr std::string_view spelled(const Name& n, Naming naming) { return naming == Naming::maxtext ? n.maxtext : n.axlearn; }

constexpr bool same(const Name& a, const Name& b) { return a.maxtext == b.maxtext && a.axlearn == b.axlearn; }

// The fused tensor that replaces `n` under its fusion (qkv_proj for q, k and v; mlpwi for mlpwi_0/1), if any.
constexpr const Name* fused_into(const Name& n) {
  if (same(n, kQueryProj) || same(n, kKeyProj) || same(n, kValueProj)) return &kQkvProj;
  if (same(n, kMlpWi0) || same(n, kMlpWi1)) return &kMlpWi;
  return nullptr;
}

// Whether the fusion that makes the fused tensor `fused` is on in `v`.
constexpr bool fused_on(const Name& fused, const Vocabulary& v) { return same(fused, kQkvProj) ? v.fused_qkv : v.fused_mlp; }

// Whether a layer with names `v` carries `n`: spelled in its naming, and not replaced by a fusion (or a
// fused name without its fusion).
constexpr bool carries(const Name& n, const Vocabulary& v) {
  if (spelled(n, v.naming).empty()) return false;
  if (const Name* f = fused_into(n)) return !fused_on(*f, v);
  if (same(n, kQkvProj) || same(n, kMlpWi)) return fused_on(n, v);
  return true;
}

// A MaxText name under `naming` (`custom` keys are written in MaxText names); a name not in the table is
// returned as it is.
constexpr std::string_view from_maxtext(std::string_view maxtext_name, Naming naming) {
  for (const Name& n : kAll)
    if (!n.maxtext.empty() && n.maxtext == maxtext_name) return spelled(n, naming);
  return maxtext_name;
}

// A name a MaxText preset lists, as the layer spells it: under a fusion the fused tensor's name (the
// preset then lists it once), under axlearn the AXLearn name.
constexpr std::string_view preset_name(std::string_view maxtext_name, const Vocabulary& v) {
  for (const Name& n : kAll)
    if (const Name* f = fused_into(n); f != nullptr && n.maxtext == maxtext_name && fused_on(*f, v)) return f->maxtext;
  return from_maxtext(maxtext_name, v.naming);
}

}  // namespace remat::nn::names
