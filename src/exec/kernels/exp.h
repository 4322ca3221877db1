// exp for the elementwise kernels: f32 without a call into libm, so a loop over it vectorises (exp and logistic
// were scalar expf calls, ~7% of a bf16 step). Within 1 ulp of the correctly rounded result (every float of
// [-110, 90] checked once: 0.8% of them 1 ulp off; tests/exec/exp_test.cpp samples every 61st), subnormal results
// included; exp(-inf) = 0, exp(inf) = inf, NaN stays NaN. Softmax's exps (of x <= 0) take a shorter variant that
// flushes results below 2^-126 to 0. f64 keeps std::exp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace remat::exec {

// Sixteen floats as one GCC vector, for kernels that keep rows in registers (one zmm, two ymm or four xmm: each
// lane the same IEEE operations as the scalar code, so the bits do not depend on the target). Functions take them by
// reference; those that return them are inlined into the cloned kernels (flatten), so no call returns one between
// targets: GCC's warning that such returns change the calling convention (-Wpsabi) does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float Floats16 __attribute__((vector_size(64)));
typedef int32_t Ints16 __attribute__((vector_size(64)));
typedef uint32_t Bits16 __attribute__((vector_size(64)));

// std::max(a, b), also for vectors: a NaN in b is dropped, a NaN in a kept.
template <class F>
F max_of(const F& a, const F& b) {
  return a < b ? b : a;
}

// 2^k as a float, for -126 <= k <= 127; +0 for k = -127. K: int32_t, or Ints16 for Floats16.
inline float pow2(int32_t k) { return std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23); }
inline Floats16 pow2(const Ints16& k) { return std::bit_cast<Floats16>(std::bit_cast<Bits16>(k + 127) << 23); }

// exp(c) = 2^k p for c in [-104, 89]: k = round(c / ln 2) and p = exp(r), r = c - k ln 2 in [-ln2/2, ln2/2] (ln 2 in
// two parts: k times the first is exact, so r is within half an ulp); p by a degree-6 polynomial 1 + r + r²(...),
// fitted by Remez exchange to the relative error (5.6e-9 with its coefficients in f32; the degree-7 Taylor polynomial
// it replaced: 6e-9, two operations more). k is read from the bits of its rounding sum (1.5 * 2^23 + k), not
// converted from a float: a NaN goes through the arithmetic to the result without a test of its own.
// F: float, or Floats16 (each lane the scalar's operations); IntsOf<F>: its integer lanes.
template <class F>
using IntsOf = std::conditional_t<std::is_same_v<F, float>, int32_t, Ints16>;
template <class F>
struct ExpParts {
  F p;
  IntsOf<F> k;
};
inline constexpr float kExpRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer, kept in the low bits
inline constexpr float kExpLog2e = 1.44269504088896341f;
inline constexpr float kExpLn2High = 0.693145751953125f, kExpLn2Low = 1.42860682030941723e-6f;
inline constexpr float kExpPoly[7] = {1.389340730e-03f, 8.370299824e-03f, 4.166709259e-02f, 1.666650623e-01f,
                                      4.999999702e-01f, 1.0f, 1.0f};  // highest degree first
inline constexpr float kExpLow = -104.0f, kExpHigh = 89.0f;  // exp_f32's clamps
template <class F>
ExpParts<F> exp_parts(const F& c) {
  const F shifted = c * kExpLog2e + kExpRound;
  const F n = shifted - kExpRound;
  const F r = (c - n * kExpLn2High) - n * kExpLn2Low;
  F p = F{} + kExpPoly[0];
  for (int i = 1; i < 7; ++i) p = p * r + kExpPoly[i];
  return {p, std::bit_cast<IntsOf<F>>(shifted) - std::bit_cast<int32_t>(kExpRound)};
}

