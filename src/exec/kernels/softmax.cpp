// softmax over the last axis and its VJP from the input (ir/ops.h). Rows are independent: a parallel loop hands
// each thread whole rows, each row's arithmetic in A = f32 (f64 for f64 x) in a fixed order, so the results do
// not depend on the thread count. A row: its max; exp(x − max) into the thread's row of the workspace, summed in
// the lanes of rows.h; then each exp divided by the sum. The VJP recomputes those probabilities the same
// way (the same bits softmax had before rounding to its dtype), then dx = p·(g − Σ g·p). log_softmax: the row's
// max and Σ exp(x − max) as softmax has them, then (x − max) − log Σ; its VJP g − exp(y)·Σ g from its result y.
// target_log_prob: log_softmax's value at each row's target alone and the row's statistics (max, log Σ), and its
// VJP from those statistics, one pass over the row (the composition's bits: log_softmax of x in `dtype`, picked by
// a one-hot sum; log_softmax_grad of that one-hot row; the convert back to x's dtype).
#include "exec/kernels/kernels.h"
#include "exec/kernels/rows.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace remat::exec {
namespace {

// p[j] = exp(x[j] − max) / Σ exp(x[k] − max) for the row x[0, w).
template <class A, class T>
void probabilities(const T* x, int64_t w, A* p) {
  const A s = row_exps(x, w, row_max<A>(x, w), p);
  int64_t j = 0;
  if constexpr (std::is_same_v<A, float>)
    for (; j + kRowLanes <= w; j += kRowLanes) store16(p + j, load16(p + j) / s);
  for (; j < w; ++j) p[j] /= s;
}

// A mask row's extent: the length past its last visible element, and whether every element before that is visible
// (causal attention's rows).
struct MaskRow {
  int64_t end;
  bool prefix;
};
// A masked softmax's mask (ir/ops.h): bool [S, w], row r of x reading mask row r % S, with its rows' extents and the
// scale as x's dtype holds it (the composition's mul reads a constant of that dtype). No mask: rows null.
struct Mask {
  const uint8_t* rows = nullptr;
  const MaskRow* row = nullptr;  // per mask row
  int64_t count = 0;
  double scale = 1;
};

// Row r of a masked softmax's input as the composition's select(mask, x·scale, −inf) has it, into q[0, end) (A),
// the product rounded to x's dtype T; returns end, the length past the row's last visible element (what lies
// beyond is −inf, whose exp is an exact 0: the row's sums over lanes j mod kRowLanes keep their bits without it).
template <class A, class T>
int64_t masked_row(const T* x, const Mask& mask, int64_t r, int64_t w, A* q) {
  const uint8_t* visible = mask.rows + r % mask.count * w;
  const auto [end, prefix] = mask.row[r % mask.count];
  const auto scale = static_cast<Compute<T>>(mask.scale);
  if (prefix) {
    int64_t j = 0;
    if constexpr (std::is_same_v<A, float>)
      for (; j + kRowLanes <= end; j += kRowLanes) store16(q + j, round16<T>(load16(x + j) * scale));
    for (; j < end; ++j) q[j] = static_cast<A>(load(store<T>(load(x[j]) * scale)));
    return end;
  }
#pragma omp simd
  for (int64_t j = 0; j < end; ++j)
    q[j] = visible[j] != 0 ? static_cast<A>(load(store<T>(load(x[j]) * scale))) : -std::numeric_limits<A>::infinity();
  return end;
}

// Asks the caches for row r's visible prefix: the rows' ends move with r (causal attention's), and the hardware's
// prefetchers lose the stream at each row's jump past its hidden tail.
template <class T>
void prefetch_visible(const T* x, const Mask& mask, int64_t r, int64_t w) {
  prefetch_rows(x + r * w, w, 0, 1, mask.row[r % mask.count].end);
}

// to[j] = (j < end ? p[j] : 0) / s for j in [0, w), rounded to U (to may be p).
template <class A, class U>
void store_visible(const A* p, int64_t end, int64_t w, A s, U* to) {
  int64_t j = 0;
  if constexpr (std::is_same_v<A, float>) {
    for (; j < end && j + kRowLanes <= w; j += kRowLanes) store16(to + j, (lanes_below(j, end) ? load16(p + j) : Floats16{}) / s);
    const Floats16 hidden = Floats16{} / s;  // 0 / Σ, as every hidden lane has it
    for (; j + kRowLanes <= w; j += kRowLanes) store16(to + j, hidden);
  }
  for (; j < w; ++j) to[j] = store<U>(static_cast<Compute<U>>((j < end ? p[j] : A(0)) / s));
}

// Row r's probabilities into p[0, w): masked as masked_row has it when there is a mask (the hidden tail's
// probabilities 0 / Σ: 0, or NaN as the row's sum); else probabilities().
template <class A, class T>
void row_probabilities(const T* x, const Mask& mask, int64_t r, int64_t w, A* p) {
  if (mask.rows == nullptr) return probabilities(x + r * w, w, p);
  const int64_t end = masked_row(x + r * w, mask, r, w, p);
  const A s = row_exps(p, end, row_max<A>(p, end), p);
  store_visible(p, end, w, s, p);
}

// The row x[0, w)'s max and log Σ exp(x − max) (p: the exps), as log_softmax has them. The log in f64, rounded
// once to f32: glibc's logf differs between its FMA and plain variants (chosen per CPU), the f64 log far less, and
// its rounding to f32 hides that. f64 rows keep f64 log's variance.
template <class A>
struct LogSum {
  A max, log_sum;
};
template <class A, class T>
LogSum<A> row_log_sum(const T* x, int64_t w, A* p) {
  const A m = row_max<A>(x, w);
  return {m, static_cast<A>(std::log(static_cast<double>(row_exps(x, w, m, p))))};
}

// Rows of length w (the last dim) and the thread's row of the workspace, of the arithmetic type A: f64 for f64 x,
// or for target_log_prob's f64 log-probabilities.
int64_t row_length(const ir::Type& t) { return t.shape.back(); }
bool wide(const ir::Node& n, const ir::Type& t) {
  const bool target = n.op == ir::Op::target_log_prob;
  return t.dtype == DType::f64 || (target && n.attrs.dtype("dtype") == DType::f64);
}
int64_t row_bytes(const ir::Node& n, const ir::Type& t) { return aligned64(row_length(t) * (wide(n, t) ? 8 : 4)); }
std::byte* row_of(const ir::Node& n, std::span<std::byte> workspace, const ir::Type& t) {
  const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
  return workspace.data() + thread * row_bytes(n, t);
}

// Rows [lo, hi) of softmax: x (dtype xt) into y (dtype yt), through p, the thread's row of A.
void softmax_rows_body(const ir::Node& n, DType xt, DType yt, const std::byte* x_bytes, const Mask& mask,
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
        if (mask.rows != nullptr) {  // row_probabilities(), its division at the store
          if (r + kRowsAhead < hi) prefetch_visible(x, mask, r + kRowsAhead, w);
          const int64_t end = masked_row(x + r * w, mask, r, w, p);
          store_visible(p, end, w, row_exps(p, end, row_max<A>(p, end), p), y + r * w);
          continue;
        }
        const T* xr = x + r * w;  // probabilities(), its division at the store
        store_visible(p, w, w, row_exps(xr, w, row_max<A>(xr, w), p), y + r * w);
      }
    });
  });
}

