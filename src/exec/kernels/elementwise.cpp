// Elementwise kernels: unary and binary math, compare, select, convert. All operands have equal shapes.
#include "exec/kernels/kernels.h"

#include <cmath>
#include <cstring>

namespace remat::exec {
namespace {

template <class T, class F>
void unary_loop(const Array& x, Array& y, F f) {
  const T* a = x.data<T>();
  T* o = y.data<T>();
  const int64_t n = x.size();
  parallel_ranges(n, n >= kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) o[i] = store<T>(f(load(a[i])));
  });
}

template <class T, class F>
void binary_loop(const Array& x, const Array& y, Array& z, F f) {
  const T* a = x.data<T>();
  const T* b = y.data<T>();
  T* o = z.data<T>();
  const int64_t n = x.size();
  parallel_ranges(n, n >= kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) o[i] = store<T>(f(load(a[i]), load(b[i])));
  });
}

}  // namespace

#define FLOAT_UNARY(op, expr)                                                                       \
  void kernel_##op(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {            \
    dispatch_float(in[0].type().dtype, n, [&](auto t) {                                             \
      using T = decltype(t);                                                                        \
      using C = Compute<T>;                                                                         \
      unary_loop<T>(in[0], out[0], [](C x) -> C { return expr; });                                  \
    });                                                                                             \
  }

#define NUMERIC_BINARY(op, expr)                                                                    \
  void kernel_##op(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {            \
    dispatch_numeric(in[0].type().dtype, n, [&](auto t) {                                           \
      using T = decltype(t);                                                                        \
      using C = Compute<T>;                                                                         \
      binary_loop<T>(in[0], in[1], out[0], [](C a, C b) -> C { return expr; });                     \
    });                                                                                             \
  }

FLOAT_UNARY(exp, std::exp(x))
FLOAT_UNARY(log, std::log(x))
FLOAT_UNARY(tanh, std::tanh(x))
FLOAT_UNARY(logistic, C(1) / (C(1) + std::exp(-x)))
FLOAT_UNARY(sqrt, std::sqrt(x))
FLOAT_UNARY(rsqrt, C(1) / std::sqrt(x))
FLOAT_UNARY(sin, std::sin(x))
FLOAT_UNARY(cos, std::cos(x))
NUMERIC_BINARY(add, a + b)
NUMERIC_BINARY(sub, a - b)
NUMERIC_BINARY(mul, a * b)
NUMERIC_BINARY(max, std::isnan(static_cast<double>(a)) ? a : (a > b ? a : b))
NUMERIC_BINARY(min, std::isnan(static_cast<double>(a)) ? a : (a < b ? a : b))

#undef FLOAT_UNARY
#undef NUMERIC_BINARY

void kernel_neg(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  dispatch_numeric(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    unary_loop<T>(in[0], out[0], [](Compute<T> x) -> Compute<T> { return -x; });
  });
}

void kernel_div(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  if (in[0].type().dtype == DType::i32) {
    const int32_t* b = in[1].data<int32_t>();
    for (int64_t i = 0; i < in[1].size(); ++i) CHECK(b[i] != 0, "{}: integer division by zero", ir::op_name(n.op));
  }
  dispatch_numeric(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    binary_loop<T>(in[0], in[1], out[0], [](Compute<T> a, Compute<T> b) -> Compute<T> { return a / b; });
  });
}

void kernel_pow(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  dispatch_float(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    binary_loop<T>(in[0], in[1], out[0], [](Compute<T> a, Compute<T> b) -> Compute<T> { return std::pow(a, b); });
  });
}

void kernel_compare(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const std::string& dir = n.attrs.str("direction");
  dispatch_numeric(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    const T* a = in[0].data<T>();
    const T* b = in[1].data<T>();
    uint8_t* o = out[0].data<uint8_t>();
    const int64_t len = in[0].size();
    using C = Compute<T>;
    auto loop = [&](auto cmp) {
      parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) o[i] = cmp(load(a[i]), load(b[i]));
      });
    };
    if (dir == "eq") loop([](C x, C y) { return x == y; });
    else if (dir == "ne") loop([](C x, C y) { return x != y; });
    else if (dir == "lt") loop([](C x, C y) { return x < y; });
    else if (dir == "le") loop([](C x, C y) { return x <= y; });
    else if (dir == "gt") loop([](C x, C y) { return x > y; });
    else loop([](C x, C y) { return x >= y; });
  });
}

