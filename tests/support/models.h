// Small decoder configs shared by the tests.
#pragma once

#include "nn/nn.h"

namespace remat::testing_support {

// A decoder of the given sizes (vocab 256), scanned or unrolled, under one remat policy.
inline nn::ModelConfig model(int64_t layers, bool scan, const std::string& policy, int64_t d, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, int64_t mlp) {
  nn::ModelConfig c;
  c.emb_dim = d;
  c.num_decoder_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.mlp_dim = mlp;
  c.scan_layers = scan;
  c.remat_policy = nn::parse_remat_policy(policy, c);  // spelled for the default layer: re-parse after changing its names
  return c;
}

// D=16, H=2, KV=1 (grouped-query), Dh=8, F=32: small enough to read as IR text.
inline nn::ModelConfig micro_model(int64_t layers, bool scan, const std::string& policy) {
  return model(layers, scan, policy, 16, 2, 1, 8, 32);
}

// D=32, H=4, KV=2, Dh=8, F=64: the numerics tests' model.
inline nn::ModelConfig small_model(int64_t layers, bool scan, const std::string& policy) {
  return model(layers, scan, policy, 32, 4, 2, 8, 64);
}

}  // namespace remat::testing_support
