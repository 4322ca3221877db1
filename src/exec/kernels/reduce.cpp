// Reductions over a set of axes. Each output element reduces its own window, so outputs run in parallel;
// sums of f32 accumulate in f64.
#include "exec/kernels/kernels.h"

#include <algorithm>
#include <array>
#include <limits>

namespace remat::exec {
namespace {

struct Plan {
  Dims kept_shape, red_shape;
  Dims kept_strides, red_strides;  // input strides of kept and reduced dims
  int64_t outputs = 1, window = 1;
  bool contiguous = false;  // the reduced dims are the trailing ones: each window is one run of memory
  bool leading = false;     // the reduced dims are the leading ones: the kept dims are one run of memory
};

Plan plan_reduction(const ir::Shape& shape, const ir::IntList& axes) {
  Plan p;
  Dims strides = strides_of(Dims(shape));
  for (size_t d = 0; d < shape.size(); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    (reduced ? p.red_shape : p.kept_shape).push_back(shape[d]);
    (reduced ? p.red_strides : p.kept_strides).push_back(strides[d]);
  }
  p.outputs = num_elements(p.kept_shape);
  p.window = num_elements(p.red_shape);
  p.contiguous = p.red_shape.empty() || (p.red_strides.back() == 1 && p.red_strides.front() * p.red_shape.front() == p.window);
  p.leading = !p.red_shape.empty() && !p.kept_shape.empty() && p.kept_strides.back() == 1 &&
              p.kept_strides.front() * p.kept_shape.front() == p.outputs && p.red_strides.back() == p.outputs &&
              p.red_strides.front() * p.red_shape.front() == p.outputs * p.window;
  return p;
}

int64_t unravel(int64_t i, const Dims& shape, const Dims& strides) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

// One contiguous window in kLanes accumulators, lane j taking elements j, j + kLanes, ..., then the lanes
// combined pairwise in a fixed order: independent chains the core runs side by side (one accumulator waits on
// each combine), and a result that depends on the window alone, not on threads. (A max over +0 and -0, or over
// NaNs of different payloads, may pick another of them than a sequential scan would.)
template <class T, class Acc, class Combine, class Pre>
Acc reduce_window(const T* x, int64_t n, Acc init, Combine combine, Pre pre) {
  constexpr int64_t kLanes = 8;
  std::array<Acc, kLanes> lane;
  lane.fill(init);
  int64_t r = 0;
  for (; r + kLanes <= n; r += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = combine(lane[j], static_cast<Acc>(pre(load(x[r + j]))));
  for (int64_t j = 0; r < n; ++r, ++j) lane[j] = combine(lane[j], static_cast<Acc>(pre(load(x[r]))));
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t j = 0; j < w; ++j) lane[j] = combine(lane[j], lane[j + w]);
  return lane[0];
}

// `pre` maps each element (in the compute type) before it is accumulated: the identity, or sum_of_squares' square
// (of the quotient by its divisor) rounded to T. Outputs [lo, hi) when x is not viewed as [window, outputs].
template <class T, class Acc, class Combine, class Pre>
void reduce_outputs(const T* a, T* o, const Plan& p, int64_t lo, int64_t hi, Acc init, Combine combine, Pre pre) {
  for (int64_t i = lo; i < hi; ++i) {
    const T* base = a + unravel(i, p.kept_shape, p.kept_strides);
    Acc acc = init;
    if (p.contiguous) {
      acc = reduce_window<T, Acc>(base, p.window, init, combine, pre);
    } else {
      for (int64_t r = 0; r < p.window; ++r)
        acc = combine(acc, static_cast<Acc>(pre(load(base[unravel(r, p.red_shape, p.red_strides)]))));
    }
    o[i] = store<T>(static_cast<Compute<T>>(acc));
  }
}

// Outputs [lo, hi) when x is viewed as [window, outputs]: their accumulators (acc, the workspace's row) take the
// rows in order, vectorised over outputs.
template <class T, class Acc, class Combine, class Pre>
void reduce_leading(const T* a, T* o, const Plan& p, Acc* acc, int64_t lo, int64_t hi, Acc init, Combine combine,
                    Pre pre) {
  std::fill(acc + lo, acc + hi, init);
  for (int64_t r = 0; r < p.window; ++r) {
    const T* row = a + r * p.outputs;
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) acc[i] = combine(acc[i], static_cast<Acc>(pre(load(row[i]))));
  }
  for (int64_t i = lo; i < hi; ++i) o[i] = store<T>(static_cast<Compute<T>>(acc[i]));
}

// Outputs [lo, hi) of the reduction n (reduce_sum, reduce_max or sum_of_squares; acc_row: the leading case's
// accumulators, one per output), at the CPU's widest vectors.
void reduce_range_body(const ir::Node& n, std::span<const Array> in, Array& y, const Plan& p, std::byte* acc_row,
                       int64_t lo, int64_t hi) {
  auto run = [&](auto t, auto init, auto combine, auto pre) {
    using T = decltype(t);
    using Acc = decltype(init);
    if (p.leading)
      return reduce_leading<T>(in[0].data<T>(), y.data<T>(), p, reinterpret_cast<Acc*>(acc_row), lo, hi, init,
                               combine, pre);
    reduce_outputs<T>(in[0].data<T>(), y.data<T>(), p, lo, hi, init, combine, pre);
  };
  if (n.op == ir::Op::reduce_max) {
    return dispatch_numeric(in[0].type().dtype, n, [&](auto t) {
      using C = Compute<decltype(t)>;
      C lowest = std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::lowest();
      run(t, lowest, [](C a, C b) { return (b > a) | (b != b) ? b : a; }, [](C x) { return x; });
    });
  }
  if (n.op == ir::Op::reduce_sum) {
    return dispatch_numeric(in[0].type().dtype, n, [&](auto t) {
      using T = decltype(t);
      using Acc = std::conditional_t<std::is_same_v<Compute<T>, float>, double, T>;  // f32, bf16, f16 sum in f64
      run(t, Acc(0), [](Acc a, Acc b) { return a + b; }, [](Compute<T> x) { return x; });
    });
  }
  // sum_of_squares: reduce_sum(mul(x, x)), the square rounded to T as mul stores it, then summed as reduce_sum
  // sums; with a divisor d (f32), of x / d in the compute type rounded to T (an f16 gradient is divided by a scale
  // f16 cannot hold).
  ASSERT(n.op == ir::Op::sum_of_squares);
  dispatch_float(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    using C = Compute<T>;
    using Acc = std::conditional_t<std::is_same_v<C, float>, double, T>;
    auto sum = [](Acc a, Acc b) { return a + b; };
    if (in.size() == 1) return run(t, Acc(0), sum, [](C x) { return load(store<T>(x * x)); });
    const C d = static_cast<C>(in[1].data<float>()[0]);
    run(t, Acc(0), sum, [d](C x) {
      const C u = load(store<T>(x / d));
      return load(store<T>(u * u));
    });
  });
}

