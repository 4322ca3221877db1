// Flash attention on the CPU (ir/ops.h): an online softmax over blocks of keys, forward, and the backward that
// recomputes each block's probabilities from the saved log-sum-exp. Arithmetic in A = f32 (f64 for f64
// operands, the log-sum-exp too); no score-sized array: each thread's tiles (a block of queries against a block
// of keys) and its kv head's keys and values, laid out once for every tile, live in the plan's workspace for the
// node. Each (batch, head)
// — backward: each (batch, kv head) with its group of query heads — is one thread's, in a fixed order, so the
// results do not depend on the thread count.
#include "exec/kernels/exp.h"
#include "exec/kernels/kernels.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace remat::exec {
namespace {

constexpr int64_t kBlock = 64;   // keys per block
constexpr int64_t kRows = 16;    // queries per block
constexpr int64_t kMaxDh = 256;  // head dims a tile row holds

// The sizes of one call (q [B,T,H,D], k and v [B,S,KV,D]), its mask and scale.
struct Problem {
  int64_t B, T, H, S, KV, D;
  bool causal;
  double scale;
};

Problem problem_of(const ir::Node& n, std::span<const Array> in) {
  const ir::Shape &q = in[0].type().shape, &k = in[1].type().shape;
  CHECK(q[3] <= kMaxDh, "{}: head_dim {} is more than the {} the CPU kernel supports", ir::op_name(n.op), q[3], kMaxDh);
  return {q[0], q[1], q[2], k[1], k[2], q[3], n.attrs.boolean("causal"), n.attrs.real("scale")};
}

// The arithmetic type: f64 for f64 operands, else f32.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class A, class T>
A dot(const T* x, const T* y, int64_t n) {
  A s = 0;
  for (int64_t d = 0; d < n; ++d) s += static_cast<A>(load(x[d])) * static_cast<A>(load(y[d]));
  return s;
}

// One thread's tiles: a block of queries against a block of keys, in A. Rows index queries, columns keys.
template <class A>
struct Tiles {
  A q[kRows][kMaxDh], dout[kRows][kMaxDh], acc[kRows][kMaxDh];  // acc: the context, or dq
  A s[kRows][kBlock], ds[kRows][kBlock];
  A m[kRows], l[kRows], delta[kRows];
};

// One kv head's keys and values in A, laid out for the products, filled once per (batch, kv head) and read by
// every query tile of every head of its group: transposed (kt, vt: D rows of `stride` keys, the keys past S zero)
// and as rows (kb, vb: S rows of D). The forward uses kt and vb.
template <class A>
struct Keys {
  A *kt, *vt, *kb, *vb;
  int64_t stride;  // S rounded up to whole blocks
};
int64_t padded_keys(int64_t S) { return (S + kBlock - 1) / kBlock * kBlock; }

// Rows [i0, i0 + rows) of query head h (of q, or dout): copied into a tile, times `factor`.
template <class A, class T>
void load_rows(const T* x, A (*to)[kMaxDh], const Problem& z, int64_t b, int64_t h, int64_t i0, int64_t rows, A factor) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < z.D; ++d) to[r][d] = factor * static_cast<A>(load(x[((b * z.T + i0 + r) * z.H + h) * z.D + d]));
}

