// exp for the elementwise kernels: f32 without a call into libm, so a loop over it vectorises (exp and logistic
// were scalar expf calls, ~7% of a bf16 step). Within 1 ulp of the correctly rounded result (every float of
// [-110, 90] checked once: 0.8% of them 1 ulp off; tests/exec/exp_test.cpp samples every 61st), subnormal results
// included; exp(-inf) = 0, exp(inf) = inf, NaN stays NaN.
// f64 keeps std::exp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace remat::exec {

// 2^k as a float, for -126 <= k <= 127.
inline float pow2(int32_t k) { return std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23); }

// exp(x) = 2^n exp(r) with n = round(x / ln 2) and r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 in two parts: n times
// the first is exact, so r is within half an ulp); exp(r) by a degree-6 polynomial 1 + r + r²(...), fitted by
// Remez exchange to the relative error (5.6e-9 with its coefficients in f32; the degree-7 Taylor polynomial it
// replaced: 6e-9, two operations more); 2^n applied in two halves, each a normal float, so a subnormal result is
// rounded once. n is read from the bits of its rounding sum (1.5 * 2^23 + n), not converted from a float: a NaN
// goes through the clamps (max and min keep it) and the arithmetic to the result without a test of its own.
inline float exp_f32(float x) {
  // Inputs beyond [-104, 89] give 0 or inf either way.
  const float c = std::min(std::max(x, -104.0f), 89.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer, kept in the low bits
  const float shifted = c * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const float r = (c - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.389340730e-03f;
  p = p * r + 8.370299824e-03f;
  p = p * r + 4.166709259e-02f;
  p = p * r + 1.666650623e-01f;
  p = p * r + 4.999999702e-01f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t k = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound), half = k >> 1;
  return p * pow2(half) * pow2(k - half);
}

inline float exp_of(float x) { return exp_f32(x); }
inline double exp_of(double x) { return std::exp(x); }

}  // namespace remat::exec