REMAT_WIDEST_CLONES(reduce_range, reduce_range_body)

void reduce(const ir::Node& n, std::span<const Array> in, Array& y, std::span<std::byte> workspace) {
  const Plan p = plan_reduction(in[0].type().shape, n.attrs.ints("axes"));
  const std::span<const ir::Type> x_type(&in[0].type(), 1);
  std::byte* acc_row = p.leading ? take(workspace, workspace_reduction(n, x_type)) : nullptr;
  parallel_ranges(p.outputs, p.outputs * p.window >= kParallelMin,
                  [&](int64_t lo, int64_t hi) { reduce_range(n, in, y, p, acc_row, lo, hi); });
}

}  // namespace

// The accumulator row of a reduction over leading axes: reduce_sum accumulates floats in f64 (i32 in
// itself), reduce_max in the compute type (f32 for bf16 and f16).
int64_t workspace_reduction(const ir::Node& n, std::span<const ir::Type> in) {
  const Plan p = plan_reduction(in[0].shape, n.attrs.ints("axes"));
  if (!p.leading) return 0;
  const DType d = in[0].dtype;
  const int64_t acc = n.op != ir::Op::reduce_max ? (d == DType::i32 ? 4 : 8) : (d == DType::f64 ? 8 : 4);
  return p.outputs * acc;
}

void kernel_reduce_sum(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  reduce(n, in, out[0], ctx.workspace);
}

void kernel_sum_of_squares(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  reduce(n, in, out[0], ctx.workspace);
}

void kernel_reduce_max(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  reduce(n, in, out[0], ctx.workspace);
}

}  // namespace remat::exec
