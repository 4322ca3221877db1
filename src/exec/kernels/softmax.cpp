// softmax over the last axis and its VJP from the input (ir/ops.h). Rows are independent: a parallel loop hands
// each thread whole rows, each row's arithmetic in A = f32 (f64 for f64 x) in a fixed order, so the results do
// not depend on the thread count. A row: its max; exp(x − max) into the thread's row of the workspace, summed in
// 8 lanes combined pairwise; then each exp divided by the sum. The VJP recomputes those probabilities the same
// way (the same bits softmax had before rounding to its dtype), then dx = p·(g − Σ g·p). log_softmax: the row's
// max and Σ exp(x − max) as softmax has them, then (x − max) − log Σ; its VJP g − exp(y)·Σ g from its result y.
#include "exec/kernels/exp.h"
#include "exec/kernels/kernels.h"

#include <cmath>
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

// Σ f(j) over j in [0, w) in 8 lanes (lane l takes j ≡ l mod 8, the tail lane 0), combined pairwise.
template <class A, class F>
A lane_sum(int64_t w, F f) {
  A lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= w; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += f(j + l);
  for (; j < w; ++j) lane[0] += f(j);
  return combine(lane);
}

// p[j] = exp(x[j] − m) for the row x[0, w) in one vectorised pass; returns their sum.
template <class A, class T>
A exps(const T* x, int64_t w, A m, A* p) {
#pragma omp simd
  for (int64_t j = 0; j < w; ++j) p[j] = exp_of(static_cast<A>(load(x[j])) - m);
  return lane_sum<A>(w, [p](int64_t j) { return p[j]; });
}

// p[j] = exp(x[j] − max) / Σ exp(x[k] − max) for the row x[0, w).
template <class A, class T>
void probabilities(const T* x, int64_t w, A* p) {
  const A s = exps(x, w, row_max<A>(x, w), p);
#pragma omp simd
  for (int64_t j = 0; j < w; ++j) p[j] /= s;
}

// Rows of length w (the last dim) and the thread's row of the workspace.
int64_t row_length(const ir::Type& t) { return t.shape.back(); }
int64_t row_bytes(const ir::Type& t) { return aligned64(row_length(t) * (t.dtype == DType::f64 ? 8 : 4)); }
std::byte* row_of(std::span<std::byte> workspace, const ir::Type& t) {
  const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
  return workspace.data() + thread * row_bytes(t);
}

// Rows [lo, hi) of softmax: x (dtype xt) into y (dtype yt), through p, the thread's row of A.
void softmax_rows_body(const ir::Node& n, DType xt, DType yt, const std::byte* x_bytes,
                       std::byte* y_bytes, int64_t w, int64_t lo, int64_t hi, std::byte* p_bytes) {
  dispatch_float(xt, n, [&](auto x_type) {
    using T = decltype(x_type);
    using A = Acc<T>;
    dispatch_float(yt, n, [&](auto y_type) {
      using U = decltype(y_type);
      const T* x = reinterpret_cast<const T*>(x_bytes);
      U* y = reinterpret_cast<U*>(y_bytes);
      A* p = reinterpret_cast<A*>(p_bytes);
      for (int64_t r = lo; r < hi; ++r) {
        probabilities(x + r * w, w, p);
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) y[r * w + j] = store<U>(static_cast<Compute<U>>(p[j]));
      }
    });
  });
}

REMAT_WIDEST_CLONES(softmax_rows, softmax_rows_body)

// Rows [lo, hi) of softmax_grad: dx (dtype xt) from x (xt) and g (gt), through p, the thread's row of A.
void softmax_grad_rows_body(const ir::Node& n, DType xt, DType gt, const std::byte* x_bytes,
                            const std::byte* g_bytes, std::byte* dx_bytes, int64_t w, int64_t lo,
                            int64_t hi, std::byte* p_bytes) {
  dispatch_float(xt, n, [&](auto x_type) {
    using T = decltype(x_type);
    using A = Acc<T>;
    dispatch_float(gt, n, [&](auto g_type) {
      using G = decltype(g_type);
      const T* x = reinterpret_cast<const T*>(x_bytes);
      const G* g = reinterpret_cast<const G*>(g_bytes);
      T* dx = reinterpret_cast<T*>(dx_bytes);
      A* p = reinterpret_cast<A*>(p_bytes);
      for (int64_t r = lo; r < hi; ++r) {
        probabilities(x + r * w, w, p);
        const G* gr = g + r * w;
        const A d = lane_sum<A>(w, [&](int64_t j) { return static_cast<A>(load(gr[j])) * p[j]; });
#pragma omp simd
        for (int64_t j = 0; j < w; ++j)
          dx[r * w + j] = store<T>(static_cast<Compute<T>>(p[j] * (static_cast<A>(load(gr[j])) - d)));
      }
    });
  });
}

