// Products of bf16 matrices in pairs, for flash attention's bf16 tiles: out[i][c] (+)= Σ_p dot2(a(i, p), b[p][c])
// over pairs p < K, where a(i, p) and b[p][c] each hold two bf16 values in 32 bits (element 2p in the low half,
// 2p + 1 in the high half) and dot2 adds the high halves' product to the f32 sum, then the low halves', each as
// one fused multiply-add, with subnormal inputs read as zero and subnormal results flushed to zero. That is what
// AVX512_BF16's vdpbf16ps computes, and it runs the product where the CPU has it (and the cloned kernels run
// x86-64-v4); elsewhere the same fused multiply-adds run with FMA or std::fma under the flush-to-zero and
// denormals-are-zero modes. So the bits do not depend on the CPU (tests/exec/pairs_test.cpp).
#pragma once

#include "base/dtype.h"

#include <cstdint>
#include <span>

namespace remat::exec {

// Two bf16 values as one pair: `low` is the pair's even element.
inline uint32_t bf16_pair(bf16_t low, bf16_t high) { return uint32_t{low.bits} | uint32_t{high.bits} << 16; }

struct PairProduct {
  const uint32_t* a;  // a(i, p) at a[i·ai + p]
  int64_t ai;
  const uint32_t* b;  // b[p][c] at b[p·lb + c]
  int64_t lb;
  float* out;  // out[i][c] at out[i·lo + c]
  int64_t lo, K;
  bool accumulate;  // add to out, or overwrite it
};

// Rows [0, rows) and columns [0, cols) of the product. `scratch`: pair_scratch(rows, cols, K) floats, where the path
// without AVX512_BF16 splits the pairs into f32 halves.
void pair_product(const PairProduct& p, int64_t rows, int64_t cols, std::span<float> scratch);
constexpr int64_t pair_scratch(int64_t rows, int64_t cols, int64_t K) { return 2 * K * (rows + cols); }

// Which implementation pair_product runs under the current kernel_isa(): "avx512_bf16", "fma" or "scalar".
const char* pair_product_path();
// Whether that is "avx512_bf16": vdpbf16ps, under the x86-64-v4 kernels on a CPU with AVX512_BF16.
bool pair_product_native();

}  // namespace remat::exec