// AdamW for one parameter (ir/ops.h): every operation of the primitives it replaces (train/step.cpp's
// formula), in their order, each rounded to T by `r` as the primitive would store it. Element i is read
// before it is written, so p, m, v may be updated in place. A false `finite` keeps p, m, v.
void kernel_adamw(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  dispatch_float(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    using C = Compute<T>;
    auto r = [](C x) { return load(store<T>(x)); };
    auto scalar = [&](size_t k) { return r(static_cast<C>(in[k].data<float>()[0])); };  // an f32 operand, as T
    const C c = r(static_cast<C>(n.attrs.real("b1"))), c1 = r(static_cast<C>(1.0 - n.attrs.real("b1")));
    const C d = r(static_cast<C>(n.attrs.real("b2"))), d1 = r(static_cast<C>(1.0 - n.attrs.real("b2")));
    const C eps = r(static_cast<C>(n.attrs.real("eps")));
    const C scale = scalar(4), lr = scalar(5), bias1 = scalar(6), bias2 = scalar(7);
    // lr · weight_decay is a product of f32 scalars (the step computes it once, in f32), then taken as T.
    const C lr_wd = r(static_cast<C>(in[5].data<float>()[0] * static_cast<float>(n.attrs.real("weight_decay"))));
    const bool keep = in.size() < 9 || in[8].data<uint8_t>()[0] != 0;
    const T* p = in[0].data<T>();
    const T* m = in[1].data<T>();
    const T* v = in[2].data<T>();
    const T* g = in[3].data<T>();
    T* p2 = out[0].data<T>();
    T* m2 = out[1].data<T>();
    T* v2 = out[2].data<T>();
    const int64_t len = in[0].size();
    parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
      if (!keep) {  // a skipped step: the operands as they are
        for (int64_t i = lo; i < hi; ++i) p2[i] = p[i], m2[i] = m[i], v2[i] = v[i];
        return;
      }
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        const C pi = load(p[i]), gi = r(load(g[i]) * scale);
        const C mi = r(r(load(m[i]) * c) + r(gi * c1));
        const C vi = r(r(load(v[i]) * d) + r(r(gi * gi) * d1));
        const C decayed = r(pi - r(pi * lr_wd));
        const C update = r(r(mi / bias1) / r(r(std::sqrt(r(vi / bias2))) + eps));
        p2[i] = store<T>(decayed - r(update * lr));
        m2[i] = store<T>(mi);
        v2[i] = store<T>(vi);
      }
    });
  });
}

void kernel_select(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  dispatch_bits(dtype_size(in[1].type().dtype), [&](auto bits) {
    using U = decltype(bits);
    const uint8_t* p = in[0].data<uint8_t>();
    const U* a = in[1].data<U>();
    const U* b = in[2].data<U>();
    U* o = out[0].data<U>();
    const int64_t len = in[0].size();
    parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) o[i] = p[i] ? a[i] : b[i];
    });
  });
}

namespace {

void convert(const Array& x, Array& y) {
  const int64_t len = x.size();
  const DType from = x.type().dtype, to = y.type().dtype;
  if (from == to) {
    std::memcpy(y.bytes(), x.bytes(), static_cast<size_t>(x.type().bytes()));
    return;
  }
  auto typed = [&](auto from_t, auto to_t) {
    using F = decltype(from_t);
    using T = decltype(to_t);
    const F* a = x.data<F>();
    T* o = y.data<T>();
    parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) o[i] = static_cast<T>(a[i]);
    });
  };
  // The common pairs run as typed loops; the rest go through Array::get/set (bf16/f16 round to nearest even).
  if (from == DType::i32 && to == DType::f32) return typed(int32_t{}, float{});
  if (from == DType::pred && to == DType::f32) return typed(uint8_t{}, float{});
  if (from == DType::f32 && to == DType::f64) return typed(float{}, double{});
  if (from == DType::f64 && to == DType::f32) return typed(double{}, float{});
  auto rounded = [&](auto to_t) {  // f32 -> bf16/f16, rounding to nearest even
    using T = decltype(to_t);
    const float* a = x.data<float>();
    T* o = y.data<T>();
    parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) o[i] = store<T>(a[i]);
    });
  };
  auto widened = [&](auto from_t) {  // bf16/f16 -> f32, exact
    using F = decltype(from_t);
    const F* a = x.data<F>();
    float* o = y.data<float>();
    parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) o[i] = load(a[i]);
    });
  };
  if (from == DType::f32 && to == DType::bf16) return rounded(bf16_t{});
  if (from == DType::f32 && to == DType::f16) return rounded(f16_t{});
  if (from == DType::bf16 && to == DType::f32) return widened(bf16_t{});
  if (from == DType::f16 && to == DType::f32) return widened(f16_t{});
  // Float -> int truncates toward zero, as lax does.
  parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y.set(i, x.get(i));
  });
}

}  // namespace

void kernel_convert_element_type(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  convert(in[0], out[0]);
}

void kernel_convert_group(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  for (size_t i = 0; i < in.size(); ++i) convert(in[i], out[i]);
}

}  // namespace remat::exec