// The workspace of one thread: its tiles, its kv head's keys (kt and vb; backward all four), then (backward) the
// dk and dv accumulators of a whole kv head.
int64_t tiles_bytes(DType d) { return aligned64(d == DType::f64 ? sizeof(Tiles<double>) : sizeof(Tiles<float>)); }
int64_t arithmetic_bytes(DType d) { return d == DType::f64 ? 8 : 4; }  // of A
int64_t keys_bytes(const ir::Node& n, DType d, int64_t S, int64_t D) {
  return aligned64((n.op == ir::Op::attention_grad ? 4 : 2) * padded_keys(S) * D * arithmetic_bytes(d));
}
int64_t per_thread(const ir::Node& n, DType d, int64_t S, int64_t D) {
  return tiles_bytes(d) + keys_bytes(n, d, S, D) +
         (n.op == ir::Op::attention_grad ? aligned64(2 * S * D * arithmetic_bytes(d)) : 0);
}
template <class A>
Tiles<A>& tiles_of(std::span<std::byte> workspace, int64_t bytes_per_thread) {
  const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
  return *reinterpret_cast<Tiles<A>*>(workspace.data() + thread * bytes_per_thread);
}
// The thread's key arrays, after its tiles.
template <class A>
Keys<A> keys_of(Tiles<A>& t, const ir::Node& n, const Problem& z) {
  A* at = reinterpret_cast<A*>(reinterpret_cast<std::byte*>(&t) + tiles_bytes(sizeof(A) == 8 ? DType::f64 : DType::f32));
  const int64_t stride = padded_keys(z.S), size = stride * z.D;
  const bool grad = n.op == ir::Op::attention_grad;
  return {.kt = at, .vt = grad ? at + 2 * size : nullptr, .kb = grad ? at + 3 * size : nullptr, .vb = at + size,
          .stride = stride};
}
// Fills `keys` with kv head g of batch b.
template <class A, class T>
void load_keys(const Keys<A>& keys, const T* k, const T* v, const Problem& z, int64_t b, int64_t g) {
  for (int64_t d = 0; d < z.D; ++d) {
    std::fill(keys.kt + d * keys.stride + z.S, keys.kt + (d + 1) * keys.stride, A(0));
    if (keys.vt) std::fill(keys.vt + d * keys.stride + z.S, keys.vt + (d + 1) * keys.stride, A(0));
  }
  for (int64_t j = 0; j < z.S; ++j)
    for (int64_t d = 0; d < z.D; ++d) {
      const int64_t at = ((b * z.S + j) * z.KV + g) * z.D + d;
      const A kx = static_cast<A>(load(k[at])), vx = static_cast<A>(load(v[at]));
      keys.kt[d * keys.stride + j] = kx;
      keys.vb[j * z.D + d] = vx;
      if (keys.vt) keys.vt[d * keys.stride + j] = vx, keys.kb[j * z.D + d] = kx;
    }
}
// Register blocking. Vectors of 64 bytes (GCC's vector extension): each target clone lowers them to its widest
// registers. A block of R rows (or keys) shares every load of the other operand. Each element is still summed
// in the order one row at a time summed it, with separate multiplies and adds (-ffp-contract=off): the same bits.
template <class A>
struct Vec {
  typedef A type __attribute__((vector_size(64)));
  static constexpr int64_t lanes = 64 / static_cast<int64_t>(sizeof(A));
};
template <class A>
using V = typename Vec<A>::type;
// (Vectors pass by reference: a 64-byte vector by value has an ABI of its own per target.)
template <class A>
void load_v(V<A>& v, const A* p) {
  std::memcpy(&v, p, sizeof v);
}
template <class A>
void store_v(A* p, const V<A>& v) {
  std::memcpy(p, &v, sizeof v);
}
template <class A>
void splat(V<A>& v, A x) {
  for (int64_t i = 0; i < Vec<A>::lanes; ++i) v[i] = x;
}

// out[r][j] = Σ_d x[r][d]·block[d·ld + j], d in order, for R rows and the kBlock columns of a transposed block
// (columns past the keys are zero; the callers ignore them).
template <int64_t R, class A>
void rows_times_block(const A (*x)[kMaxDh], const A* block, int64_t ld, A (*out)[kBlock], int64_t D) {
  constexpr int64_t L = Vec<A>::lanes, C = kBlock / L;
  V<A> acc[R][C] = {};
  for (int64_t d = 0; d < D; ++d) {
    V<A> column[C];
    for (int64_t c = 0; c < C; ++c) load_v(column[c], block + d * ld + c * L);
    for (int64_t r = 0; r < R; ++r) {
      V<A> xd;
      splat(xd, x[r][d]);
      for (int64_t c = 0; c < C; ++c) acc[r][c] += xd * column[c];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) store_v(&out[r][c * L], acc[r][c]);
}
template <class A>
void times_block(const A (*x)[kMaxDh], const A* block, int64_t ld, A (*out)[kBlock], int64_t rows, int64_t D) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) rows_times_block<4>(x + r, block, ld, out + r, D);
  for (; r < rows; ++r) rows_times_block<1>(x + r, block, ld, out + r, D);
}

