// exec::matmul_floor: what it counts, checked by hand. Its seconds are a measurement (never asserted); its FLOPs
// and the shapes it times alone follow from the profiled calls.
#include "exec/executable.h"

#include <gtest/gtest.h>

#include <cmath>

namespace remat {
namespace {

using namespace ir;

TEST(MatmulFloor, CountsEachMatmulAndAttentionCallAndTimesEachShapeOnce) {
  // Two matmuls of one shape, one of another, an elementwise op between them, and causal flash attention.
  const int64_t b = 1, t = 64, h = 2, d = 16;
  Graph g;
  Builder bl(g);
  Tensor x = bl.param("x", {DType::f32, {32, 48}}), w = bl.param("w", {DType::f32, {48, 40}});
  Tensor v = bl.param("v", {DType::f32, {40, 24}});
  Tensor q = bl.param("q", {DType::f32, {b, t, h, d}});
  Tensor y = matmul(x, w), z = matmul(exp(x), w), u = matmul(y + z, v);
  auto [context, lse] = attention(q, q, q, /*causal=*/true, 0.25);
  bl.result(u);
  bl.result(context);
  std::vector<exec::Array> args;
  for (ValueId p : g.params) {
    args.emplace_back(g.type(p));
    for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, std::cos(0.1 * static_cast<double>(i)));
  }
  exec::Profile profile;
  profile.record = true;
  exec::Executable e(g.clone(), plan::build(g, {.workspace = exec::workspace_of(exec::cpu())}), {.profile = &profile});
  e.run(args);
  const exec::MatmulFloor f = exec::matmul_floor(profile);
  // 2·M·N·K per matmul; attention visits the causal (query, key) pairs, 2·d multiply-adds each for the scores
  // and as many for the context, per head.
  const double pairs = static_cast<double>(t * (t + 1) / 2);
  const double want = 2 * (2.0 * 32 * 40 * 48) + 2.0 * 32 * 24 * 40 + 4.0 * b * h * d * pairs;
  EXPECT_DOUBLE_EQ(f.flops, want);
  EXPECT_EQ(f.shapes, 3) << "[32,48]x[48,40] once for its two calls, [32,40]x[40,24], attention's rate";
  EXPECT_GT(f.seconds, 0);
}

}  // namespace
}  // namespace remat
