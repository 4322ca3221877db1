// Reductions over a set of axes. Each output element reduces its own window, so outputs run in parallel;
// sums of f32 accumulate in f64. A contiguous window longer than kChunk is reduced chunk by chunk, the chunks'
// results combined in order: the result depends on the window alone, and the threads share the chunks (a
// whole-tensor sum, the global norm's sum_of_squares, has one output).
#include "exec/kernels/kernels.h"
#include "exec/kernels/rows.h"

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
  // Not contiguous, the reduced dims one block of consecutive dims (kept dims after it): x is [outer, window,
  // inner] and each output (o, j) takes the rows x[o, r, j] in order. 0: not so.
  int64_t inner = 0;
};

Plan plan_reduction(const ir::Shape& shape, const ir::IntList& axes) {
  Plan p;
  Dims strides = strides_of(Dims(shape));
  int64_t first = -1, last = -1;  // the first and last reduced dims
  for (size_t d = 0; d < shape.size(); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    (reduced ? p.red_shape : p.kept_shape).push_back(shape[d]);
    (reduced ? p.red_strides : p.kept_strides).push_back(strides[d]);
    if (reduced) last = static_cast<int64_t>(d), first = first < 0 ? last : first;
  }
  p.outputs = num_elements(p.kept_shape);
  p.window = num_elements(p.red_shape);
  p.contiguous = p.red_shape.empty() || (p.red_strides.back() == 1 && p.red_strides.front() * p.red_shape.front() == p.window);
  if (!p.contiguous && first >= 0 && last - first + 1 == static_cast<int64_t>(p.red_shape.size()))
    p.inner = strides[static_cast<size_t>(last)];
  return p;
}

constexpr int64_t kChunk = int64_t{1} << 16;  // elements

// How many chunks each window is reduced in (1: whole, by one thread).
int64_t chunks_of(const Plan& p) { return p.contiguous && p.window > kChunk ? (p.window + kChunk - 1) / kChunk : 1; }

int64_t unravel(int64_t i, const Dims& shape, const Dims& strides) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

// `pre` maps each element (in the compute type) before it is accumulated: the identity, or sum_of_squares' square
// (of the quotient by its divisor) rounded to T; `pre16` (sums in f64 of values computed in f32; else nullptr) the
// same of 16 elements in f32 lanes, for reduce_window's vectors: for narrower floats than f32 alone (an f32 window
// as blocks of 8 ran at 57 GB/s, as vectors of 16 at 40: GCC 12 widens 8 floats to f64 in two halves). The
// elements are of type X: T, or (sum_of_squares' `dtype`) a narrower float that T holds exactly.
template <class X, class Acc, class Combine, class Pre, class Pre16>
Acc reduce_contiguous(const X* base, int64_t window, Acc init, Combine combine, Pre pre, Pre16 pre16) {
  const auto f = [&](int64_t r) { return pre(load(base[r])); };
  if constexpr (std::is_same_v<Acc, double> && std::is_same_v<Compute<X>, float> && !std::is_same_v<X, float> &&
                !std::is_null_pointer_v<Pre16>)
    return reduce_window<Acc>(window, init, combine, f, [&](int64_t j0) { return pre16(load16(base + j0)); });
  else
    return reduce_window<Acc>(window, init, combine, f);
}

// Outputs [lo, hi) when x is not viewed as [window, outputs].
template <class X, class T, class Acc, class Combine, class Pre, class Pre16>
void reduce_outputs(const X* a, T* o, const Plan& p, int64_t lo, int64_t hi, Acc init, Combine combine, Pre pre,
                    Pre16 pre16) {
  for (int64_t i = lo; i < hi; ++i) {
    const X* base = a + unravel(i, p.kept_shape, p.kept_strides);
    Acc acc = init;
    if (p.contiguous) {
      acc = reduce_contiguous(base, p.window, init, combine, pre, pre16);
    } else {
      for (int64_t r = 0; r < p.window; ++r)
        acc = combine(acc, static_cast<Acc>(pre(load(base[unravel(r, p.red_shape, p.red_strides)]))));
    }
    o[i] = store<T>(static_cast<Compute<T>>(acc));
  }
}

