// softmax over the last axis and its VJP from the input (ir/ops.h). Rows are independent: a parallel loop hands
// each thread whole rows, each row's arithmetic in A = f32 (f64 for f64 x) in a fixed order, so the results do
// not depend on the thread count. A row: its max; exp(x − max) into the thread's row of the workspace, summed in
// 8 lanes combined pairwise; then each exp divided by the sum. The VJP recomputes those probabilities the same
// way (the same bits softmax had before rounding to its dtype), then dx = p·(g − Σ g·p).
#include "exec/kernels/exp.h"
#include "exec/kernels/kernels.h"

#include <limits>

namespace remat::exec {
namespace {

constexpr int64_t kLanes = 8;

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Eight partial sums combined pairwise: (0+1)+(2+3) + ((4+5)+(6+7)).
template <class A>
A combine(const A (&lane)[kLanes]) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The row's max over its non-NaN elements (−inf when there are none). A NaN needs no care here: its exp makes the
// row's sum NaN, and so every probability, as the primitives give.
template <class A, class T>
A row_max(const T* x, int64_t w) {
  A lane[kLanes];
  for (A& l : lane) l = -std::numeric_limits<A>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= w; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) {
      const A a = static_cast<A>(load(x[j + l]));
      lane[l] = a > lane[l] ? a : lane[l];
    }
  for (; j < w; ++j) {
    const A a = static_cast<A>(load(x[j]));
    lane[0] = a > lane[0] ? a : lane[0];
  }
  A m = lane[0];
  for (int64_t l = 1; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  return m;
}

// p[j] = exp(x[j] − max) / Σ exp(x[k] − max) for the row x[0, w).
template <class A, class T>
void probabilities(const T* x, int64_t w, A* p) {
  const A m = row_max<A>(x, w);
  A lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= w; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += p[j + l] = exp_of(static_cast<A>(load(x[j + l])) - m);
  for (; j < w; ++j) lane[0] += p[j] = exp_of(static_cast<A>(load(x[j])) - m);
  const A s = combine(lane);
  for (j = 0; j < w; ++j) p[j] /= s;
}

// Rows of length w (the last dim) and the thread's row of the workspace.
int64_t row_length(const ir::Type& t) { return t.shape.back(); }
int64_t row_bytes(const ir::Type& t) { return aligned64(row_length(t) * (t.dtype == DType::f64 ? 8 : 4)); }
template <class A>
A* row_of(std::span<std::byte> workspace, const ir::Type& t) {
  const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
  return reinterpret_cast<A*>(workspace.data() + thread * row_bytes(t));
}

}  // namespace

int64_t workspace_softmax(const ir::Node&, std::span<const ir::Type> in) {
  return static_cast<int64_t>(omp_get_max_threads()) * row_bytes(in[0]);
}

void kernel_softmax(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(t));  // a row per thread
  dispatch_float(t.dtype, n, [&](auto xt) {
    using T = decltype(xt);
    using A = Acc<T>;
    dispatch_float(out[0].type().dtype, n, [&](auto ut) {
      using U = decltype(ut);
      const T* x = in[0].data<T>();
      U* y = out[0].data<U>();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        A* p = row_of<A>(ctx.workspace, t);
        probabilities(x + r * w, w, p);
        for (int64_t j = 0; j < w; ++j) y[r * w + j] = store<U>(static_cast<Compute<U>>(p[j]));
      }
    });
  });
}

void kernel_softmax_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(t));  // a row per thread
  dispatch_float(t.dtype, n, [&](auto xt) {
    using T = decltype(xt);
    using A = Acc<T>;
    dispatch_float(in[1].type().dtype, n, [&](auto gt) {
      using G = decltype(gt);
      const T* x = in[0].data<T>();
      const G* g = in[1].data<G>();
      T* dx = out[0].data<T>();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        A* p = row_of<A>(ctx.workspace, t);
        probabilities(x + r * w, w, p);
        const G* gr = g + r * w;
        A lane[kLanes] = {};
        int64_t j = 0;
        for (; j + kLanes <= w; j += kLanes)
          for (int64_t l = 0; l < kLanes; ++l) lane[l] += static_cast<A>(load(gr[j + l])) * p[j + l];
        for (; j < w; ++j) lane[0] += static_cast<A>(load(gr[j])) * p[j];
        const A d = combine(lane);
        for (j = 0; j < w; ++j) dx[r * w + j] = store<T>(static_cast<Compute<T>>(p[j] * (static_cast<A>(load(gr[j])) - d)));
      }
    });
  });
}

}  // namespace remat::exec
