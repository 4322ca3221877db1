// FLOPs of a decoder layer's pieces (tests/support/models.h's layer, dot_product attention), derived from the
// model's and the batch's sizes in ir::flops' convention: 2 per multiply-add of a contraction, 1 per element of
// an elementwise op or of a reduction's input, 5 per softmax element, 3 per rope element, 4 per
// rms_norm element; layout ops (slice, broadcast, transpose,
// concatenate, convert) none. The tests that check recompute FLOPs sum the pieces a placement recomputes.
#pragma once

#include "nn/nn.h"
#include "train/step.h"

namespace remat::testing_support {

struct LayerFlops {
  double N, D, Q, K, F, S, Dh, L;  // tokens B·T, model width, H·Dh, KV·Dh, MLP width, scores B·H·T·T, head, layers

  LayerFlops(const nn::ModelConfig& m, const train::StepShape& shape) {
    const double B = static_cast<double>(shape.batch), T = static_cast<double>(shape.seq);
    N = B * T, D = static_cast<double>(m.emb_dim), Dh = static_cast<double>(m.head_dim);
    Q = static_cast<double>(m.num_heads) * Dh, K = static_cast<double>(m.num_kv_heads) * Dh;
    F = static_cast<double>(m.mlp_dim), S = B * static_cast<double>(m.num_heads) * T * T;
    L = static_cast<double>(m.num_decoder_layers);
  }
  double qkv_gemms() const { return 2 * N * D * Q + 2 * 2 * N * D * K; }  // h·Wq, h·Wk, h·Wv
  double scores_gemm() const { return 2 * S * Dh; }                       // q·kᵀ, contracting Dh
  double context_gemm() const { return 2 * S * Dh; }                      // probs·v: B·H·T·Dh outputs, T each
  double out_gemm() const { return 2 * N * Q * D; }                       // context·Wo
  double wi_gemm() const { return 2 * N * D * F; }                        // gate or up
  // RMSNorm, one op: x·x, its sum, ·r, ·scale per element.
  double norm() const { return 4 * N * D; }
  // RoPE of a [N, width] projection, one op: ·cos, ·sin, add per element.
  double rope(double width) const { return 3 * N * width; }
  double probs() const { return 7 * S; }  // the masked softmax, one op: ·scale, select (mask), softmax's 5
  double residual_add() const { return N * D; }
  double silu_times_up() const { return 3 * N * F; }                      // swiglu, one op: logistic, ·gate, ·up
};

}  // namespace remat::testing_support
