// RMSNorm and its VJP (ir/ops.h) with the bits of the primitives they replace: every square, product, quotient and
// sum rounded to A (f32; f64 for f64 x) in the order the composition's ops round them, its row sums as reduce_sum
// sums a contiguous window (rows.h's reduce_window, in f64 for f32) and dw as it sums over rows (row order, in f64
// for f32). Rows are independent: a parallel loop hands each thread whole rows; dw then takes a second pass in
// which each thread owns whole columns, so no result depends on the thread count. The scale is read as A from the
// workspace (converted once a call).
#include "exec/kernels/kernels.h"
#include "exec/kernels/rows.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>

namespace remat::exec {
namespace {

// What reduce_sum accumulates an A in.
template <class A>
using Sum = std::conditional_t<std::is_same_v<A, float>, double, A>;

template <class A>
struct RowScale {
  A a, r;  // a = Σ x²/D + eps, r = 1/√a
};

// The row x[0, d)'s statistics: mean(square(x)) + eps, then rsqrt, each operation rounded to A.
template <class A, class T>
RowScale<A> row_scale(const T* x, int64_t d, double eps) {
  const A s = static_cast<A>(reduce_window<Sum<A>>(
      d, Sum<A>(0), std::plus<>(),
      [&](int64_t j) {
        const A v = static_cast<A>(load(x[j]));
        return static_cast<A>(v * v);
      },
      if_f32<A>([&](auto j0) {
        const Floats16 v = load16(x + j0);
        return v * v;
      })));
  const A a = s * static_cast<A>(1.0 / static_cast<double>(d)) + static_cast<A>(eps);
  return {a, A(1) / std::sqrt(a)};
}

// Rows [lo, hi) of y = (x·r)·w, x of dtype xt, y of yt, w [d] in A.
void rms_norm_rows_body(const ir::Node& n, DType xt, DType yt, const std::byte* x_bytes, const std::byte* w_bytes,
                        std::byte* y_bytes, int64_t d, double eps, int64_t lo, int64_t hi) {
  dispatch_float(xt, n, [&](auto x_type) {
    using T = decltype(x_type);
    using A = Acc<T>;
    dispatch_float(yt, n, [&](auto y_type) {
      using U = decltype(y_type);
      const T* x = reinterpret_cast<const T*>(x_bytes);
      const A* w = reinterpret_cast<const A*>(w_bytes);
      U* y = reinterpret_cast<U*>(y_bytes);
      for (int64_t r = lo; r < hi; ++r) {
        const T* xr = x + r * d;
        const A rs = row_scale<A>(xr, d, eps).r;
        int64_t j0 = 0;
        if constexpr (std::is_same_v<A, float>)
          for (; j0 + 16 <= d; j0 += 16) store16(y + r * d + j0, (load16(xr + j0) * rs) * load16(w + j0));
#pragma omp simd
        for (int64_t j = j0; j < d; ++j) {
          const A normalized = static_cast<A>(load(xr[j])) * rs;
          y[r * d + j] = store<U>(static_cast<Compute<U>>(normalized * w[j]));
        }
      }
    });
  });
}

REMAT_WIDEST_CLONES(rms_norm_rows, rms_norm_rows_body)

// Rows [lo, hi) of dx = (gw·r + c·x) + c·x (x and dx of dtype xt, g of gt, w in A), keeping each row's r in rs.
void rms_norm_grad_rows_body(const ir::Node& n, DType xt, DType gt, const std::byte* x_bytes,
                             const std::byte* w_bytes, const std::byte* g_bytes, std::byte* dx_bytes,
                             std::byte* rs_bytes, int64_t d, double eps, int64_t lo, int64_t hi) {
  dispatch_float(xt, n, [&](auto x_type) {
    using T = decltype(x_type);
    using A = Acc<T>;
    dispatch_float(gt, n, [&](auto g_type) {
      using G = decltype(g_type);
      const T* x = reinterpret_cast<const T*>(x_bytes);
      const A* w = reinterpret_cast<const A*>(w_bytes);
      const G* g = reinterpret_cast<const G*>(g_bytes);
      T* dx = reinterpret_cast<T*>(dx_bytes);
      A* rs = reinterpret_cast<A*>(rs_bytes);
      const A inv_d = static_cast<A>(1.0 / static_cast<double>(d));
      for (int64_t r = lo; r < hi; ++r) {
        const T* xr = x + r * d;
        const G* gr = g + r * d;
        const RowScale<A> s = row_scale<A>(xr, d, eps);
        const A gwx = static_cast<A>(reduce_window<Sum<A>>(
            d, Sum<A>(0), std::plus<>(),
            [&](int64_t j) {
              const A gw = static_cast<A>(load(gr[j])) * w[j];
              return static_cast<A>(gw * static_cast<A>(load(xr[j])));
            },
            if_f32<A>([&](auto j0) { return (load16(gr + j0) * load16(w + j0)) * load16(xr + j0); })));
        // rsqrt's VJP, (cotangent·(−½))·(r / a), then mean's (·1/D): the cotangent of each square
        const A c = gwx * A(-0.5) * (s.r / s.a) * inv_d;
        rs[r] = s.r;
        int64_t j0 = 0;
        if constexpr (std::is_same_v<A, float>)
          for (; j0 + 16 <= d; j0 += 16) {
            const Floats16 gw = load16(gr + j0) * load16(w + j0), xj = load16(xr + j0);
            store16(dx + r * d + j0, (gw * s.r + c * xj) + c * xj);
          }
#pragma omp simd
        for (int64_t j = j0; j < d; ++j) {
          const A gw = static_cast<A>(load(gr[j])) * w[j], xj = static_cast<A>(load(xr[j]));
          dx[r * d + j] = store<T>(static_cast<Compute<T>>(gw * s.r + c * xj + c * xj));  // mul(x, x)'s two terms
        }
      }
    });
  });
}

REMAT_WIDEST_CLONES(rms_norm_grad_rows, rms_norm_grad_rows_body)

// Columns [lo, hi) of dw = Σ over rows of g·(x·r), the rows in order into acc (Sum<A>, one per column); dw in A.
void rms_norm_dw_columns_body(const ir::Node& n, DType xt, DType gt, const std::byte* x_bytes,
                              const std::byte* g_bytes, const std::byte* rs_bytes, std::byte* acc_bytes,
                              int64_t rows, int64_t d, int64_t lo, int64_t hi) {
  dispatch_float(xt, n, [&](auto x_type) {
    using T = decltype(x_type);
    using A = Acc<T>;
    dispatch_float(gt, n, [&](auto g_type) {
      using G = decltype(g_type);
      const T* x = reinterpret_cast<const T*>(x_bytes);
      const G* g = reinterpret_cast<const G*>(g_bytes);
      const A* rs = reinterpret_cast<const A*>(rs_bytes);
      Sum<A>* acc = reinterpret_cast<Sum<A>*>(acc_bytes);
      std::fill(acc + lo, acc + hi, Sum<A>(0));
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * d;
        const G* gr = g + r * d;
        int64_t j0 = lo;
        if constexpr (std::is_same_v<A, float>)
          for (; j0 + 16 <= hi; j0 += 16) {
            const Floats16 v = load16(gr + j0) * (load16(xr + j0) * rs[r]);
            Doubles8 low, high;
            std::memcpy(&low, acc + j0, sizeof(low));
            std::memcpy(&high, acc + j0 + 8, sizeof(high));
            low = low + low_f64(v);
            high = high + high_f64(v);
            std::memcpy(acc + j0, &low, sizeof(low));
            std::memcpy(acc + j0 + 8, &high, sizeof(high));
          }
#pragma omp simd
        for (int64_t j = j0; j < hi; ++j) {
          const A normalized = static_cast<A>(load(xr[j])) * rs[r];
          acc[j] += static_cast<Sum<A>>(static_cast<A>(static_cast<A>(load(gr[j])) * normalized));
        }
      }
    });
  });
}

REMAT_WIDEST_CLONES(rms_norm_dw_columns, rms_norm_dw_columns_body)

int64_t acc_bytes(DType x) { return x == DType::f64 ? 8 : 4; }  // sizeof(A)

// The scale w [d] as A (f32, f64 for f64 x) into `to`; from the workspace when w is not already of that type.
const std::byte* scale_as_acc(const ir::Node& n, const Array& w, DType x, std::byte* to) {
  const DType a = x == DType::f64 ? DType::f64 : DType::f32;
  if (w.type().dtype == a) return w.bytes();
  dispatch_float(w.type().dtype, n, [&](auto w_type) {
    using W = decltype(w_type);
    const W* from = w.data<W>();
    for (int64_t j = 0; j < w.size(); ++j) {
      if (a == DType::f64) reinterpret_cast<double*>(to)[j] = static_cast<double>(load(from[j]));
      else reinterpret_cast<float*>(to)[j] = static_cast<float>(load(from[j]));
    }
  });
  return to;
}

}  // namespace

