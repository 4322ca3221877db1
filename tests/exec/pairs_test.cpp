// bf16 pair products (exec/kernels/pairs.h) under every ISA this CPU runs (so each path it has: vdpbf16ps where it
// has AVX512_BF16, FMA, std::fma): bit for bit against a reference that takes each fused multiply-add in f64 (the
// product of two bf16 values and its sum with an f32 are exact there for the values used, so one rounding to f32 is
// the fused result: an independent route), over shapes with row, column and pair tails, overwriting and
// accumulating; bit for bit against baseline x86-64's path over every exponent, where products and sums underflow;
// and the flush rules themselves: a subnormal bf16 reads as zero, a subnormal result is zero.
#include "exec/kernels/pairs.h"

#include "exec/kernels/kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <iostream>
#include <random>
#include <vector>

namespace remat::exec {
namespace {

struct Case {
  int64_t rows, cols, K;
  bool accumulate;
  std::vector<uint32_t> a, b;
  std::vector<float> out;  // the initial sums
};

// bf16 values with exponents in [lo, hi] (biased), random signs and mantissas.
uint16_t random_bf16(std::mt19937& rng, int lo, int hi) {
  const uint32_t exponent = static_cast<uint32_t>(std::uniform_int_distribution<int>(lo, hi)(rng));
  return static_cast<uint16_t>((rng() & 1u) << 15 | exponent << 7 | (rng() & 0x7Fu));
}

Case random_case(std::mt19937& rng, int lo, int hi) {
  auto pick = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(rng); };
  Case c{pick(1, 14), pick(1, 70), pick(1, 40), (rng() & 1) != 0, {}, {}, {}};
  auto pair = [&] { return uint32_t{random_bf16(rng, lo, hi)} | uint32_t{random_bf16(rng, lo, hi)} << 16; };
  for (int64_t i = 0; i < c.rows * c.K; ++i) c.a.push_back(pair());
  for (int64_t i = 0; i < c.K * c.cols; ++i) c.b.push_back(pair());
  for (int64_t i = 0; i < c.rows * c.cols; ++i)
    c.out.push_back(std::bit_cast<float>(uint32_t{random_bf16(rng, lo, hi)} << 16 | static_cast<uint32_t>(rng() & 0xFFFFu)));
  return c;
}

std::vector<float> run(const Case& c) {
  std::vector<float> out = c.out, scratch(pair_scratch(c.rows, c.cols, c.K));
  pair_product({c.a.data(), c.K, c.b.data(), c.cols, out.data(), c.cols, c.K, c.accumulate}, c.rows, c.cols, scratch);
  return out;
}

// Each step sum = round_f32(sum + x·y) with the product (exact: 8-bit significands) and the sum in f64: 53 bits are
// more than 2·24 + 2, so rounding the f64 sum to f32 gives the correctly rounded sum (double rounding is innocuous),
// the fused result, where nothing underflows (exponents within ±20).
std::vector<float> reference(const Case& c) {
  auto fused = [](float sum, uint32_t x, uint32_t y) {
    return static_cast<float>(static_cast<double>(sum) + static_cast<double>(std::bit_cast<float>(x)) * std::bit_cast<float>(y));
  };
  std::vector<float> out(c.out.size());
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.cols; ++j) {
      float sum = c.accumulate ? c.out[i * c.cols + j] : 0.0f;
      for (int64_t k = 0; k < c.K; ++k) {
        const uint32_t x = c.a[i * c.K + k], y = c.b[k * c.cols + j];
        sum = fused(sum, x & 0xFFFF0000u, y & 0xFFFF0000u);  // the high halves first
        sum = fused(sum, x << 16, y << 16);
      }
      out[i * c.cols + j] = sum;
    }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

TEST(PairProduct, EveryPathGivesTheFusedMultiplyAddsInOrder) {
  for (Isa isa : available_isas()) {
    IsaOverride guard(isa);
    std::mt19937 rng(11);
    for (int n = 0; n < 300; ++n) {
      const Case c = random_case(rng, 127 - 20, 127 + 20);
      ASSERT_TRUE(same_bits(run(c), reference(c)))
          << "path " << pair_product_path() << ", case " << n << ": " << c.rows << " x " << c.cols << ", " << c.K << " pairs";
    }
    std::cout << isa_name(isa) << ": " << pair_product_path() << "\n";
  }
}

TEST(PairProduct, EveryPathGivesBaselinesBitsOverEveryExponent) {
  std::mt19937 rng(12);
  for (int n = 0; n < 300; ++n) {
    const Case c = random_case(rng, 0, 254);
    std::vector<float> want;
    {
      IsaOverride baseline(Isa::baseline);
      want = run(c);
    }
    for (Isa isa : available_isas()) {
      IsaOverride guard(isa);
      EXPECT_TRUE(same_bits(run(c), want)) << "path " << pair_product_path() << ", case " << n;
    }
  }
}

TEST(PairProduct, SubnormalInputsReadAsZeroAndSubnormalResultsAreZero) {
  const uint32_t two_to_the_minus_70 = std::bit_cast<uint32_t>(0x1p-70f), two_to_the_100 = std::bit_cast<uint32_t>(0x1p100f);
  const uint32_t subnormal = 0x0001u;  // a bf16 subnormal (2^-133) as a pair's low half
  for (Isa isa : available_isas()) {
    IsaOverride guard(isa);
    const uint32_t a[2] = {two_to_the_minus_70, subnormal}, b[2] = {two_to_the_minus_70, two_to_the_100 >> 16};
    float out[2] = {0.0f, 0.0f}, scratch[pair_scratch(1, 1, 1)];
    // First: 2^-70 · 2^-70 = 2^-140 (high halves), a subnormal result. Second: 2^-133 · 2^100 (low halves), 2^-33
    // unless the subnormal reads as zero.
    pair_product({a, 1, b, 1, out, 1, 1, false}, 1, 1, scratch);
    EXPECT_EQ(std::bit_cast<uint32_t>(out[0]), 0u) << pair_product_path();
    pair_product({a + 1, 1, b + 1, 1, out + 1, 1, 1, true}, 1, 1, scratch);
    EXPECT_EQ(std::bit_cast<uint32_t>(out[1]), 0u) << pair_product_path();
  }
}

}  // namespace
}  // namespace remat::exec