// exp(x), with 2^k applied in two halves, each a normal float, so a subnormal result is rounded once. The clamps
// (max and min keep a NaN) bound k: inputs beyond [-104, 89] give 0 or inf either way.
inline float exp_f32(float x) {
  const auto [p, k] = exp_parts(std::min(std::max(x, kExpLow), kExpHigh));
  const int32_t half = k >> 1;
  return p * pow2(half) * pow2(k - half);
}

// exp(x) for x <= 0 (or NaN), where softmax needs it (a score less its row's maximum), with 2^k applied once: ~10
// of exp_f32's ~33 vector operations fewer. The same bits as exp_f32 wherever k >= -126 (a normal 2^k: each of
// exp_f32's two scalings is exact or rounds once, as this one); 0 from k = -127 on (x below about -87.7, where
// exp_f32 gives a subnormal < 2^-126), which the clamp at -88 keeps k at (exp(-inf) = 0). Such a probability is
// below half an ulp of its row's sum (>= 1), so a sum keeps its bits. The callers' x never exceeds 0; beyond 88,
// 2^k would overflow.
template <class F>
F exp_nonpositive(const F& x) {
  const auto [p, k] = exp_parts(max_of(x, F{} - 88.0f));
  return p * pow2(k);
}

// a·b + c rounded once, F float, double or a GCC vector of them (lane by lane): a fused multiply-add where the target
// has FMA (the x86-64-v4 and avx2 kernels), libm's fmaf or fma call elsewhere, with the same bits. Only where a
// kernel's bits are its own (flash attention's products and bf16 probabilities): the reference kernels and every
// other kernel keep separate roundings.
template <class F>
F fused_multiply_add(const F& a, const F& b, const F& c) {
  if constexpr (std::is_same_v<F, float>) {
    return __builtin_fmaf(a, b, c);
  } else if constexpr (std::is_same_v<F, double>) {
    return __builtin_fma(a, b, c);
  } else {
    constexpr int kLanes = sizeof(F) / sizeof(a[0]);
    F r;
#pragma omp simd
    for (int i = 0; i < kLanes; ++i) r[i] = fused_multiply_add(a[i], b[i], c[i]);
    return r;
  }
}

// 2^x for x <= 1/2 (or NaN), F float or Floats16: flash attention's bf16 probabilities, whose scores are in base 2
// (scaled by log2 e), so that no ln 2 reduction is needed: x = n + f, n = round(x) (from the bits of the rounding
// sum, as exp_parts) and f = x - n in [-1/2, 1/2] exactly; 2^f by a degree-5 polynomial fitted to the relative
// error, in fused multiply-adds, 2^n by the exponent bits. Within 1.9e-7 (~2 ulp) of 2^x: the probabilities are
// rounded to bf16 for their products. x below -126.5 gives +0 (the clamp at -127 makes 2^n +0), so no result is
// far below 2^-126; x a little above 0 (a score's rounding less its row's maximum) gives 2^x, n 0 or 1.
inline constexpr float kExp2Poly[6] = {1.3264702865853906e-03f, 9.671504609286785e-03f, 5.550733581185341e-02f,
                                       2.4022242426872253e-01f, 6.931470036506653e-01f, 1.0f};  // highest first
template <class F>
F exp2_nonpositive(const F& x) {
  const F c = max_of(x, F{} - 127.0f), shifted = c + kExpRound, n = shifted - kExpRound, f = c - n;
  F p = F{} + kExp2Poly[0];
  for (int i = 1; i < 6; ++i) p = fused_multiply_add(p, f, F{} + kExp2Poly[i]);
  return p * pow2(std::bit_cast<IntsOf<F>>(shifted) - std::bit_cast<int32_t>(kExpRound));
}

inline float exp_of(float x) { return exp_f32(x); }
inline double exp_of(double x) { return std::exp(x); }
inline float exp_nonpositive_of(float x) { return exp_nonpositive(x); }
inline double exp_nonpositive_of(double x) { return std::exp(x); }

}  // namespace remat::exec
