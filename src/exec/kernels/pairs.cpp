// bf16 pair products (pairs.h): vdpbf16ps where the CPU has AVX512_BF16, its fused multiply-adds with FMA or
// std::fma elsewhere. The vector paths are register-blocked: a block of R rows x C vectors of sums stays in registers
// while the K pairs stream through; a sum's pairs are added in order whatever the blocking, so every path gives the
// same bits.
#include "exec/kernels/pairs.h"

#include "exec/kernels/kernels.h"

#include <bit>
#include <cmath>
#include <span>

#if REMAT_HAS_ISA_CLONES
#include <immintrin.h>
#endif

namespace remat::exec {
namespace {

float high_half(uint32_t pair) { return std::bit_cast<float>(pair & 0xFFFF0000u); }
float low_half(uint32_t pair) { return std::bit_cast<float>(pair << 16); }

// One pair into a sum, as vdpbf16ps does it (under the flush modes, which pair_product sets for this path).
float dot2(uint32_t a, uint32_t b, float sum) {
  return std::fma(low_half(a), low_half(b), std::fma(high_half(a), high_half(b), sum));
}

__attribute__((noinline)) void scalar_columns(const PairProduct& p, int64_t rows, int64_t c0, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = c0; c < cols; ++c) {
      float sum = p.accumulate ? p.out[i * p.lo + c] : 0.0f;
      for (int64_t k = 0; k < p.K; ++k) sum = dot2(p.a[i * p.ai + k], p.b[k * p.lb + c], sum);
      p.out[i * p.lo + c] = sum;
    }
}

#if REMAT_HAS_ISA_CLONES
#define REMAT_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
#define REMAT_FMA_TARGET __attribute__((target("avx2,fma")))

// Rows [i, i + R), columns [c, c + 16·C) with the last vector's columns masked by `last`. The K pairs stream
// through pointers stepped once per pair (a's column, b's row), so the loop's address arithmetic is a few adds.
template <int64_t R, int64_t C>
REMAT_BF16_TARGET inline void block_bf16(const PairProduct& p, int64_t i, int64_t c, __mmask16 last) {
  __m512 sum[R][C];
  auto mask = [&](int64_t v) { return v == C - 1 ? last : __mmask16(0xFFFF); };
  float* out = p.out + i * p.lo + c;
  const int64_t lo = p.lo, ai = p.ai, lb = p.lb, K = p.K;
#pragma GCC unroll 8
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v)
      sum[r][v] = p.accumulate ? _mm512_maskz_loadu_ps(mask(v), out + r * lo + 16 * v) : _mm512_setzero_ps();
  const uint32_t* a = p.a + i * ai;  // row r's pair k at a[r·ai] once a has stepped k times
  const uint32_t* b = p.b + c;       // pair k's row at b once it has stepped k times
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; ++k, ++a, b += lb) {
    __m512i row[C];
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v) row[v] = _mm512_maskz_loadu_epi32(mask(v), b + 16 * v);
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; ++r) {
      const __m512i x = _mm512_set1_epi32(static_cast<int>(a[r * ai]));
#pragma GCC unroll 4
      for (int64_t v = 0; v < C; ++v) sum[r][v] = _mm512_dpbf16_ps(sum[r][v], (__m512bh)x, (__m512bh)row[v]);
    }
  }
#pragma GCC unroll 8
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v) _mm512_mask_storeu_ps(out + r * lo + 16 * v, mask(v), sum[r][v]);
}
// Rows [i, i + R): blocks of 64 columns, then the last 1-63 as one block of 1-4 vectors, its last one masked (a
// block of single vectors would hold R sums only, too few to hide vdpbf16ps's latency: flash attention's
// products end on a partial block of keys at every tile of the diagonal).
template <int64_t R>
REMAT_BF16_TARGET void rows_bf16(const PairProduct& p, int64_t i, int64_t cols) {
  int64_t c = 0;
  for (; c + 64 <= cols; c += 64) block_bf16<R, 4>(p, i, c, 0xFFFF);
  const int64_t rest = cols - c;
  const __mmask16 last = rest % 16 == 0 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (rest % 16)) - 1);
  switch ((rest + 15) / 16) {
    case 4: return block_bf16<R, 4>(p, i, c, last);
    case 3: return block_bf16<R, 3>(p, i, c, last);
    case 2: return block_bf16<R, 2>(p, i, c, last);
    case 1: return block_bf16<R, 1>(p, i, c, last);
    default: return;  // no columns left
  }
}
// Blocks of 6 rows: 24 sums of 4 vectors, 4 rows of b and a broadcast in 29 of the 32 registers.
REMAT_BF16_TARGET void product_bf16(const PairProduct& p, int64_t rows, int64_t cols) {
  int64_t i = 0;
  for (; i + 6 <= rows; i += 6) rows_bf16<6>(p, i, cols);
  for (; i + 4 <= rows; i += 4) rows_bf16<4>(p, i, cols);
  for (; i < rows; ++i) rows_bf16<1>(p, i, cols);
}