REMAT_WIDEST_CLONES(softmax_rows, softmax_rows_body)

// Rows [lo, hi) of softmax_grad: dx (dtype xt) from x (xt) and g (gt), through p, the thread's row of A. With a
// mask, dx as the VJPs of select and mul continue it: p·(g − Σ) rounded to xt where visible, +0 where hidden, times
// the scale, rounded again.
void softmax_grad_rows_body(const ir::Node& n, DType xt, DType gt, const std::byte* x_bytes,
                            const std::byte* g_bytes, const Mask& mask, std::byte* dx_bytes, int64_t w, int64_t lo,
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
      const auto scale = static_cast<Compute<T>>(mask.scale);
      for (int64_t r = lo; r < hi; ++r) {
        if (mask.rows != nullptr && r + kRowsAhead < hi) {
          prefetch_visible(x, mask, r + kRowsAhead, w);
          prefetch_visible(g, mask, r + kRowsAhead, w);
        }
        row_probabilities(x, mask, r, w, p);
        const G* gr = g + r * w;
        const auto f = [&](int64_t j) { return static_cast<A>(load(gr[j])) * p[j]; };
        A d;
        if constexpr (std::is_same_v<A, float>)
          d = row_sum<A>(w, f, [&](int64_t j0) { return load16(gr + j0) * load16(p + j0); });
        else
          d = row_sum<A>(w, f);
        if (mask.rows == nullptr) {
          int64_t j = 0;
          if constexpr (std::is_same_v<A, float>)
            for (; j + kRowLanes <= w; j += kRowLanes) store16(dx + r * w + j, load16(p + j) * (load16(gr + j) - d));
          for (; j < w; ++j) dx[r * w + j] = store<T>(static_cast<Compute<T>>(p[j] * (static_cast<A>(load(gr[j])) - d)));
          continue;
        }
        const uint8_t* visible = mask.rows + r % mask.count * w;
        const auto [end, prefix] = mask.row[r % mask.count];
        int64_t j = 0;
        if constexpr (std::is_same_v<A, float>)
          for (; prefix && j + kRowLanes <= w; j += kRowLanes) {
            const Floats16 dp = round16<T>(load16(p + j) * (load16(gr + j) - d));
            store16(dx + r * w + j, (lanes_below(j, end) ? dp : Floats16{}) * scale);
          }
        for (; j < w; ++j) {
          const T dp = store<T>(static_cast<Compute<T>>(p[j] * (static_cast<A>(load(gr[j])) - d)));
          dx[r * w + j] = store<T>((visible[j] != 0 ? load(dp) : Compute<T>(0)) * scale);
        }
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
      const auto [m, log_sum] = row_log_sum(xr, w, p);
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

// Rows [lo, hi) of target_log_prob: y[r] = (x_t − max) − log Σ exp(x − max) in A, rounded to the log-probabilities'
// dtype dt (which holds x's values: the shape rule), 0 where t is outside [0, w); stats[r] = (max, log Σ) in A, the
// VJP's residual; p: the thread's row of A.
void target_log_prob_rows_body(const ir::Node& n, DType xt, DType dt, const std::byte* x_bytes,
                               const int32_t* targets, std::byte* y_bytes, std::byte* stats_bytes, int64_t w,
                               int64_t lo, int64_t hi, std::byte* p_bytes) {
  dispatch_float(xt, n, [&](auto x_type) {
    using T = decltype(x_type);
    dispatch_float(dt, n, [&](auto d_type) {
      using D = decltype(d_type);
      using A = Acc<D>;
      const T* x = reinterpret_cast<const T*>(x_bytes);
      D* y = reinterpret_cast<D*>(y_bytes);
      A* stats = reinterpret_cast<A*>(stats_bytes);
      for (int64_t r = lo; r < hi; ++r) {
        const T* xr = x + r * w;
        const auto [m, log_sum] = row_log_sum(xr, w, reinterpret_cast<A*>(p_bytes));
        const int64_t t = targets[r];
        const A picked = t >= 0 && t < w ? (static_cast<A>(load(xr[t])) - m) - log_sum : A(0);
        y[r] = store<D>(static_cast<Compute<D>>(picked));
        stats[2 * r] = m;
        stats[2 * r + 1] = log_sum;
      }
    });
  });
}

REMAT_WIDEST_CLONES(target_log_prob_rows, target_log_prob_rows_body)

// Rows [lo, hi) of target_log_prob_grad: dx (dtype xt) from x, the targets, the forward's row statistics and g
// (dtype dt, one per row).
void target_log_prob_grad_rows_body(const ir::Node& n, DType xt, DType dt, const std::byte* x_bytes,
                                    const int32_t* targets, const std::byte* stats_bytes, const std::byte* g_bytes,
                                    std::byte* dx_bytes, int64_t w, int64_t lo, int64_t hi) {
  dispatch_float(xt, n, [&](auto x_type) {
    using T = decltype(x_type);
    dispatch_float(dt, n, [&](auto d_type) {
      using D = decltype(d_type);
      using A = Acc<D>;
      const T* x = reinterpret_cast<const T*>(x_bytes);
      const A* stats = reinterpret_cast<const A*>(stats_bytes);
      const D* g = reinterpret_cast<const D*>(g_bytes);
      T* dx = reinterpret_cast<T*>(dx_bytes);
      for (int64_t r = lo; r < hi; ++r) {
        const T* xr = x + r * w;
        const A m = stats[2 * r], log_sum = stats[2 * r + 1];
        const int64_t t = targets[r];
        const bool hit = t >= 0 && t < w;
        const A gr = hit ? static_cast<A>(load(g[r])) : A(0);
        const A s = gr + A(0);  // Σ of the one-hot row g·[j = t], as row_sum adds it to zeros (−0 becomes +0)
        int64_t j = 0;
        if constexpr (std::is_same_v<A, float>)
          for (; j + kRowLanes <= w; j += kRowLanes) {
            const Floats16 y = round16<D>((load16(xr + j) - m) - log_sum);
            // gr in lane t − j, its sign kept (+0 + gr would make a −0 cotangent +0)
            const Floats16 picked = lane_at(j, t) ? gr - Floats16{} : Floats16{};
            store16(dx + r * w + j, round16<D>(picked - exp_nonpositive(y) * s));
          }
        for (; j < w; ++j) {
          const Compute<D> y = load(store<D>(static_cast<Compute<D>>((static_cast<A>(load(xr[j])) - m) - log_sum)));
          const A p = exp_nonpositive_of(static_cast<A>(y));
          const Compute<D> d = load(store<D>(static_cast<Compute<D>>((j == t ? gr : A(0)) - p * s)));
          dx[r * w + j] = store<T>(static_cast<Compute<T>>(d));
        }
      }
    });
  });
}

REMAT_WIDEST_CLONES(target_log_prob_grad_rows, target_log_prob_grad_rows_body)

}  // namespace

// A row per thread; with a mask, then its rows' MaskRow.
int64_t workspace_softmax(const ir::Node& n, std::span<const ir::Type> in) {
  const size_t k = n.op == ir::Op::softmax ? 1 : 2;  // the mask's operand, where the op has one
  const int64_t mask_rows = in.size() > k && (n.op == ir::Op::softmax || n.op == ir::Op::softmax_grad)
                                ? in[k].shape[0] * static_cast<int64_t>(sizeof(MaskRow))
                                : 0;
  return static_cast<int64_t>(omp_get_max_threads()) * row_bytes(n, in[0]) + mask_rows;
}

namespace {

// Operand k's mask when the node has one, with the scale as x's dtype rounds it and each mask row's end and
// shape (found once a call: every row of x under that mask row shares it), kept in the workspace past the threads'
// rows.
Mask mask_of(const ir::Node& n, std::span<const Array> in, size_t k, std::span<std::byte> workspace) {
  if (in.size() <= k) return {};
  const int64_t at = omp_get_max_threads() * row_bytes(n, in[0].type()), count = in[k].type().shape[0];
  ASSERT(static_cast<int64_t>(workspace.size()) >= at + count * static_cast<int64_t>(sizeof(MaskRow)));
  MaskRow* rows = reinterpret_cast<MaskRow*>(workspace.data() + at);
  const DType xt = in[0].type().dtype;
  std::array<std::byte, 8> scale{};
  Array::set_element(xt, scale.data(), 0, n.attrs.real("scale"));  // as a constant of x's dtype holds it
  const int64_t w = in[k].type().shape[1];
  const uint8_t* visible = in[k].data<uint8_t>();
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* v = visible + i * w;
    int64_t end = w;
    while (end > 0 && v[end - 1] == 0) --end;
    rows[i] = {end, std::all_of(v, v + end, [](uint8_t b) { return b != 0; })};
  }
  return {visible, rows, count, Array::element(xt, scale.data(), 0)};
}

}  // namespace

