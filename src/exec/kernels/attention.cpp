// Flash attention on the CPU (ir/ops.h): an online softmax over blocks of keys, forward, and the backward that
// recomputes each block's probabilities from the saved log-sum-exp. Arithmetic in A = f32 (f64 for f64
// operands, the log-sum-exp too); no score-sized array: each thread's tiles (a block of
// queries against a block of keys) live in the plan's workspace for the node. Each (batch, head)
// — backward: each (batch, kv head) with its group of query heads — is one thread's, in a fixed order, so the
// results do not depend on the thread count.
#include "exec/kernels/exp.h"
#include "exec/kernels/kernels.h"

#include <omp.h>

#include <cmath>
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
  A kt[kMaxDh][kBlock], vt[kMaxDh][kBlock], kb[kBlock][kMaxDh], vb[kBlock][kMaxDh];
  A s[kRows][kBlock], ds[kRows][kBlock];
  A m[kRows], l[kRows], delta[kRows];
};

// Rows [i0, i0 + rows) of query head h, keys [s0, s0 + cols) of kv head g: copied into the tiles (q scaled).
template <class A, class T>
void load_rows(const T* x, A (*to)[kMaxDh], const Problem& z, int64_t b, int64_t h, int64_t i0, int64_t rows, A factor) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < z.D; ++d) to[r][d] = factor * static_cast<A>(load(x[((b * z.T + i0 + r) * z.H + h) * z.D + d]));
}

// The workspace of one thread: its tiles, then (backward) the dk and dv accumulators of a whole kv head.
int64_t tiles_bytes(DType d) { return aligned64(d == DType::f64 ? sizeof(Tiles<double>) : sizeof(Tiles<float>)); }
int64_t per_thread(const ir::Node& n, DType d, int64_t S, int64_t D) {
  return tiles_bytes(d) + (n.op == ir::Op::attention_grad ? aligned64(2 * S * D * (d == DType::f64 ? 8 : 4)) : 0);
}
template <class A>
Tiles<A>& tiles_of(std::span<std::byte> workspace, int64_t bytes_per_thread) {
  const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
  return *reinterpret_cast<Tiles<A>*>(workspace.data() + thread * bytes_per_thread);
}
template <class A, class T>
void load_keys(Tiles<A>& t, const T* k, const T* v, const Problem& z, int64_t b, int64_t g, int64_t s0, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t d = 0; d < z.D; ++d) {
      const int64_t at = ((b * z.S + s0 + j) * z.KV + g) * z.D + d;
      t.kb[j][d] = t.kt[d][j] = static_cast<A>(load(k[at]));
      t.vb[j][d] = t.vt[d][j] = static_cast<A>(load(v[at]));
    }
}
// out[j] = x · column j of a transposed block (D rows of kBlock), for the block's `cols` keys.
template <class A>
void times_block(const A* x, const A (*block)[kBlock], A* out, int64_t D, int64_t cols) {
  std::fill(out, out + cols, A(0));
  for (int64_t d = 0; d < D; ++d) {
    const A xd = x[d];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) out[j] += xd * block[d][j];
  }
}

// s = q kᵀ for the tile, with keys after a causal row's query at -inf.
template <class A>
void scores(Tiles<A>& t, const Problem& z, int64_t i0, int64_t rows, int64_t s0, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    A* sr = t.s[r];
    times_block(t.q[r], t.kt, sr, z.D, cols);
    if (z.causal)
      for (int64_t j = std::max<int64_t>(0, i0 + r + 1 - s0); j < cols; ++j) sr[j] = -std::numeric_limits<A>::infinity();
  }
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
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / z.H, h = bh % z.H, g = h / rep;
      for (int64_t i0 = 0; i0 < z.T; i0 += kRows) {
        const int64_t rows = std::min(kRows, z.T - i0), keys = z.causal ? i0 + rows : z.S;
        load_rows(q, t.q, z, b, h, i0, rows, static_cast<A>(z.scale));
        for (int64_t r = 0; r < rows; ++r) {
          t.m[r] = -std::numeric_limits<A>::infinity(), t.l[r] = 0;
          std::fill(t.acc[r], t.acc[r] + z.D, A(0));
        }
        for (int64_t s0 = 0; s0 < keys; s0 += kBlock) {  // the online softmax, one block of keys at a time
          const int64_t cols = std::min(kBlock, keys - s0);
          load_keys(t, k, v, z, b, g, s0, cols);
          scores(t, z, i0, rows, s0, cols);
          for (int64_t r = 0; r < rows; ++r) {
            A* sr = t.s[r];
            const A m_new = std::max(t.m[r], *std::max_element(sr, sr + cols));
            const A correction = exp_of(t.m[r] - m_new);  // 0 at the first block (exp(-inf))
            t.l[r] *= correction;
#pragma omp simd
            for (int64_t d = 0; d < z.D; ++d) t.acc[r][d] *= correction;
#pragma omp simd
            for (int64_t j = 0; j < cols; ++j) sr[j] = exp_of(sr[j] - m_new);
            for (int64_t j = 0; j < cols; ++j) t.l[r] += sr[j];  // in key order, as one loop summed them
            t.m[r] = m_new;
            for (int64_t j = 0; j < cols; ++j) {
              const A p = sr[j];
#pragma omp simd
              for (int64_t d = 0; d < z.D; ++d) t.acc[r][d] += p * t.vb[j][d];
            }
          }
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
    A* dk_acc = reinterpret_cast<A*>(reinterpret_cast<std::byte*>(&t) + tiles_bytes(in[0].type().dtype));
    A* dv_acc = dk_acc + z.S * z.D;
    for (int64_t bg = lo; bg < hi; ++bg) {
      const int64_t b = bg / z.KV, g = bg % z.KV;
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
            load_keys(t, k, v, z, b, g, s0, cols);
            scores(t, z, i0, rows, s0, cols);
            for (int64_t r = 0; r < rows; ++r) {  // p = exp(s - lse); ds = p (dout . v - delta) · scale
              A* dsr = t.ds[r];
              times_block(t.dout[r], t.vt, dsr, z.D, cols);
#pragma omp simd
              for (int64_t j = 0; j < cols; ++j) {
                t.s[r][j] = exp_of(t.s[r][j] - t.l[r]);
                dsr[j] = t.s[r][j] * (dsr[j] - t.delta[r]) * scale;
              }
            }
            for (int64_t j = 0; j < cols; ++j) {  // dv += pᵀ dout, dk += dsᵀ q (the tile's q is scaled: ds / scale)
              A* dvj = dv_acc + (s0 + j) * z.D;
              A* dkj = dk_acc + (s0 + j) * z.D;
              for (int64_t r = 0; r < rows; ++r) {
                const A p = t.s[r][j], ds = t.ds[r][j] / scale;
#pragma omp simd
                for (int64_t d = 0; d < z.D; ++d) {
                  dvj[d] += p * t.dout[r][d];
                  dkj[d] += ds * t.q[r][d];
                }
              }
            }
            for (int64_t r = 0; r < rows; ++r)  // dq += ds k
              for (int64_t j = 0; j < cols; ++j) {
                const A ds = t.ds[r][j];
#pragma omp simd
                for (int64_t d = 0; d < z.D; ++d) t.acc[r][d] += ds * t.kb[j][d];
              }
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