// The FMA path: a's and b's pairs split into their f32 halves in the scratch (a'(i, 2k) the high half of a(i, k),
// a'(i, 2k + 1) its low half; b' likewise by rows), then an f32 product over 2K terms, one FMA per term: the same
// operations in the same order, at f32's cost per term. Rows [i, i + R), columns [c, c + 8·C).
struct Split {
  const float *a, *b;  // a'(i, t) at a[i·2K + t], b'[t][c] at b[t·cols + c]
  int64_t terms, cols;
};
template <int64_t R, int64_t C>
REMAT_FMA_TARGET inline void block_fma(const Split& s, const PairProduct& p, int64_t i, int64_t c) {
  __m256 sum[R][C];
#pragma GCC unroll 8
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v)
      sum[r][v] = p.accumulate ? _mm256_loadu_ps(p.out + (i + r) * p.lo + c + 8 * v) : _mm256_setzero_ps();
  const float* a = s.a + i * s.terms;
#pragma GCC unroll 4
  for (int64_t t = 0; t < s.terms; ++t) {
    __m256 row[C];
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v) row[v] = _mm256_loadu_ps(s.b + t * s.cols + c + 8 * v);
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + r * s.terms + t);
#pragma GCC unroll 4
      for (int64_t v = 0; v < C; ++v) sum[r][v] = _mm256_fmadd_ps(x, row[v], sum[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v) _mm256_storeu_ps(p.out + (i + r) * p.lo + c + 8 * v, sum[r][v]);
}
template <int64_t R>
REMAT_FMA_TARGET void rows_fma(const Split& s, const PairProduct& p, int64_t i, int64_t cols) {
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) block_fma<R, 2>(s, p, i, c);
  for (; c + 8 <= cols; c += 8) block_fma<R, 1>(s, p, i, c);
  if (c < cols) scalar_columns(PairProduct{p.a + i * p.ai, p.ai, p.b, p.lb, p.out + i * p.lo, p.lo, p.K, p.accumulate}, R, c, cols);
}
REMAT_FMA_TARGET void product_fma(const PairProduct& p, int64_t rows, int64_t cols, std::span<float> scratch) {
  const int64_t terms = 2 * p.K;
  ASSERT(terms * (rows + cols) <= static_cast<int64_t>(scratch.size()));
  float *a = scratch.data(), *b = a + rows * terms;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < p.K; ++k) {
      a[i * terms + 2 * k] = high_half(p.a[i * p.ai + k]);
      a[i * terms + 2 * k + 1] = low_half(p.a[i * p.ai + k]);
    }
  for (int64_t k = 0; k < p.K; ++k)
    for (int64_t c = 0; c < cols; ++c) {
      b[2 * k * cols + c] = high_half(p.b[k * p.lb + c]);
      b[(2 * k + 1) * cols + c] = low_half(p.b[k * p.lb + c]);
    }
  const Split s{a, b, terms, cols};
  int64_t i = 0;
  for (; i + 6 <= rows; i += 6) rows_fma<6>(s, p, i, cols);
  for (; i < rows; ++i) rows_fma<1>(s, p, i, cols);
}
#endif

enum class Path { avx512_bf16, fma, scalar };

Path path() {
#if REMAT_HAS_ISA_CLONES
  static const bool bf16 = __builtin_cpu_supports("avx512bf16"), fma = __builtin_cpu_supports("fma");
  if (kernel_isa() == Isa::x86_64_v4 && bf16) return Path::avx512_bf16;
  if (kernel_isa() != Isa::baseline && fma) return Path::fma;
#endif
  return Path::scalar;
}

// Runs `emulate` with subnormal inputs read as zero and subnormal results flushed to zero (MXCSR's DAZ and FTZ),
// as vdpbf16ps computes; the modes are restored after. A call, so that no floating-point operation of the caller
// moves across the mode change.
template <class F>
__attribute__((noinline)) void flushing_subnormals(F&& emulate) {
#if REMAT_HAS_ISA_CLONES
  const unsigned before = _mm_getcsr();
  _mm_setcsr(before | 0x8040u);  // FTZ | DAZ
  emulate();
  _mm_setcsr(before);
#else
  emulate();  // elsewhere without the flush modes: a subnormal product or sum may keep its value
#endif
}

}  // namespace

void pair_product(const PairProduct& p, int64_t rows, int64_t cols, std::span<float> scratch) {
  switch (path()) {
#if REMAT_HAS_ISA_CLONES
    case Path::avx512_bf16: return product_bf16(p, rows, cols);
    case Path::fma: return flushing_subnormals([&] { product_fma(p, rows, cols, scratch); });
#else
    case Path::avx512_bf16:
    case Path::fma:
#endif
    case Path::scalar: return flushing_subnormals([&] { scalar_columns(p, rows, 0, cols); });
  }
}

bool pair_product_native() { return path() == Path::avx512_bf16; }

const char* pair_product_path() {
  switch (path()) {
    case Path::avx512_bf16: return "avx512_bf16";
    case Path::fma: return "fma";
    case Path::scalar: return "scalar";
  }
  return "";
}

}  // namespace remat::exec
