// exp for the elementwise kernels: f32 without a call into libm, so a loop over it vectorises (exp and logistic
// were scalar expf calls, ~7% of a bf16 step). Within 2 ulp of the correctly rounded result (tests/exec/exp_test.cpp
// samples every 61st float of [-110, 90]), subnormal results included; exp(-inf) = 0, exp(inf) = inf, NaN stays NaN.
// f64 keeps std::exp.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace remat::exec {

// 2^k as a float, for -126 <= k <= 127.
inline float pow2(int32_t k) { return std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23); }

// exp(x) = 2^n exp(r) with n = round(x / ln 2) and r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 in two parts: n times
// the first is exact, so r is within half an ulp); exp(r) by its degree-7 Taylor polynomial (truncation < 6e-9 relative); 2^n applied in two
// halves, each a normal float, so a subnormal result is rounded once.
inline float exp_f32(float x) {
  // Inputs beyond [-104, 89] give 0 or inf either way; NaN goes through the arithmetic as 0, restored at the end.
  const float c = x != x ? 0.0f : (x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x));
  const float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest by 1.5 * 2^23
  const float r = (c - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t k = static_cast<int32_t>(n), half = k / 2;
  const float y = p * pow2(half) * pow2(k - half);
  return x != x ? x : y;
}

inline float exp_of(float x) { return exp_f32(x); }
inline double exp_of(double x) { return std::exp(x); }

}  // namespace remat::exec
