// Flash attention on the CPU (ir/ops.h): an online softmax over blocks of keys, forward, and the backward that
// recomputes each block's probabilities from the saved log-sum-exp. Arithmetic in A = f32 (f64 for f64
// operands, the log-sum-exp too); no score-sized array: each thread's tiles (a block of queries against a block
// of keys) and its kv head's keys and values, laid out once for every tile, live in the plan's workspace for the
// node. Each (batch, head)
// — backward: each (batch, kv head) with its group of query heads — is one thread's, in a fixed order, so the
// results do not depend on the thread count. bf16 operands have kernels of their own (attention_bf16.cpp).
#include "exec/kernels/attention.h"
#include "exec/kernels/exp.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace remat::exec {
namespace {

using namespace flash;

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
  A s[kRows][kBlock], ds[kRows][kBlock], dk_coef[kRows][kBlock];  // dk_coef: ds before its scale (q's tile has it)
  A m[kRows], l[kRows], delta[kRows];
};

// One kv head's keys and values in A, laid out for the products, filled once per (batch, kv head) and read by
// every query tile of every head of its group: transposed, block by block (kt, vt: for each block of kBlock keys,
// D rows of kBlock, so that a product's rows of keys are adjacent and not a power of two apart, which would put
// them all in one set of the L1 cache), and as rows (kb, vb: S rows of D). The forward uses kt and vb.
template <class A>
struct Keys {
  A *kt, *vt, *kb, *vb;
};

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
// The thread's key arrays, after its tiles.
template <class A>
Keys<A> keys_of(Tiles<A>& t, const ir::Node& n, const Problem& z) {
  A* at = reinterpret_cast<A*>(reinterpret_cast<std::byte*>(&t) + tiles_bytes(sizeof(A) == 8 ? DType::f64 : DType::f32));
  const int64_t size = padded_keys(z.S) * z.D;
  const bool grad = n.op == ir::Op::attention_grad;
  return {.kt = at, .vt = grad ? at + 2 * size : nullptr, .kb = grad ? at + 3 * size : nullptr, .vb = at + size};
}
// Fills `keys` with kv head g of batch b.
template <class A, class T>
void load_keys(const Keys<A>& keys, const T* k, const T* v, const Problem& z, int64_t b, int64_t g) {
  const int64_t first = (b * z.S * z.KV + g) * z.D, lx = z.KV * z.D;  // key j's row at first + j·lx
  for (int64_t s0 = 0; s0 < z.S; s0 += kBlock) {
    const int64_t cols = std::min(kBlock, z.S - s0);
    transpose(k + first + s0 * lx, lx, keys.kt + s0 * z.D, kBlock, cols, z.D);
    if (keys.vt) transpose(v + first + s0 * lx, lx, keys.vt + s0 * z.D, kBlock, cols, z.D);
  }
  for (int64_t j = 0; j < z.S; ++j)
    for (int64_t d = 0; d < z.D; ++d) {
      keys.vb[j * z.D + d] = static_cast<A>(load(v[first + j * lx + d]));
      if (keys.kb) keys.kb[j * z.D + d] = static_cast<A>(load(k[first + j * lx + d]));
    }
}

// The tiles' products, register-blocked. Vectors of the target's width (GCC's vector extension; 16 bytes on
// baseline x86-64): a block of R rows shares every load of the other operand, R x C vectors of sums live in
// registers. Each element is still summed in index order, from zero or its value, a term at a time as one fused
// multiply-add (exp.h's fused_multiply_add: vfmadd on the avx2 and x86-64-v4 targets, libm's call on baseline
// x86-64): the same bits on every target and for any blocking. Fused, the products ran 5-12% faster than as
// separate multiplies and adds (Zen 5).
template <Isa isa>
constexpr int64_t kVectorBytes = isa == Isa::x86_64_v4 ? 64 : isa == Isa::avx2 ? 32 : 16;
template <Isa isa>
constexpr int64_t kColumnVectors = isa == Isa::x86_64_v4 ? 4 : 2;  // C: R x C sums, C loads and a splat in registers
template <Isa isa>
constexpr int64_t kRowBlock = isa == Isa::x86_64_v4 ? 4 : 6;  // R
template <class A, int64_t W>
struct Vec {
  typedef A type __attribute__((vector_size(W)));
  typedef A unaligned __attribute__((vector_size(W), aligned(alignof(A)), may_alias));  // loads and stores
  static constexpr int64_t lanes = W / static_cast<int64_t>(sizeof(A));
};

