// The decoder: scanned and unrolled layers compute bit-identical losses and gradients; every checkpoint
// name appears once per layer.
#include "autodiff/autodiff.h"
#include "nn/nn.h"
#include "remat/remat.h"
#include "support/models.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace remat {
namespace {

nn::ModelConfig small(bool scan) { return testing_support::small_model(3, scan, "full"); }

std::vector<exec::Array> batch(int64_t b, int64_t t, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> tok(0, 255);
  std::vector<int32_t> in(static_cast<size_t>(b * t)), tg(in.size());
  for (auto& x : in) x = tok(rng);
  for (auto& x : tg) x = tok(rng);
  return {exec::Array::from<int32_t>({b, t}, in), exec::Array::from<int32_t>({b, t}, tg)};
}

std::vector<exec::Array> loss_and_grads(const nn::ModelConfig& c) {
  ir::Graph f = nn::loss_graph(c, 2, 16);
  std::vector<int> wrt;
  for (size_t i = 0; i < nn::param_specs(c).size(); ++i) wrt.push_back(static_cast<int>(i));
  rematerialize::Decider decider;
  ir::Graph g = autodiff::grad_graph(f, wrt, &decider, wrt);
  std::vector<exec::Array> args = nn::init_params(c, 1);
  for (auto& a : batch(2, 16, 5)) args.push_back(a);
  return exec::run(g, args);
}

TEST(Model, ScannedAndUnrolledLayersAreBitIdentical) {
  std::vector<exec::Array> scanned = loss_and_grads(small(true)), unrolled = loss_and_grads(small(false));
  ASSERT_EQ(scanned.size(), unrolled.size());
  EXPECT_NEAR(scanned[0].get(0), std::log(256.0), 0.05);  // near-uniform predictions at init
  for (size_t i = 0; i < scanned.size(); ++i) {
    ASSERT_EQ(scanned[i].type(), unrolled[i].type());
    EXPECT_EQ(std::memcmp(scanned[i].bytes(), unrolled[i].bytes(), static_cast<size_t>(scanned[i].type().bytes())), 0)
        << "result " << i << " differs";
  }
}

TEST(Model, ParameterCountMatchesShapes) {
  nn::ModelConfig c = small(true);
  // embedding V*D + per layer (2 norms D, q D*H*Dh, k,v D*KV*Dh each, o H*Dh*D, mlp 3*D*F) + final norm + logits D*V
  int64_t per_layer = 2 * 32 + 32 * 4 * 8 + 2 * 32 * 2 * 8 + 4 * 8 * 32 + 3 * 32 * 64;
  EXPECT_EQ(nn::param_count(c), 256 * 32 + 3 * per_layer + 32 + 32 * 256);
}

}  // namespace
}  // namespace remat