// acc[r][d] += Σ_j coef[r][j]·block[j·ld + d], j in [0, cols) in order, for R rows, d in [d0, d0 + C vectors).
template <int64_t R, int64_t C, class A>
void rows_accumulate_chunk(const A (*coef)[kBlock], const A* block, int64_t ld, A (*acc)[kMaxDh], int64_t cols, int64_t d0) {
  constexpr int64_t L = Vec<A>::lanes;
  V<A> a[R][C];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) load_v(a[r][c], &acc[r][d0 + c * L]);
  for (int64_t j = 0; j < cols; ++j) {
    V<A> row[C];
    for (int64_t c = 0; c < C; ++c) load_v(row[c], block + j * ld + d0 + c * L);
    for (int64_t r = 0; r < R; ++r) {
      V<A> p;
      splat(p, coef[r][j]);
      for (int64_t c = 0; c < C; ++c) a[r][c] += p * row[c];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) store_v(&acc[r][d0 + c * L], a[r][c]);
}
template <int64_t R, class A>
void rows_accumulate(const A (*coef)[kBlock], const A* block, int64_t ld, A (*acc)[kMaxDh], int64_t cols, int64_t D) {
  constexpr int64_t L = Vec<A>::lanes;
  int64_t d0 = 0;
  for (; d0 + 4 * L <= D; d0 += 4 * L) rows_accumulate_chunk<R, 4>(coef, block, ld, acc, cols, d0);
  for (; d0 + L <= D; d0 += L) rows_accumulate_chunk<R, 1>(coef, block, ld, acc, cols, d0);
  for (; d0 < D; ++d0)  // the tail, element by element
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < cols; ++j) acc[r][d0] += coef[r][j] * block[j * ld + d0];
}
// The tile's context rows (or dq): acc[r] += coef[r] · block, for its `rows` rows over the block's `cols` keys.
template <class A>
void accumulate(const A (*coef)[kBlock], const A* block, int64_t ld, A (*acc)[kMaxDh], int64_t rows, int64_t cols,
                int64_t D) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) rows_accumulate<4>(coef + r, block, ld, acc + r, cols, D);
  for (; r < rows; ++r) rows_accumulate<1>(coef + r, block, ld, acc + r, cols, D);
}

// out[j][d] += Σ_r (coef[r][j] / divisor)·x[r][d], r in [0, rows) in order, for J keys from j0 (out's row j at
// out + j·D), d in [d0, d0 + C vectors).
template <int64_t J, int64_t C, class A>
void keys_accumulate_chunk(const A (*coef)[kBlock], A divisor, const A (*x)[kMaxDh], A* out, int64_t j0, int64_t rows,
                           int64_t D, int64_t d0) {
  constexpr int64_t L = Vec<A>::lanes;
  V<A> a[J][C];
  for (int64_t j = 0; j < J; ++j)
    for (int64_t c = 0; c < C; ++c) load_v(a[j][c], out + (j0 + j) * D + d0 + c * L);
  for (int64_t r = 0; r < rows; ++r) {
    V<A> row[C];
    for (int64_t c = 0; c < C; ++c) load_v(row[c], &x[r][d0 + c * L]);
    for (int64_t j = 0; j < J; ++j) {
      V<A> p;
      splat(p, coef[r][j0 + j] / divisor);
      for (int64_t c = 0; c < C; ++c) a[j][c] += p * row[c];
    }
  }
  for (int64_t j = 0; j < J; ++j)
    for (int64_t c = 0; c < C; ++c) store_v(out + (j0 + j) * D + d0 + c * L, a[j][c]);
}
template <int64_t J, class A>
void keys_accumulate(const A (*coef)[kBlock], A divisor, const A (*x)[kMaxDh], A* out, int64_t j0, int64_t rows, int64_t D) {
  constexpr int64_t L = Vec<A>::lanes;
  int64_t d0 = 0;
  for (; d0 + 2 * L <= D; d0 += 2 * L) keys_accumulate_chunk<J, 2>(coef, divisor, x, out, j0, rows, D, d0);
  for (; d0 + L <= D; d0 += L) keys_accumulate_chunk<J, 1>(coef, divisor, x, out, j0, rows, D, d0);
  for (; d0 < D; ++d0)  // the tail, element by element
    for (int64_t j = j0; j < j0 + J; ++j)
      for (int64_t r = 0; r < rows; ++r) out[j * D + d0] += coef[r][j] / divisor * x[r][d0];
}
// dv or dk of the block's `cols` keys (out: the key's row at out + j·D): += (coefᵀ / divisor) · x over the rows.
template <class A>
void accumulate_keys(const A (*coef)[kBlock], A divisor, const A (*x)[kMaxDh], A* out, int64_t rows, int64_t cols, int64_t D) {
  int64_t j = 0;
  for (; j + 4 <= cols; j += 4) keys_accumulate<4>(coef, divisor, x, out, j, rows, D);
  for (; j < cols; ++j) keys_accumulate<1>(coef, divisor, x, out, j, rows, D);
}

// s = q kᵀ for the tile, with keys after a causal row's query at -inf.
template <class A>
void scores(Tiles<A>& t, const Keys<A>& keys, const Problem& z, int64_t i0, int64_t rows, int64_t s0, int64_t cols) {
  times_block(t.q, keys.kt + s0, keys.stride, t.s, rows, z.D);
  if (z.causal)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = std::max<int64_t>(0, i0 + r + 1 - s0); j < cols; ++j) t.s[r][j] = -std::numeric_limits<A>::infinity();
}