// Outputs [lo, hi) when x is viewed as [outer, window, inner] (Plan::inner): their accumulators (acc, the
// workspace's row) take the rows in order, vectorised along inner.
template <class X, class T, class Acc, class Combine, class Pre>
void reduce_rows(const X* a, T* o, const Plan& p, Acc* acc, int64_t lo, int64_t hi, Acc init, Combine combine,
                 Pre pre) {
  std::fill(acc + lo, acc + hi, init);
  for (int64_t i = lo; i < hi;) {  // one run of outputs of one outer index at a time
    const int64_t j0 = i % p.inner, n = std::min(p.inner - j0, hi - i);
    const X* block = a + i / p.inner * p.window * p.inner + j0;
    Acc* run = acc + i;
    for (int64_t r = 0; r < p.window; ++r) {
      const X* row = block + r * p.inner;
      if (r + kRowsAhead < p.window) prefetch_rows(row, p.inner, kRowsAhead, kRowsAhead + 1, n);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) run[j] = combine(run[j], static_cast<Acc>(pre(load(row[j]))));
    }
    i += n;
  }
  for (int64_t i = lo; i < hi; ++i) o[i] = store<T>(static_cast<Compute<T>>(acc[i]));
}

// Windows in chunks (chunks_of): the chunks [lo, hi) of all outputs' windows (chunk c of output i is lo = i ·
// chunks + c) into `partial`, then each output's chunks combined in order.
template <class X, class Acc, class Combine, class Pre, class Pre16>
void reduce_chunks(const X* a, const Plan& p, Acc* partial, int64_t lo, int64_t hi, Acc init, Combine combine,
                   Pre pre, Pre16 pre16) {
  const int64_t chunks = chunks_of(p);
  for (int64_t k = lo; k < hi; ++k) {
    const int64_t c = k % chunks, first = c * kChunk;
    const X* base = a + unravel(k / chunks, p.kept_shape, p.kept_strides) + first;
    partial[k] = reduce_contiguous(base, std::min(kChunk, p.window - first), init, combine, pre, pre16);
  }
}
template <class T, class Acc, class Combine>
void combine_chunks(const Acc* partial, T* o, const Plan& p, Combine combine) {
  const int64_t chunks = chunks_of(p);
  for (int64_t i = 0; i < p.outputs; ++i) {
    Acc acc = partial[i * chunks];
    for (int64_t c = 1; c < chunks; ++c) acc = combine(acc, partial[i * chunks + c]);
    o[i] = store<T>(static_cast<Compute<T>>(acc));
  }
}

// What a call of reduce_range computes: outputs [lo, hi), or with chunked windows, chunks [lo, hi) or (the
// whole range) the outputs from their chunks.
enum class Stage { outputs, chunks, combine };