// The operands of out[i][c] (+)= Σ_k a(i, k)·b[k][c]: a(i, k) at a[i·ai + k·ak] (a row-major or transposed tile),
// b's rows `lb` apart, out's rows `lo` apart.
template <class A>
struct Product {
  const A* a;
  int64_t ai, ak;
  const A* b;
  int64_t lb;
  A* out;
  int64_t lo, K;
  bool accumulate;  // add to out, or overwrite it
};

// Rows [i, i + R) and columns [c, c + C·lanes) of a product.
template <int64_t R, int64_t C, class A, int64_t W>
void product_block(const Product<A>& p, int64_t i, int64_t c) {
  using V = typename Vec<A, W>::type;
  constexpr int64_t L = Vec<A, W>::lanes;
  using U = typename Vec<A, W>::unaligned;
  V sum[R][C];
#pragma GCC unroll 8
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v)
      sum[r][v] = p.accumulate ? *reinterpret_cast<const U*>(p.out + (i + r) * p.lo + c + v * L) : V{};
  const A* a = p.a + i * p.ai;
#pragma GCC unroll 4  // ~3% on Zen 2: the loop's own add, compare and branch are 4 of its 36 instructions
  for (int64_t k = 0; k < p.K; ++k) {
    V row[C];
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v) row[v] = *reinterpret_cast<const U*>(p.b + k * p.lb + c + v * L);
#pragma GCC unroll 8
    for (int64_t r = 0; r < R; ++r) {
      const A x = a[r * p.ai + k * p.ak];
#pragma GCC unroll 4
      for (int64_t v = 0; v < C; ++v) {
        V& s = sum[r][v];
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) s[l] = fused_multiply_add(x, row[v][l], s[l]);
      }
    }
  }
#pragma GCC unroll 8
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int64_t v = 0; v < C; ++v) *reinterpret_cast<U*>(p.out + (i + r) * p.lo + c + v * L) = sum[r][v];
}
// Rows [i, i + R), all `cols` columns: blocks of C vectors, then single vectors, then element by element.
template <Isa isa, int64_t R, class A>
void product_rows(const Product<A>& p, int64_t i, int64_t cols) {
  constexpr int64_t W = kVectorBytes<isa>, L = Vec<A, W>::lanes, C = kColumnVectors<isa>;
  int64_t c = 0;
  for (; c + C * L <= cols; c += C * L) product_block<R, C, A, W>(p, i, c);
  for (; c + L <= cols; c += L) product_block<R, 1, A, W>(p, i, c);
  for (; c < cols; ++c)
    for (int64_t r = i; r < i + R; ++r) {
      A sum = p.accumulate ? p.out[r * p.lo + c] : A(0);
      for (int64_t k = 0; k < p.K; ++k) sum = fused_multiply_add(p.a[r * p.ai + k * p.ak], p.b[k * p.lb + c], sum);
      p.out[r * p.lo + c] = sum;
    }
}
// The whole product: `rows` x `cols`.
template <Isa isa, class A>
void product(const Product<A>& p, int64_t rows, int64_t cols) {
  int64_t i = 0;
  for (; i + kRowBlock<isa> <= rows; i += kRowBlock<isa>) product_rows<isa, kRowBlock<isa>>(p, i, cols);
  for (; i < rows; ++i) product_rows<isa, 1>(p, i, cols);
}

// out = x · block for the tile's `rows` rows (x: rows of kMaxDh) and the first `cols` keys of a transposed block
// (D rows, `ld` apart).
template <Isa isa, class A>
void times_block(const A (*x)[kMaxDh], const A* block, int64_t ld, A (*out)[kBlock], int64_t rows, int64_t cols,
                 int64_t D) {
  product<isa>(Product<A>{&x[0][0], kMaxDh, 1, block, ld, &out[0][0], kBlock, D, false}, rows, cols);
}
// The tile's context rows (or dq): acc += coef · block, over the block's `cols` keys (its rows, `ld` apart).
template <Isa isa, class A>
void accumulate(const A (*coef)[kBlock], const A* block, int64_t ld, A (*acc)[kMaxDh], int64_t rows, int64_t cols,
                int64_t D) {
  product<isa>(Product<A>{&coef[0][0], kBlock, 1, block, ld, &acc[0][0], kMaxDh, cols, true}, rows, D);
}
// dv or dk of the block's `cols` keys (out: the key's row at out + j·D): out += coefᵀ · x over the tile's rows.
template <Isa isa, class A>
void accumulate_keys(const A (*coef)[kBlock], const A (*x)[kMaxDh], A* out, int64_t rows, int64_t cols, int64_t D) {
  product<isa>(Product<A>{&coef[0][0], 1, kBlock, &x[0][0], kMaxDh, out, D, rows, true}, cols, D);
}

