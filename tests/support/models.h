// Small decoder configs shared by the tests.
#pragma once

#include "nn/nn.h"

namespace remat::testing_support {

// D=16, H=2, KV=1 (grouped-query), Dh=8, F=32: small enough to read as IR text.
inline nn::ModelConfig micro_model(int64_t layers, bool scan, const std::string& policy) {
  nn::ModelConfig c;
  c.emb_dim = 16;
  c.num_decoder_layers = layers;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.mlp_dim = 32;
  c.scan_layers = scan;
  c.remat_policy = policy;
  return c;
}

// D=32, H=4, KV=2, Dh=8, F=64: the numerics tests' model.
inline nn::ModelConfig small_model(int64_t layers, bool scan, const std::string& policy) {
  nn::ModelConfig c;
  c.emb_dim = 32;
  c.num_decoder_layers = layers;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.mlp_dim = 64;
  c.scan_layers = scan;
  c.remat_policy = policy;
  return c;
}

}  // namespace remat::testing_support