// rms_norm: the scale as A. rms_norm_grad: that, each row's r, and dw's accumulators (Sum<A>: 8 bytes).
int64_t workspace_rms_norm(const ir::Node& n, std::span<const ir::Type> in) {
  const int64_t d = in[0].shape.back(), a = acc_bytes(in[0].dtype);
  if (n.op == ir::Op::rms_norm) return d * a;
  const int64_t rows = d == 0 ? 0 : in[0].num_elements() / d;
  return aligned64(d * a) + aligned64(rows * a) + d * 8;
}

void kernel_rms_norm(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t d = t.shape.back(), rows = d == 0 ? 0 : t.num_elements() / d;
  std::span<std::byte> workspace = ctx.workspace;
  const std::byte* w = scale_as_acc(n, in[1], t.dtype, take(workspace, d * acc_bytes(t.dtype)));
  const double eps = n.attrs.real("eps");
  parallel_ranges(rows, t.num_elements() >= kParallelMin, [&](int64_t lo, int64_t hi) {
    rms_norm_rows(n, t.dtype, out[0].type().dtype, in[0].bytes(), w, out[0].bytes(), d, eps, lo, hi);
  });
}

void kernel_rms_norm_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out,
                          const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const DType gt = in[2].type().dtype;
  const int64_t d = t.shape.back(), rows = d == 0 ? 0 : t.num_elements() / d, a = acc_bytes(t.dtype);
  std::span<std::byte> workspace = ctx.workspace;
  const std::byte* w = scale_as_acc(n, in[1], t.dtype, take(workspace, aligned64(d * a)));
  std::byte* rs = take(workspace, aligned64(rows * a));
  std::byte* acc = take(workspace, d * 8);
  const double eps = n.attrs.real("eps");
  const bool parallel = t.num_elements() >= kParallelMin;
  parallel_ranges(rows, parallel, [&](int64_t lo, int64_t hi) {
    rms_norm_grad_rows(n, t.dtype, gt, in[0].bytes(), w, in[2].bytes(), out[0].bytes(), rs, d, eps, lo, hi);
  });
  parallel_ranges(d, parallel, [&](int64_t lo, int64_t hi) {
    rms_norm_dw_columns(n, t.dtype, gt, in[0].bytes(), in[2].bytes(), rs, acc, rows, d, lo, hi);
  });
  // dw rounded to A, as the composition's reduce_sum stores it, then to w's dtype
  dispatch_float(out[1].type().dtype, n, [&](auto w_type) {
    using W = decltype(w_type);
    W* dw = out[1].data<W>();
    for (int64_t j = 0; j < d; ++j) {
      const double sum = reinterpret_cast<const double*>(acc)[j];
      const double rounded = t.dtype == DType::f64 ? sum : static_cast<double>(static_cast<float>(sum));
      dw[j] = store<W>(static_cast<Compute<W>>(rounded));
    }
  });
}

}  // namespace remat::exec