// s = q kᵀ for the tile, with keys after a causal row's query at -inf.
template <Isa isa, class A>
void scores(Tiles<A>& t, const Keys<A>& keys, const Problem& z, int64_t i0, int64_t rows, int64_t s0, int64_t cols) {
  times_block<isa>(t.q, keys.kt + s0 * z.D, kBlock, t.s, rows, cols, z.D);
  if (z.causal)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = std::max<int64_t>(0, i0 + r + 1 - s0); j < cols; ++j) t.s[r][j] = -std::numeric_limits<A>::infinity();
}

// Heads [lo, hi) of the (batch, head) pairs of attention, in the calling thread's tiles.
template <Isa isa>
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
    Tiles<A>& t = tiles_of<Tiles<A>>(workspace, bytes_per_thread);
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
          scores<isa>(t, kv, z, i0, rows, s0, cols);
          online_softmax(t.s, rows, cols, t.m, t.l, t.acc, z.D);
          accumulate<isa>(t.s, kv.vb + s0 * z.D, z.D, t.acc, rows, cols, z.D);  // acc += p v
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

REMAT_ISA_CLONES(attention_heads, attention_heads_body)

// kv heads [lo, hi) of the (batch, kv head) pairs of attention_grad, in the calling thread's tiles.
template <Isa isa>
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
    Tiles<A>& t = tiles_of<Tiles<A>>(workspace, bytes_per_thread);
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
            scores<isa>(t, kv, z, i0, rows, s0, cols);
            times_block<isa>(t.dout, kv.vt + s0 * z.D, kBlock, t.ds, rows, cols, z.D);
            for (int64_t r = 0; r < rows; ++r) {  // p = exp(s - lse); ds = p (dout . v - delta) · scale
              A* dsr = t.ds[r];
#pragma omp simd
              for (int64_t j = 0; j < cols; ++j) {
                t.s[r][j] = exp_nonpositive_of(t.s[r][j] - t.l[r]);
                t.dk_coef[r][j] = t.s[r][j] * (dsr[j] - t.delta[r]);
                dsr[j] = t.dk_coef[r][j] * scale;
              }
            }
            // dv += pᵀ dout, dk += (ds / scale)ᵀ q (the tile's q is scaled), dq += ds k
            accumulate_keys<isa>(t.s, t.dout, dv_acc + s0 * z.D, rows, cols, z.D);
            accumulate_keys<isa>(t.dk_coef, t.q, dk_acc + s0 * z.D, rows, cols, z.D);
            accumulate<isa>(t.ds, kv.kb + s0 * z.D, z.D, t.acc, rows, cols, z.D);
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

REMAT_ISA_CLONES(attention_grad_heads, attention_grad_heads_body)

}  // namespace

// Per thread: its tiles (and, backward, the dk and dv accumulators of one kv head), in A.
int64_t workspace_attention(const ir::Node& n, std::span<const ir::Type> in) {
  if (in[0].dtype == DType::bf16) return flash::workspace_bf16(n, in);
  return static_cast<int64_t>(omp_get_max_threads()) * per_thread(n, in[0].dtype, in[1].shape[1], in[0].shape[3]);
}

void kernel_attention(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  if (in[0].type().dtype == DType::bf16) return flash::attention_bf16(n, in, out, ctx);
  const Problem z = problem_of(n, in);
  const int64_t bytes_per_thread = per_thread(n, in[0].type().dtype, z.S, z.D);
  parallel_ranges(z.B * z.H, z.B * z.H * z.T * z.S * z.D >= kParallelMin, [&](int64_t lo, int64_t hi) {
    attention_heads(n, in, out, z, ctx.workspace, bytes_per_thread, lo, hi);
  });
}

void kernel_attention_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  if (in[0].type().dtype == DType::bf16) return flash::attention_grad_bf16(n, in, out, ctx);
  const Problem z = problem_of(n, in);
  parallel_ranges(z.B * z.KV, z.B * z.H * z.T * z.S * z.D >= kParallelMin, [&](int64_t lo, int64_t hi) {
    attention_grad_heads(n, in, out, z, ctx.workspace, lo, hi);
  });
}

}  // namespace remat::exec
