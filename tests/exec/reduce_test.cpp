// reduce_sum, reduce_max and sum_of_squares (exec/kernels/reduce.cpp) against plain loops written here, bit for
// bit, on arrays large enough (>= 2^14 elements) that the kernel splits its outputs across the OpenMP threads, at
// 1, 2 and 3 threads. The loops follow the order reduce.cpp documents: over leading axes each output takes the rows
// in order; over trailing axes each window runs in chunks of 2^16 elements, each chunk in 8 lanes (lane j takes
// elements j, j + 8, ...; the tail from lane 0 on) combined pairwise, the chunks combined in order; otherwise the
// window in row-major order. Sums accumulate in f64 (reduce_max in the compute type); sum_of_squares squares in the
// compute type and rounds the square to the dtype first. f32, bf16, f16 (in [-40, 40]: finite squares) and f64
// (whose sums show any change of order).
#include "exec/exec.h"
#include "ir/ir.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <array>
#include <cstring>
#include <limits>
#include <random>

namespace remat {
namespace {

using namespace ir;

double value(double x) { return x; }
double value(float x) { return x; }
double value(bf16_t x) { return bf16_to_float(x); }
double value(f16_t x) { return f16_to_float(x); }
// x·x as sum_of_squares stores it: in the compute type (f32 for bf16), rounded to the dtype.
double square(double x) { return x * x; }
double square(float x) { return x * x; }
double square(bf16_t x) { return bf16_to_float(float_to_bf16(bf16_to_float(x) * bf16_to_float(x))); }
double square(f16_t x) { return f16_to_float(float_to_f16(f16_to_float(x) * f16_to_float(x))); }
// An accumulator (exact in the compute type for max) stored as T: through the compute type, then rounded to T.
template <class T> T rounded(double x);
template <> double rounded<double>(double x) { return x; }
template <> float rounded<float>(double x) { return static_cast<float>(x); }
template <> bf16_t rounded<bf16_t>(double x) { return float_to_bf16(static_cast<float>(x)); }
template <> f16_t rounded<f16_t>(double x) { return float_to_f16(static_cast<float>(x)); }

enum class Kind { sum, max, squares };

// The reduction `kind` of x (shape dims, storage T) over `axes`, as the loops above describe.
template <class T>
std::vector<T> reference(Kind kind, const T* x, const std::vector<int64_t>& dims, const IntList& axes) {
  const auto reduced = [&](size_t d) { return std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end(); };
  std::vector<int64_t> kept, red, kept_stride, red_stride;
  int64_t stride = 1;
  for (size_t d = dims.size(); d-- > 0; stride *= dims[d]) {
    (reduced(d) ? red : kept).insert((reduced(d) ? red : kept).begin(), dims[d]);
    (reduced(d) ? red_stride : kept_stride).insert((reduced(d) ? red_stride : kept_stride).begin(), stride);
  }
  auto offset = [](int64_t i, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
    int64_t off = 0;
    for (size_t d = shape.size(); d-- > 0; i /= shape[d]) off += (i % shape[d]) * strides[d];
    return off;
  };
  int64_t outputs = 1, window = 1;
  for (int64_t k : kept) outputs *= k;
  for (int64_t r : red) window *= r;
  const bool trailing = !red.empty() && red_stride.back() == 1 && red_stride.front() * red.front() == window;
  // Sums accumulate in f64; a max in the compute type, which f64 holds exactly.
  auto element = [&](int64_t at) { return kind == Kind::squares ? square(x[at]) : value(x[at]); };
  auto combine = [&](double a, double b) {
    if (kind != Kind::max) return a + b;
    return b > a || b != b ? b : a;
  };
  const double init = kind == Kind::max ? -std::numeric_limits<double>::infinity() : 0.0;
  std::vector<T> out(static_cast<size_t>(outputs));
  for (int64_t i = 0; i < outputs; ++i) {
    const int64_t base = offset(i, kept, kept_stride);
    double acc = init;
    if (trailing) {
      constexpr int64_t kChunk = 65536;
      for (int64_t first = 0; first < window; first += kChunk) {
        const int64_t n = std::min(kChunk, window - first);
        std::array<double, 8> lane;
        lane.fill(init);
        for (int64_t r = 0; r < n; ++r) {
          const int64_t j = r < n / 8 * 8 ? r % 8 : r - n / 8 * 8;
          lane[static_cast<size_t>(j)] = combine(lane[static_cast<size_t>(j)], element(base + first + r));
        }
        for (size_t w = 4; w > 0; w /= 2)
          for (size_t j = 0; j < w; ++j) lane[j] = combine(lane[j], lane[j + w]);
        acc = first == 0 ? lane[0] : combine(acc, lane[0]);
      }
    } else {  // leading axes (rows in order) and the rest (row-major): the same order
      for (int64_t r = 0; r < window; ++r) acc = combine(acc, element(base + offset(r, red, red_stride)));
    }
    out[static_cast<size_t>(i)] = rounded<T>(acc);
  }
  return out;
}

template <class T>
void check(DType dtype, const std::vector<int64_t>& dims) {
  std::mt19937 rng(5);
  const double range = std::is_same_v<T, f16_t> ? 40 : 3000;  // f16 squares of 40 and their sums of 23 stay finite
  std::uniform_real_distribution<double> dist(-range, range);
  std::vector<T> x(static_cast<size_t>(dims[0] * dims[1] * dims[2]));
  for (T& v : x) v = rounded<T>(dist(rng));
  const int threads_before = omp_get_max_threads();
  // leading (one axis, two), middle, mixed, trailing, all
  for (const IntList& axes :
       {IntList{0}, IntList{0, 1}, IntList{1}, IntList{0, 2}, IntList{2}, IntList{1, 2}, IntList{0, 1, 2}}) {
    Graph g;
    Builder b(g);
    Tensor t = b.param("x", {dtype, dims});
    b.result(reduce_sum(t, axes));
    b.result(reduce_max(t, axes));
    b.result(sum_of_squares(t, axes));
    exec::Array arg(g.type(g.params[0]));
    std::memcpy(arg.bytes(), x.data(), x.size() * sizeof(T));
    const std::vector<std::vector<T>> want{reference(Kind::sum, x.data(), dims, axes),
                                           reference(Kind::max, x.data(), dims, axes),
                                           reference(Kind::squares, x.data(), dims, axes)};
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const std::vector<exec::Array> out = exec::run(g, std::span(&arg, 1));
      for (size_t k = 0; k < want.size(); ++k) {
        int64_t differ = 0, first = -1;
        for (size_t i = 0; i < want[k].size(); ++i)
          if (std::memcmp(&out[k].data<T>()[i], &want[k][i], sizeof(T)) != 0) differ += 1, first = first < 0 ? static_cast<int64_t>(i) : first;
        EXPECT_EQ(differ, 0) << dtype_name(dtype) << " " << std::array{"reduce_sum", "reduce_max", "sum_of_squares"}[k]
                             << " over axes " << shape_str(axes) << " at " << threads << " threads: first at output "
                             << first;
      }
    }
  }
  omp_set_num_threads(threads_before);
}

template <class T>
void check(DType dtype) {
  check<T>(dtype, {37, 29, 23});  // 24679 elements: odd sizes, every split of outputs uneven
  check<T>(dtype, {2, 3, 70001});  // trailing windows of 1 to 7 chunks, the last one short; a whole-tensor sum
}

TEST(Reduce, EqualsPlainLoopsBitForBitAtOneTwoAndThreeThreads) {
  check<float>(DType::f32);
  check<bf16_t>(DType::bf16);
  check<f16_t>(DType::f16);
  check<double>(DType::f64);  // f64 sums round only in f64: the order of every addition shows
}

}  // namespace
}  // namespace remat
