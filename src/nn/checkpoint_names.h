// The checkpoint names of a decoder layer: the one place that says which tensor carries which name.
// Spelled as in MaxText so that MaxText remat policies and name lists carry over unchanged.
// Every matmul of a layer that multiplies an activation by a weight carries one of these names.
#pragma once

#include <array>
#include <string_view>

namespace remat::nn::names {

inline constexpr std::string_view kDecoderLayerInput = "decoder_layer_input";  // x entering the layer [B,T,D]
inline constexpr std::string_view kQueryProj = "query_proj";  // h . Wq, after RoPE           [B,T,H,Dh]
inline constexpr std::string_view kKeyProj = "key_proj";      // h . Wk, after RoPE           [B,T,KV,Dh]
inline constexpr std::string_view kValueProj = "value_proj";  // h . Wv                       [B,T,KV,Dh]
inline constexpr std::string_view kContext = "context";       // attention output before Wo   [B,T,H,Dh]
inline constexpr std::string_view kOutProj = "out_proj";      // context . Wo                 [B,T,D]
inline constexpr std::string_view kMlpWi0 = "mlpwi_0";        // h . W_wi_0 (gate, before SiLU) [B,T,F]
inline constexpr std::string_view kMlpWi1 = "mlpwi_1";        // h . W_wi_1 (up)              [B,T,F]
inline constexpr std::string_view kMlpWo = "mlpwo";           // (silu(gate) * up) . W_wo     [B,T,D]

inline constexpr std::array<std::string_view, 9> kAll = {kDecoderLayerInput, kQueryProj, kKeyProj, kValueProj, kContext,
                                                         kOutProj,           kMlpWi0,    kMlpWi1,  kMlpWo};

}  // namespace remat::nn::names
