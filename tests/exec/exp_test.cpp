// The kernels' f32 exp (exec/kernels/exp.h) against exp in f64 rounded to f32 (the correctly rounded result but
// for double rounding, an independent route): within 1 ulp over every 61st float from -110 to 90, subnormal results
// included, and exact at the special values the model relies on (exp(-inf) = 0 for masked scores, exp(0) = 1).
#include "exec/kernels/exp.h"

#include "exec/exec.h"
#include "ir/ir.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace remat::exec {
namespace {

// Distance in units in the last place between two finite floats of the same sign (0 and subnormals included).
int64_t ulps(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) - static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

TEST(Exp, WithinOneUlpOfTheRoundedExactResultEverywhere) {
  int64_t worst = 0, checked = 0;
  float worst_at = 0;
  auto check = [&](float x) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float got = exp_f32(x);
    const int64_t d = std::isinf(want) ? (std::isinf(got) ? 0 : 1000) : ulps(got, want);
    if (d > worst) worst = d, worst_at = x;
    ++checked;
  };
  // Negative floats from -0 down to -110, positive ones up to 90, as bit patterns in steps of 61.
  for (uint32_t bits = 0x80000000u; std::bit_cast<float>(bits) >= -110.0f; bits += 61) check(std::bit_cast<float>(bits));
  for (uint32_t bits = 0; std::bit_cast<float>(bits) <= 90.0f; bits += 61) check(std::bit_cast<float>(bits));
  EXPECT_LE(worst, 1) << "at x = " << worst_at << " (" << checked << " inputs)";
  EXPECT_GT(checked, 30'000'000);
}

TEST(Exp, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_f32(-inf), 0.0f);
  EXPECT_EQ(exp_f32(inf), inf);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-104.0f), 0.0f);            // below half the smallest subnormal
  EXPECT_EQ(exp_f32(89.0f), inf);                // above the largest float
  EXPECT_GT(exp_f32(-100.0f), 0.0f);             // a subnormal, not flushed
  EXPECT_LT(exp_f32(-100.0f), std::numeric_limits<float>::min());
  EXPECT_TRUE(std::isfinite(exp_f32(88.7f)));  // near overflow, finite
}

// Softmax's exp of x <= 0 (exp_nonpositive) against exp_f32: the same bits wherever exp_f32's result is at least
// 2^-126 (within 1 ulp of the f64 route, by the test above), below it exp_f32's subnormal or 0 (0 from about
// x < -87.7), over every 61st float from -0 down to -120; and at the special values.
TEST(Exp, NonpositiveVariantGivesTheSameBitsDownToTheSubnormals) {
  int64_t differ = 0, flushed = 0, checked = 0;
  for (uint32_t bits = 0x80000000u; std::bit_cast<float>(bits) >= -120.0f; bits += 61, ++checked) {
    const float x = std::bit_cast<float>(bits), want = exp_f32(x), got = exp_nonpositive(x);
    const bool same = std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want);
    if (want >= std::numeric_limits<float>::min()) differ += !same;
    else if (got == 0.0f) ++flushed;
    else differ += !same;  // a subnormal it keeps (k = -126) is exp_f32's
  }
  EXPECT_EQ(differ, 0);
  EXPECT_GT(flushed, 0);
  EXPECT_GT(checked, 15'000'000);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_nonpositive(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-87.0f), exp_f32(-87.0f));  // normal: 1.65e-38
  EXPECT_EQ(exp_nonpositive(-88.0f), 0.0f);
}