REMAT_WIDEST_CLONES(softmax_grad_rows, softmax_grad_rows_body)

// Rows [lo, hi) of log_softmax: x into y (both dtype xt; y may be x), through p, the thread's row of A.
void log_softmax_rows_body(const ir::Node& n, DType xt, const std::byte* x_bytes, std::byte* y_bytes,
                           int64_t w, int64_t lo, int64_t hi, std::byte* p_bytes) {
  dispatch_float(xt, n, [&](auto x_type) {
    using T = decltype(x_type);
    using A = Acc<T>;
    const T* x = reinterpret_cast<const T*>(x_bytes);
    T* y = reinterpret_cast<T*>(y_bytes);
    A* p = reinterpret_cast<A*>(p_bytes);
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * w;
      const A m = row_max<A>(xr, w);
      // The log in f64, rounded once to f32: glibc's logf differs between its FMA and plain variants (chosen per
      // CPU), the f64 log far less, and its rounding to f32 hides that. f64 rows keep f64 log's variance.
      const A log_sum = static_cast<A>(std::log(static_cast<double>(exps(xr, w, m, p))));
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) {
        const A shifted = static_cast<A>(load(xr[j])) - m;
        y[r * w + j] = store<T>(static_cast<Compute<T>>(shifted - log_sum));
      }
    }
  });
}

REMAT_WIDEST_CLONES(log_softmax_rows, log_softmax_rows_body)

// Rows [lo, hi) of log_softmax_grad: dx = g − exp(y)·Σ g (dtype yt; dx may be y).
void log_softmax_grad_rows_body(const ir::Node& n, DType yt, const std::byte* y_bytes,
                                const std::byte* g_bytes, std::byte* dx_bytes, int64_t w, int64_t lo,
                                int64_t hi) {
  dispatch_float(yt, n, [&](auto y_type) {
    using T = decltype(y_type);
    using A = Acc<T>;
    const T* y = reinterpret_cast<const T*>(y_bytes);
    const T* g = reinterpret_cast<const T*>(g_bytes);
    T* dx = reinterpret_cast<T*>(dx_bytes);
    for (int64_t r = lo; r < hi; ++r) {
      const T* gr = g + r * w;
      const A s = lane_sum<A>(w, [&](int64_t j) { return static_cast<A>(load(gr[j])); });
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) {
        const A p = exp_of(static_cast<A>(load(y[r * w + j])));
        dx[r * w + j] = store<T>(static_cast<Compute<T>>(static_cast<A>(load(gr[j])) - p * s));
      }
    }
  });
}

REMAT_WIDEST_CLONES(log_softmax_grad_rows, log_softmax_grad_rows_body)

}  // namespace

int64_t workspace_softmax(const ir::Node&, std::span<const ir::Type> in) {
  return static_cast<int64_t>(omp_get_max_threads()) * row_bytes(in[0]);
}

void kernel_softmax(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(t));  // a row per thread
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    softmax_rows(n, t.dtype, out[0].type().dtype, in[0].bytes(), out[0].bytes(), w, lo, hi, row_of(ctx.workspace, t));
  });
}

void kernel_softmax_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(t));  // a row per thread
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    softmax_grad_rows(n, t.dtype, in[1].type().dtype, in[0].bytes(), in[1].bytes(), out[0].bytes(), w, lo, hi,
                      row_of(ctx.workspace, t));
  });
}

void kernel_log_softmax(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(t));  // a row per thread
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    log_softmax_rows(n, t.dtype, in[0].bytes(), out[0].bytes(), w, lo, hi, row_of(ctx.workspace, t));
  });
}

void kernel_log_softmax_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    log_softmax_grad_rows(n, t.dtype, in[0].bytes(), in[1].bytes(), out[0].bytes(), w, lo, hi);
  });
}

}  // namespace remat::exec
