// Flash attention on the CPU (ir/ops.h): an online softmax over blocks of keys, forward, and the backward that
// recomputes each block's probabilities from the saved log-sum-exp. Arithmetic in A = f32 (f64 for f64
// operands); no score-sized array: a block of scores and one row of accumulators per thread. Each (batch, head)
// — backward: each (batch, kv head) with its group of query heads — is one thread's, in a fixed order, so the
// results do not depend on the thread count.
#include "exec/kernels/kernels.h"

#include <omp.h>

#include <cmath>
#include <limits>

namespace remat::exec {
namespace {

constexpr int64_t kBlock = 64;   // keys per block
constexpr int64_t kMaxDh = 256;  // head dims held in registers/stack per row

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

}  // namespace

void kernel_attention(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const Problem z = problem_of(n, in);
  dispatch_float(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    using A = Acc<T>;
    const A scale = static_cast<A>(z.scale);
    const T *q = in[0].data<T>(), *k = in[1].data<T>(), *v = in[2].data<T>();
    T* o = out[0].data<T>();
    float* lse = out[1].data<float>();
    const int64_t rep = z.H / z.KV;
    parallel_ranges(z.B * z.H, z.B * z.H * z.T * z.S * z.D >= kParallelMin, [&](int64_t lo, int64_t hi) {
      A acc[kMaxDh], sc[kBlock];
      for (int64_t bh = lo; bh < hi; ++bh) {
        const int64_t b = bh / z.H, h = bh % z.H, g = h / rep;
        for (int64_t i = 0; i < z.T; ++i) {
          const T* qi = q + ((b * z.T + i) * z.H + h) * z.D;
          const int64_t keys = z.causal ? i + 1 : z.S;
          A m = -std::numeric_limits<A>::infinity(), l = 0;
          std::fill(acc, acc + z.D, A(0));
          for (int64_t s0 = 0; s0 < keys; s0 += kBlock) {
            const int64_t len = std::min(kBlock, keys - s0);
            A block_max = -std::numeric_limits<A>::infinity();
            for (int64_t j = 0; j < len; ++j) {
              sc[j] = scale * dot<A>(qi, k + ((b * z.S + s0 + j) * z.KV + g) * z.D, z.D);
              block_max = std::max(block_max, sc[j]);
            }
            const A m_new = std::max(m, block_max), correction = std::exp(m - m_new);  // exp(-inf) = 0 at first
            l *= correction;
            for (int64_t d = 0; d < z.D; ++d) acc[d] *= correction;
            for (int64_t j = 0; j < len; ++j) {
              const A p = std::exp(sc[j] - m_new);
              l += p;
              const T* vj = v + ((b * z.S + s0 + j) * z.KV + g) * z.D;
              for (int64_t d = 0; d < z.D; ++d) acc[d] += p * static_cast<A>(load(vj[d]));
            }
            m = m_new;
          }
          T* oi = o + ((b * z.T + i) * z.H + h) * z.D;
          for (int64_t d = 0; d < z.D; ++d) oi[d] = store<T>(static_cast<Compute<T>>(acc[d] / l));
          lse[(b * z.H + h) * z.T + i] = static_cast<float>(m + std::log(l));
        }
      }
    });
  });
}

// dk and dv of one (batch, kv head) accumulate in the workspace, per thread: 2 · S · Dh of A.
int64_t workspace_attention_grad(const ir::Node&, std::span<const ir::Type> in) {
  const ir::Shape &q = in[0].shape, &k = in[1].shape;
  const int64_t a = in[0].dtype == DType::f64 ? 8 : 4;
  return static_cast<int64_t>(omp_get_max_threads()) * aligned64(2 * k[1] * q[3] * a);
}

void kernel_attention_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const Problem z = problem_of(n, in);
  dispatch_float(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    using A = Acc<T>;
    const A scale = static_cast<A>(z.scale);
    const T *q = in[0].data<T>(), *k = in[1].data<T>(), *v = in[2].data<T>(), *o = in[3].data<T>(), *dout = in[5].data<T>();
    const float* lse = in[4].data<float>();
    T *dq = out[0].data<T>(), *dk = out[1].data<T>(), *dv = out[2].data<T>();
    const int64_t rep = z.H / z.KV, per_thread = aligned64(2 * z.S * z.D * static_cast<int64_t>(sizeof(A)));
    std::byte* workspace = ctx.workspace.data();
    const int64_t tasks = z.B * z.KV;
    parallel_ranges(tasks, z.B * z.H * z.T * z.S * z.D >= kParallelMin, [&](int64_t lo, int64_t hi) {
      const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
      A* dk_acc = reinterpret_cast<A*>(workspace + thread * per_thread);
      A* dv_acc = dk_acc + z.S * z.D;
      A dq_row[kMaxDh];
      for (int64_t bg = lo; bg < hi; ++bg) {
        const int64_t b = bg / z.KV, g = bg % z.KV;
        std::fill(dk_acc, dk_acc + 2 * z.S * z.D, A(0));
        for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
          for (int64_t i = 0; i < z.T; ++i) {
            const int64_t row = (b * z.T + i) * z.H + h;
            const T *qi = q + row * z.D, *doi = dout + row * z.D;
            const A delta = dot<A>(doi, o + row * z.D, z.D), l = static_cast<A>(lse[(b * z.H + h) * z.T + i]);
            std::fill(dq_row, dq_row + z.D, A(0));
            const int64_t keys = z.causal ? i + 1 : z.S;
            for (int64_t j = 0; j < keys; ++j) {
              const T *kj = k + ((b * z.S + j) * z.KV + g) * z.D, *vj = v + ((b * z.S + j) * z.KV + g) * z.D;
              const A p = std::exp(scale * dot<A>(qi, kj, z.D) - l);
              const A ds = p * (dot<A>(doi, vj, z.D) - delta) * scale;
              A* dkj = dk_acc + j * z.D;
              A* dvj = dv_acc + j * z.D;
              for (int64_t d = 0; d < z.D; ++d) {
                dvj[d] += p * static_cast<A>(load(doi[d]));
                dkj[d] += ds * static_cast<A>(load(qi[d]));
                dq_row[d] += ds * static_cast<A>(load(kj[d]));
              }
            }
            for (int64_t d = 0; d < z.D; ++d) dq[row * z.D + d] = store<T>(static_cast<Compute<T>>(dq_row[d]));
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
  });
}

}  // namespace remat::exec