// Stage `stage` of the reduction n (reduce_sum, reduce_max or sum_of_squares; acc_row: reduce_rows'
// accumulators, one per output, or the chunks' results) over [lo, hi), at the CPU's widest vectors.
void reduce_range_body(const ir::Node& n, std::span<const Array> in, Array& y, const Plan& p, std::byte* acc_row,
                       Stage stage, int64_t lo, int64_t hi) {
  // x's element type, the result's; pre16: pre of 16 f32 lanes, where reduce_contiguous takes it
  auto run = [&](auto x, auto t, auto init, auto combine, auto pre, auto pre16) {
    using X = decltype(x);
    using T = decltype(t);
    using Acc = decltype(init);
    if (stage == Stage::chunks)
      return reduce_chunks(in[0].data<X>(), p, reinterpret_cast<Acc*>(acc_row), lo, hi, init, combine, pre, pre16);
    if (stage == Stage::combine) return combine_chunks(reinterpret_cast<const Acc*>(acc_row), y.data<T>(), p, combine);
    if (p.inner > 0)
      return reduce_rows(in[0].data<X>(), y.data<T>(), p, reinterpret_cast<Acc*>(acc_row), lo, hi, init, combine, pre);
    reduce_outputs(in[0].data<X>(), y.data<T>(), p, lo, hi, init, combine, pre, pre16);
  };
  if (n.op == ir::Op::reduce_max) {
    return dispatch_numeric(in[0].type().dtype, n, [&](auto t) {
      using C = Compute<decltype(t)>;
      C lowest = std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::lowest();
      run(t, t, lowest, [](C a, C b) { return (b > a) | (b != b) ? b : a; }, [](C x) { return x; }, nullptr);
    });
  }
  if (n.op == ir::Op::reduce_sum) {
    return dispatch_numeric(in[0].type().dtype, n, [&](auto t) {
      using T = decltype(t);
      using Acc = std::conditional_t<std::is_same_v<Compute<T>, float>, double, T>;  // f32, bf16, f16 sum in f64
      run(t, t, Acc(0), [](Acc a, Acc b) { return a + b; }, [](Compute<T> x) { return x; },
          [](const Floats16& v) { return v; });
    });
  }
  // sum_of_squares: reduce_sum(mul(x, x)), the square rounded to T as mul stores it, then summed as reduce_sum
  // sums; with a divisor d (f32), of x / d in the compute type rounded to T (an f16 gradient is divided by a scale
  // f16 cannot hold). T is the result's type: x's, or its `dtype`, into which each element widens exactly on load.
  ASSERT(n.op == ir::Op::sum_of_squares);
  dispatch_float(y.type().dtype, n, [&](auto t) {
    using T = decltype(t);
    using C = Compute<T>;
    using Acc = std::conditional_t<std::is_same_v<C, float>, double, T>;
    auto sum = [](Acc a, Acc b) { return a + b; };
    auto squares = [&](auto x) {
      // the squares of 16 lanes, where they are squared in f32 (a square in f64 is not one in f32)
      if (in.size() == 1)
        return run(x, t, Acc(0), sum, [](C v) { return load(store<T>(v * v)); },
                   if_f32<C>([](const auto& v) { return round16<T>(v * v); }));
      const C d = static_cast<C>(in[1].data<float>()[0]);
      run(x, t, Acc(0), sum, [d](C v) {
        const C u = load(store<T>(v / d));
        return load(store<T>(u * u));
      }, if_f32<C>([d](const auto& v) {
        const auto u = round16<T>(v / d);
        return round16<T>(u * u);
      }));
    };
    dispatch_widened<T>(in[0].type().dtype, n, squares);
  });
}

REMAT_WIDEST_CLONES(reduce_range, reduce_range_body)

void reduce(const ir::Node& n, std::span<const Array> in, Array& y, std::span<std::byte> workspace) {
  const Plan p = plan_reduction(in[0].type().shape, n.attrs.ints("axes"));
  const std::span<const ir::Type> x_type(&in[0].type(), 1);
  const int64_t bytes = workspace_reduction(n, x_type);
  std::byte* acc_row = bytes > 0 ? take(workspace, bytes) : nullptr;
  if (const int64_t chunks = chunks_of(p); chunks > 1) {
    parallel_ranges(p.outputs * chunks, true,
                    [&](int64_t lo, int64_t hi) { reduce_range(n, in, y, p, acc_row, Stage::chunks, lo, hi); });
    return reduce_range(n, in, y, p, acc_row, Stage::combine, int64_t{0}, p.outputs);
  }
  parallel_ranges(p.outputs, p.outputs * p.window >= kParallelMin,
                  [&](int64_t lo, int64_t hi) { reduce_range(n, in, y, p, acc_row, Stage::outputs, lo, hi); });
}

}  // namespace

// The accumulators of a reduction over a block of axes with kept ones after it (reduce_rows), or the results of chunked windows' chunks: reduce_sum
// accumulates floats in f64 (i32 in itself), reduce_max in the compute type (f32 for bf16 and f16).
int64_t workspace_reduction(const ir::Node& n, std::span<const ir::Type> in) {
  const Plan p = plan_reduction(in[0].shape, n.attrs.ints("axes"));
  const DType d = in[0].dtype;
  const int64_t acc = n.op != ir::Op::reduce_max ? (d == DType::i32 ? 4 : 8) : (d == DType::f64 ? 8 : 4);
  if (p.inner > 0) return p.outputs * acc;
  return chunks_of(p) > 1 ? p.outputs * chunks_of(p) * acc : 0;
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
