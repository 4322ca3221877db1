// Flash attention's CPU kernels (attention.cpp; bf16 operands: attention_bf16.cpp): what both share.
#pragma once

#include "exec/kernels/kernels.h"
#include "exec/kernels/rows.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace remat::exec::flash {

constexpr int64_t kBlock = 64;   // keys per block
constexpr int64_t kRows = 48;    // queries per block
constexpr int64_t kMaxDh = 256;  // head dims a tile row holds

// The sizes of one call (q [B,T,H,D], k and v [B,S,KV,D]), its mask and scale.
struct Problem {
  int64_t B, T, H, S, KV, D;
  bool causal;
  double scale;
};

inline Problem problem_of(const ir::Node& n, std::span<const Array> in) {
  const ir::Shape &q = in[0].type().shape, &k = in[1].type().shape;
  CHECK(q[3] <= kMaxDh, "{}: head_dim {} is more than the {} the CPU kernel supports", ir::op_name(n.op), q[3], kMaxDh);
  return {q[0], q[1], q[2], k[1], k[2], q[3], n.attrs.boolean("causal"), n.attrs.real("scale")};
}

inline int64_t padded_keys(int64_t S) { return (S + kBlock - 1) / kBlock * kBlock; }

// The calling thread's tiles (of type Tiles) in a node's workspace of `bytes_per_thread` per thread.
template <class Tiles>
Tiles& tiles_of(std::span<std::byte> workspace, int64_t bytes_per_thread) {
  const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
  return *reinterpret_cast<Tiles*>(workspace.data() + thread * bytes_per_thread);
}

// to[d·ld + j] = x(j, d) for j, d in [0, 8), x(j, d) at x[j·lx + d]: an 8 x 8 block transposed in registers
// (pairs of rows interleaved, then pairs of pairs, then halves: the shuffles every vector width has).
template <class A, class T>
void transpose8(const T* x, int64_t lx, A* to, int64_t ld) {
  typedef A V __attribute__((vector_size(8 * sizeof(A))));
  V r[8], t[8], u[8];
  for (int j = 0; j < 8; ++j)
    for (int d = 0; d < 8; ++d) r[j][d] = static_cast<A>(load(x[j * lx + d]));
  for (int j = 0; j < 8; j += 2) {
    t[j] = __builtin_shufflevector(r[j], r[j + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[j + 1] = __builtin_shufflevector(r[j], r[j + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int j = 0; j < 8; j += 4)
    for (int h = 0; h < 2; ++h) {  // u[j + c]: columns c and c + 4 of rows j..j+3
      u[j + 2 * h] = __builtin_shufflevector(t[j + h], t[j + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[j + 2 * h + 1] = __builtin_shufflevector(t[j + h], t[j + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int d = 0; d < 4; ++d) {
    const V low = __builtin_shufflevector(u[d], u[d + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const V high = __builtin_shufflevector(u[d], u[d + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    std::memcpy(to + d * ld, &low, sizeof(V));
    std::memcpy(to + (d + 4) * ld, &high, sizeof(V));
  }
}

// to[d·ld + j] = x(j, d) for the S x D matrix x (its rows lx apart): 8 x 8 blocks, then the edges element-wise.
template <class A, class T>
void transpose(const T* x, int64_t lx, A* to, int64_t ld, int64_t S, int64_t D) {
  auto one = [&](int64_t j, int64_t d) { to[d * ld + j] = static_cast<A>(load(x[j * lx + d])); };
  int64_t j = 0;
  for (; j + 8 <= S; j += 8) {
    prefetch_rows(x, lx, j + 8, std::min(j + 16, S), D);
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) transpose8(x + j * lx + d, lx, to + d * ld + j, ld);
    for (; d < D; ++d)
      for (int64_t i = j; i < j + 8; ++i) one(i, d);
  }
  for (; j < S; ++j)
    for (int64_t d = 0; d < D; ++d) one(j, d);
}

// Folds one block's scores `s` (rows of cols) into the tile's online softmax: each query's running maximum m, sum
// l and context row acc (D) rescaled to the new maximum; s becomes the block's probabilities exp(s - m). Phase by
// phase over the rows, so that the rows' dependency chains (maximum, correction, sums) overlap and the
// corrections' exps run as one vector: each row's operations, and so its bits, are those of a row on its own.
template <class A>
void online_softmax(A (*s)[kBlock], int64_t rows, int64_t cols, A* m, A* l, A (*acc)[kMaxDh], int64_t D) {
  A m_new[kRows], correction[kRows];
  for (int64_t r = 0; r < rows; ++r) m_new[r] = std::max(m[r], row_max<A>(s[r], cols));
#pragma omp simd
  for (int64_t r = 0; r < rows; ++r) correction[r] = exp_nonpositive_of(m[r] - m_new[r]);  // 0 at the first block
  for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[r][d] *= correction[r];
    l[r] = l[r] * correction[r] + row_exps(s[r], cols, m_new[r], s[r]);
    m[r] = m_new[r];
  }
}

// The kernels for bf16 operands (attention_bf16.cpp): their products in bf16 pairs (pairs.h).
int64_t workspace_bf16(const ir::Node& n, std::span<const ir::Type> in);
void attention_bf16(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx);
void attention_grad_bf16(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx);

}  // namespace remat::exec::flash