// Heads [lo, hi) of the (batch, head) pairs of attention, in the calling thread's tiles.
void attention_heads_body(const ir::Node& n, std::span<const Array> in, std::span<Array> out,
                          const Problem& z, std::span<std::byte> workspace, int64_t bytes_per_thread,
                          int64_t lo, int64_t hi) {
  dispatch_float(in[0].type().dtype, n, [&](auto type) {
    using T = decltype(type);
    using A = Acc<T>;
    const T *q = in[0].data<T>(), *k = in[1].data<T>(), *v = in[2].data<T>();
    T* o = out[0].data<T>();
    A* lse = out[1].data<A>();
    const int64_t rep = z.H / z.KV;
    Tiles<A>& t = tiles_of<A>(workspace, bytes_per_thread);
    const Keys<A> kv = keys_of(t, n, z);
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / z.H, h = bh % z.H, g = h / rep;
      if (bh == lo || h % rep == 0) load_keys(kv, k, v, z, b, g);  // a new kv head
      for (int64_t i0 = 0; i0 < z.T; i0 += kRows) {
        const int64_t rows = std::min(kRows, z.T - i0), keys = z.causal ? i0 + rows : z.S;
        load_rows(q, t.q, z, b, h, i0, rows, static_cast<A>(z.scale));
        for (int64_t r = 0; r < rows; ++r) {
          t.m[r] = -std::numeric_limits<A>::infinity(), t.l[r] = 0;
          std::fill(t.acc[r], t.acc[r] + z.D, A(0));
        }
        for (int64_t s0 = 0; s0 < keys; s0 += kBlock) {  // the online softmax, one block of keys at a time
          const int64_t cols = std::min(kBlock, keys - s0);
          scores(t, kv, z, i0, rows, s0, cols);
          for (int64_t r = 0; r < rows; ++r) {
            A* sr = t.s[r];
            A m_new = t.m[r];  // a maximum is exact in any order
#pragma omp simd reduction(max : m_new)
            for (int64_t j = 0; j < cols; ++j) m_new = std::max(m_new, sr[j]);
            const A correction = exp_of(t.m[r] - m_new);  // 0 at the first block (exp(-inf))
            t.l[r] *= correction;
#pragma omp simd
            for (int64_t d = 0; d < z.D; ++d) t.acc[r][d] *= correction;
#pragma omp simd
            for (int64_t j = 0; j < cols; ++j) sr[j] = exp_of(sr[j] - m_new);
            t.m[r] = m_new;
          }
          for (int64_t j = 0; j < cols; ++j)  // each row's sum in key order; the rows' chains side by side
            for (int64_t r = 0; r < rows; ++r) t.l[r] += t.s[r][j];
          accumulate(t.s, kv.vb + s0 * z.D, z.D, t.acc, rows, cols, z.D);  // acc += p v
        }
        for (int64_t r = 0; r < rows; ++r) {
          T* orow = o + ((b * z.T + i0 + r) * z.H + h) * z.D;
          for (int64_t d = 0; d < z.D; ++d) orow[d] = store<T>(static_cast<Compute<T>>(t.acc[r][d] / t.l[r]));
          lse[(b * z.H + h) * z.T + i0 + r] = t.m[r] + std::log(t.l[r]);
        }
      }
    }
  });
}

REMAT_WIDEST_CLONES(attention_heads, attention_heads_body)