// Flash attention's bf16 probabilities (exp2_nonpositive, 2^x for x <= 0) against exp2 in f64: within 2e-7 of it
// (its polynomial's bound, 1.9e-7) over every 61st float from -0 down to -126 (normal results), +0 below -126.5
// (where 2^x is below 2^-126.5), and exact at 2^0 = 1 and 2^-inf = 0. A vector of 16 gives each lane the scalar's
// bits (the forward computes vectors, the backward's loop scalars, and both must agree).
TEST(Exp, Base2ProbabilitiesAreWithinTheirBoundAndVectorsGiveTheScalarsBits) {
  double worst = 0;
  float worst_at = 0;
  int64_t checked = 0, lanes_differ = 0;
  Floats16 lanes{};
  int lane = 0;
  for (uint32_t bits = 0x80000000u; std::bit_cast<float>(bits) >= -126.0f; bits += 61, ++checked) {
    const float x = std::bit_cast<float>(bits), got = exp2_nonpositive(x);
    const double exact = std::exp2(static_cast<double>(x)), gap = std::abs(got - exact) / exact;
    if (gap > worst) worst = gap, worst_at = x;
    lanes[lane++] = x;
    if (lane == 16) {
      const Floats16 vector = exp2_nonpositive(lanes);
      for (int i = 0; i < 16; ++i)
        lanes_differ += std::bit_cast<uint32_t>(vector[i]) != std::bit_cast<uint32_t>(exp2_nonpositive(lanes[i]));
      lane = 0;
    }
  }
  EXPECT_LE(worst, 2e-7) << "at x = " << worst_at;
  EXPECT_EQ(lanes_differ, 0);
  EXPECT_GT(checked, 15'000'000);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp2_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp2_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(exp2_nonpositive(-1.0f), 0.5f);
  EXPECT_EQ(exp2_nonpositive(-126.0f), std::numeric_limits<float>::min());
  EXPECT_EQ(exp2_nonpositive(-126.6f), 0.0f);
  EXPECT_EQ(exp2_nonpositive(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(exp2_nonpositive(std::numeric_limits<float>::quiet_NaN())));
}

// The elementwise kernels run the widest clone the CPU has (AVX-512, AVX2 or baseline: elementwise.cpp); this test's
// loops are compiled for baseline x86-64. Without FMA contraction or reassociation every clone gives the same bits:
// exp, logistic (a NaN operand returned as it is), sqrt, a division and the f32 -> bf16 and f32 -> f16 -> f32 roundings (the AVX-512 clone converts f16
// with vcvtps2ph, the baseline in software) over 1M floats, special values among them (NaNs with payloads, a
// signalling NaN, ±inf, ±0, a subnormal, f16's overflow boundary; zero and negative divisors and roots).
TEST(Exp, EveryKernelCloneGivesTheBaselineBits) {
  constexpr int64_t n = 1 << 20;
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("x", {DType::f32, {n}}), y = b.param("y", {DType::f32, {n}});
  b.result(ir::exp(x));
  b.result(ir::logistic(x));
  b.result(ir::sqrt(y));
  b.result(x / y);
  b.result(ir::convert(x, DType::bf16));
  b.result(ir::convert(ir::convert(x, DType::f16), DType::f32));
  std::vector<Array> args{Array({DType::f32, {n}}), Array({DType::f32, {n}})};
  const uint32_t special[] = {0x7FC00000u, 0xFFC12345u, 0x7F800001u, 0x7F800000u, 0xFF800000u, 0x00000000u,
                              0x80000000u, 0x00000123u, 0x477FF000u, 0x477FEFFFu, 0xC77FF000u, 0x387FC000u};
  constexpr int64_t kSpecial = std::size(special);
  for (int64_t i = 0; i < n; ++i) {
    // alternately from -104 and from 90 towards zero (down to |x| ~ 0.02), in steps of 193 ulps; every 4096th
    // element from the special values
    uint32_t bits = (i & 1 ? 0x42B40000u : 0xC2D00000u) - 193u * static_cast<uint32_t>(i / 2);
    if (i % 4096 < kSpecial) bits = special[i % 4096];
    args[0].data<float>()[i] = std::bit_cast<float>(bits);
    args[1].data<float>()[i] = i % 4096 < kSpecial ? std::bit_cast<float>(special[(i / 4096 + i) % kSpecial]) * -1.0f
                                                   : 1e-3f + static_cast<float>(i) * 0.37f;
  }
  const std::vector<Array> out = run(g, args);
  int64_t differ[6] = {};
  for (int64_t i = 0; i < n; ++i) {
    const float a = args[0].data<float>()[i], c = args[1].data<float>()[i];
    const float want[4] = {exp_f32(a), a != a ? a : 1.0f / (1.0f + exp_f32(-a)), std::sqrt(c), a / c};
    for (int k = 0; k < 4; ++k) differ[k] += std::bit_cast<uint32_t>(out[static_cast<size_t>(k)].data<float>()[i]) != std::bit_cast<uint32_t>(want[k]);
    differ[4] += out[4].data<bf16_t>()[i].bits != float_to_bf16(a).bits;
    differ[5] += std::bit_cast<uint32_t>(out[5].data<float>()[i]) != std::bit_cast<uint32_t>(f16_to_float(float_to_f16(a)));
  }
  for (int k = 0; k < 6; ++k) EXPECT_EQ(differ[k], 0) << "result " << k;
}

}  // namespace
}  // namespace remat::exec
