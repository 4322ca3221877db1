// bf16 kernels: dot_general through oneDNN (bf16 operands, f32 accumulation, bf16 result) against the f64
// reference on the same bf16-rounded operands, and elementwise ops computing in f32 and storing bf16.
#include "exec/exec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace remat {
namespace {

using namespace ir;

TEST(Bf16, DotGeneralErrorIsBoundedByOneBf16Rounding) {
  // With exact products of bf16 inputs accumulated in f32, the only error that matters is the final
  // rounding of each output to bf16: |ours - exact| <= 2^-8 |exact| (half an ulp of an 8-bit mantissa)
  // plus the f32 accumulation error, K * 2^-24 * sum|a_k b_k|.
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto [m, k, n] : {std::tuple{64, 128, 96}, std::tuple{7, 300, 5}, std::tuple{256, 768, 64}}) {
    Graph g;
    Builder b(g);
    Tensor a = b.param("a", {DType::bf16, {m, k}});
    Tensor w = b.param("w", {DType::bf16, {k, n}});
    b.result(matmul(a, w));
    std::vector<exec::Array> args{exec::Array(g.type(g.params[0])), exec::Array(g.type(g.params[1]))};
    for (auto& x : args)
      for (int64_t i = 0; i < x.size(); ++i) x.set(i, dist(rng));
    exec::Array fast = exec::run(g, args)[0];
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        double exact = 0, magnitude = 0;
        for (int64_t q = 0; q < k; ++q) {
          double p = args[0].get(r * k + q) * args[1].get(q * n + c);
          exact += p;
          magnitude += std::abs(p);
        }
        double bound = std::ldexp(std::abs(exact), -8) + static_cast<double>(k) * std::ldexp(magnitude, -24) + 1e-30;
        ASSERT_LE(std::abs(fast.get(r * n + c) - exact), bound) << m << "x" << k << "x" << n << " at " << r << "," << c;
      }
    }
  }
}

TEST(Bf16, ElementwiseComputesInF32AndRoundsOnce) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::bf16, {1000}});
  b.result(exp(x) * x);
  exec::Array a(g.type(g.params[0]));
  for (int64_t i = 0; i < a.size(); ++i) a.set(i, -3.0 + 6.0 * static_cast<double>(i) / 1000.0);
  exec::Array y = exec::run(g, std::vector<exec::Array>{a})[0];
  for (int64_t i = 0; i < a.size(); ++i) {
    // exp rounds once to bf16, the product rounds once more: two roundings of at most 2^-9 relative each.
    double want = std::exp(a.get(i)) * a.get(i);
    EXPECT_LE(std::abs(y.get(i) - want), std::ldexp(std::abs(want), -7) + 1e-30) << i;
  }
}

}  // namespace
}  // namespace remat