// kv heads [lo, hi) of the (batch, kv head) pairs of attention_grad, in the calling thread's tiles.
void attention_grad_heads_body(const ir::Node& n, std::span<const Array> in, std::span<Array> out,
                               const Problem& z, std::span<std::byte> workspace, int64_t lo,
                               int64_t hi) {
  dispatch_float(in[0].type().dtype, n, [&](auto type) {
    using T = decltype(type);
    using A = Acc<T>;
    const A scale = static_cast<A>(z.scale);
    const T *q = in[0].data<T>(), *k = in[1].data<T>(), *v = in[2].data<T>(), *o = in[3].data<T>(), *dout = in[5].data<T>();
    const A* lse = in[4].data<A>();
    T *dq = out[0].data<T>(), *dk = out[1].data<T>(), *dv = out[2].data<T>();
    const int64_t rep = z.H / z.KV, bytes_per_thread = per_thread(n, in[0].type().dtype, z.S, z.D);
    Tiles<A>& t = tiles_of<A>(workspace, bytes_per_thread);
    const Keys<A> kv = keys_of(t, n, z);
    A* dk_acc = reinterpret_cast<A*>(reinterpret_cast<std::byte*>(&t) + tiles_bytes(in[0].type().dtype) +
                                     keys_bytes(n, in[0].type().dtype, z.S, z.D));
    A* dv_acc = dk_acc + z.S * z.D;
    for (int64_t bg = lo; bg < hi; ++bg) {
      const int64_t b = bg / z.KV, g = bg % z.KV;
      load_keys(kv, k, v, z, b, g);
      std::fill(dk_acc, dk_acc + 2 * z.S * z.D, A(0));
      for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
        for (int64_t i0 = 0; i0 < z.T; i0 += kRows) {
          const int64_t rows = std::min(kRows, z.T - i0), keys = z.causal ? i0 + rows : z.S;
          load_rows(q, t.q, z, b, h, i0, rows, scale);
          load_rows(dout, t.dout, z, b, h, i0, rows, A(1));
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t row = (b * z.T + i0 + r) * z.H + h;
            t.delta[r] = dot<A>(dout + row * z.D, o + row * z.D, z.D);
            t.l[r] = lse[(b * z.H + h) * z.T + i0 + r];
            std::fill(t.acc[r], t.acc[r] + z.D, A(0));
          }
          for (int64_t s0 = 0; s0 < keys; s0 += kBlock) {
            const int64_t cols = std::min(kBlock, keys - s0);
            scores(t, kv, z, i0, rows, s0, cols);
            times_block(t.dout, kv.vt + s0, kv.stride, t.ds, rows, z.D);
            for (int64_t r = 0; r < rows; ++r) {  // p = exp(s - lse); ds = p (dout . v - delta) · scale
              A* dsr = t.ds[r];
#pragma omp simd
              for (int64_t j = 0; j < cols; ++j) {
                t.s[r][j] = exp_of(t.s[r][j] - t.l[r]);
                dsr[j] = t.s[r][j] * (dsr[j] - t.delta[r]) * scale;
              }
            }
            // dv += pᵀ dout, dk += dsᵀ q (the tile's q is scaled: ds / scale), dq += ds k
            accumulate_keys(t.s, A(1), t.dout, dv_acc + s0 * z.D, rows, cols, z.D);
            accumulate_keys(t.ds, scale, t.q, dk_acc + s0 * z.D, rows, cols, z.D);
            accumulate(t.ds, kv.kb + s0 * z.D, z.D, t.acc, rows, cols, z.D);
          }
          for (int64_t r = 0; r < rows; ++r) {
            T* dqr = dq + ((b * z.T + i0 + r) * z.H + h) * z.D;
            for (int64_t d = 0; d < z.D; ++d) dqr[d] = store<T>(static_cast<Compute<T>>(t.acc[r][d]));
          }
        }
      }
      for (int64_t j = 0; j < z.S; ++j)
        for (int64_t d = 0; d < z.D; ++d) {
          const int64_t at = ((b * z.S + j) * z.KV + g) * z.D + d;
          dk[at] = store<T>(static_cast<Compute<T>>(dk_acc[j * z.D + d]));
          dv[at] = store<T>(static_cast<Compute<T>>(dv_acc[j * z.D + d]));
        }
    }
  });
}

REMAT_WIDEST_CLONES(attention_grad_heads, attention_grad_heads_body)

}  // namespace

// Per thread: its tiles (and, backward, the dk and dv accumulators of one kv head), in A.
int64_t workspace_attention(const ir::Node& n, std::span<const ir::Type> in) {
  return static_cast<int64_t>(omp_get_max_threads()) * per_thread(n, in[0].dtype, in[1].shape[1], in[0].shape[3]);
}

void kernel_attention(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const Problem z = problem_of(n, in);
  const int64_t bytes_per_thread = per_thread(n, in[0].type().dtype, z.S, z.D);
  parallel_ranges(z.B * z.H, z.B * z.H * z.T * z.S * z.D >= kParallelMin, [&](int64_t lo, int64_t hi) {
    attention_heads(n, in, out, z, ctx.workspace, bytes_per_thread, lo, hi);
  });
}

void kernel_attention_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const Problem z = problem_of(n, in);
  parallel_ranges(z.B * z.KV, z.B * z.H * z.T * z.S * z.D >= kParallelMin, [&](int64_t lo, int64_t hi) {
    attention_grad_heads(n, in, out, z, ctx.workspace, lo, hi);
  });
}

}  // namespace remat::exec