void kernel_softmax(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(n, t));  // a row per thread
  const Mask mask = mask_of(n, in, 1, ctx.workspace);
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    softmax_rows(n, t.dtype, out[0].type().dtype, in[0].bytes(), mask, out[0].bytes(), w, lo, hi,
                 row_of(n, ctx.workspace, t));
  });
}

void kernel_softmax_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(n, t));  // a row per thread
  const Mask mask = mask_of(n, in, 2, ctx.workspace);
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    softmax_grad_rows(n, t.dtype, in[1].type().dtype, in[0].bytes(), in[1].bytes(), mask, out[0].bytes(), w, lo,
                      hi, row_of(n, ctx.workspace, t));
  });
}

void kernel_log_softmax(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(n, t));  // a row per thread
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    log_softmax_rows(n, t.dtype, in[0].bytes(), out[0].bytes(), w, lo, hi, row_of(n, ctx.workspace, t));
  });
}

void kernel_log_softmax_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    log_softmax_grad_rows(n, t.dtype, in[0].bytes(), in[1].bytes(), out[0].bytes(), w, lo, hi);
  });
}

void kernel_target_log_prob(const ir::Node& n, std::span<const Array> in, std::span<Array> out,
                            const KernelContext& ctx) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= omp_get_max_threads() * row_bytes(n, t));  // a row per thread
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    target_log_prob_rows(n, t.dtype, out[0].type().dtype, in[0].bytes(), in[1].data<int32_t>(), out[0].bytes(),
                         out[1].bytes(), w, lo, hi, row_of(n, ctx.workspace, t));
  });
}

void kernel_target_log_prob_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out,
                                 const KernelContext&) {
  const ir::Type& t = in[0].type();
  const int64_t w = row_length(t), rows = w == 0 ? 0 : t.num_elements() / w;
  parallel_ranges(rows, true, [&](int64_t lo, int64_t hi) {
    target_log_prob_grad_rows(n, t.dtype, in[3].type().dtype, in[0].bytes(), in[1].data<int32_t>(), in[2].bytes(),
                              in[3].bytes(), out[0].bytes(), w, lo, hi);
  });
}

}  // namespace remat::exec
