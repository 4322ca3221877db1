// softmax over the last axis and its VJP from the input (ir/ops.h). Rows are independent: a parallel loop hands
// each thread whole rows, each row's arithmetic in A = f32 (f64 for f64 x) in a fixed order, so the results do
// not depend on the thread count. A row: its max; exp(x − max) into the thread's row of the workspace, summed in
// the lanes of rows.h; then each exp divided by the sum. The VJP recomputes those probabilities the same
// way (the same bits softmax had before rounding to its dtype), then dx = p·(g − Σ g·p). log_softmax: the row's
// max and Σ exp(x − max) as softmax has them, then (x − max) − log Σ; its VJP g − exp(y)·Σ g from its result y.
#include "exec/kernels/kernels.h"
#include "exec/kernels/rows.h"

#include <cmath>

namespace remat::exec {
namespace {

// p[j] = exp(x[j] − max) / Σ exp(x[k] − max) for the row x[0, w).
template <class A, class T>
void probabilities(const T* x, int64_t w, A* p) {
  const A s = row_exps(x, w, row_max<A>(x, w), p);
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
      for (int64_t r = lo; r < hi; ++r) {  // probabilities(), its division at the store
        const T* xr = x + r * w;
        const A s = row_exps(xr, w, row_max<A>(xr, w), p);
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) y[r * w + j] = store<U>(static_cast<Compute<U>>(p[j] / s));
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
        const A d = row_sum<A>(w, [&](int64_t j) { return static_cast<A>(load(gr[j])) * p[j]; });
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
      const A log_sum = static_cast<A>(std::log(static_cast<double>(row_exps(xr, w, m, p))));
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
      const A s = row_sum<A>(w, [&](int64_t j) { return static_cast<A>(load(gr[j])); });
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) {
        const A p = exp_nonpositive_of(static_cast<A>(load(y[r * w + j])));  // y: a log-probability
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
