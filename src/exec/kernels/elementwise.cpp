// Elementwise kernels: unary and binary math, compare, select, convert. All operands have equal shapes.
// Each op is one loop over a range of elements (elementwise_range); a kernel runs it over each thread's part
// of its arrays and the fusion kernel over each tile of its body: one loop per op, so fused and unfused steps
// compute the same bits.
#include "exec/kernels/exp.h"
#include "exec/kernels/kernels.h"

#include <cmath>
#include <cstring>

namespace remat::exec {
namespace {

template <class T>
const T* as(const std::byte* p) { return reinterpret_cast<const T*>(p); }
template <class T>
T* as(std::byte* p) { return reinterpret_cast<T*>(p); }

template <class T, class F>
void unary(const std::byte* x, std::byte* y, int64_t len, F f) {
  const T* a = as<T>(x);
  T* o = as<T>(y);
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) o[i] = store<T>(f(load(a[i])));
}

template <class T, class F>
void binary(const std::byte* x, const std::byte* y, std::byte* z, int64_t len, F f) {
  const T* a = as<T>(x);
  const T* b = as<T>(y);
  T* o = as<T>(z);
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) o[i] = store<T>(f(load(a[i]), load(b[i])));
}

template <class T, class F>
void comparison(const std::byte* x, const std::byte* y, std::byte* z, int64_t len, F f) {
  const T* a = as<T>(x);
  const T* b = as<T>(y);
  uint8_t* o = as<uint8_t>(z);
  for (int64_t i = 0; i < len; ++i) o[i] = f(load(a[i]), load(b[i]));
}

void compare(const ir::Node& n, DType d, const std::byte* x, const std::byte* y, std::byte* z, int64_t len) {
  const std::string& dir = n.attrs.str("direction");
  dispatch_numeric(d, n, [&](auto t) {
    using T = decltype(t);
    using C = Compute<T>;
    if (dir == "eq") comparison<T>(x, y, z, len, [](C a, C b) { return a == b; });
    else if (dir == "ne") comparison<T>(x, y, z, len, [](C a, C b) { return a != b; });
    else if (dir == "lt") comparison<T>(x, y, z, len, [](C a, C b) { return a < b; });
    else if (dir == "le") comparison<T>(x, y, z, len, [](C a, C b) { return a <= b; });
    else if (dir == "gt") comparison<T>(x, y, z, len, [](C a, C b) { return a > b; });
    else comparison<T>(x, y, z, len, [](C a, C b) { return a >= b; });
  });
}

void select(DType d, const std::byte* pred, const std::byte* x, const std::byte* y, std::byte* z, int64_t len) {
  dispatch_bits(dtype_size(d), [&](auto bits) {
    using U = decltype(bits);
    const uint8_t* p = as<uint8_t>(pred);
    const U* a = as<U>(x);
    const U* b = as<U>(y);
    U* o = as<U>(z);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) o[i] = p[i] ? a[i] : b[i];
  });
}

template <class F, class T>
void cast(const std::byte* x, std::byte* y, int64_t len) {
  const F* a = as<F>(x);
  T* o = as<T>(y);
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) o[i] = static_cast<T>(a[i]);
}

void convert(DType from, DType to, const std::byte* x, std::byte* y, int64_t len) {
  if (from == to) {
    std::memcpy(y, x, static_cast<size_t>(len * dtype_size(from)));
    return;
  }
  // The common pairs run as typed loops; the rest go element by element through a double (bf16/f16 round to
  // nearest even, float -> int truncates toward zero, as lax does).
  if (from == DType::i32 && to == DType::f32) return cast<int32_t, float>(x, y, len);
  if (from == DType::pred && to == DType::f32) return cast<uint8_t, float>(x, y, len);
  if (from == DType::f32 && to == DType::f64) return cast<float, double>(x, y, len);
  if (from == DType::f64 && to == DType::f32) return cast<double, float>(x, y, len);
  auto rounded = [&](auto to_t) {  // f32 -> bf16/f16, rounding to nearest even
    using T = decltype(to_t);
    const float* a = as<float>(x);
    T* o = as<T>(y);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) o[i] = store<T>(a[i]);
  };
  auto widened = [&](auto from_t) {  // bf16/f16 -> f32, exact
    using F = decltype(from_t);
    const F* a = as<F>(x);
    float* o = as<float>(y);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) o[i] = load(a[i]);
  };
  if (from == DType::f32 && to == DType::bf16) return rounded(bf16_t{});
  if (from == DType::f32 && to == DType::f16) return rounded(f16_t{});
  if (from == DType::bf16 && to == DType::f32) return widened(bf16_t{});
  if (from == DType::f16 && to == DType::f32) return widened(f16_t{});
  for (int64_t i = 0; i < len; ++i) Array::set_element(to, y, i, Array::element(from, x, i));
}

// convert at the CPU's widest vectors, for convert_elements (elementwise_range inlines convert itself).
void convert_widest_body(DType from, DType to, const std::byte* x, std::byte* y, int64_t len) {
  convert(from, to, x, y, len);
}

REMAT_WIDEST_CLONES(convert_widest, convert_widest_body)

void elementwise_range_body(const ir::Node& n, DType operand, DType result, std::span<const std::byte* const> in,
                            std::byte* out, int64_t len) {
  auto float_unary = [&](auto f) {
    dispatch_float(operand, n, [&](auto t) { unary<decltype(t)>(in[0], out, len, f); });
  };
  auto numeric_unary = [&](auto f) {
    dispatch_numeric(operand, n, [&](auto t) { unary<decltype(t)>(in[0], out, len, f); });
  };
  auto float_binary = [&](auto f) {
    dispatch_float(operand, n, [&](auto t) { binary<decltype(t)>(in[0], in[1], out, len, f); });
  };
  auto numeric_binary = [&](auto f) {
    dispatch_numeric(operand, n, [&](auto t) { binary<decltype(t)>(in[0], in[1], out, len, f); });
  };
  // `C` is the type the arithmetic runs in (Compute<T>): generic lambdas take it from their argument.
  switch (n.op) {
    case ir::Op::exp: return float_unary([](auto x) -> decltype(x) { return exp_of(x); });
    case ir::Op::log: return float_unary([](auto x) -> decltype(x) { return std::log(x); });
    case ir::Op::tanh: return float_unary([](auto x) -> decltype(x) { return std::tanh(x); });
    case ir::Op::logistic:  // a NaN as it came: GCC may fold 1 + exp(−x)'s NaN into 1 − x's (another sign) in one
                            // clone's loop and not in another's
      return float_unary([](auto x) -> decltype(x) {
        using C = decltype(x);
        return x != x ? x : C(1) / (C(1) + exp_of(-x));
      });
    case ir::Op::sqrt: return float_unary([](auto x) -> decltype(x) { return std::sqrt(x); });
    case ir::Op::rsqrt: return float_unary([](auto x) -> decltype(x) { return decltype(x)(1) / std::sqrt(x); });
    case ir::Op::sin: return float_unary([](auto x) -> decltype(x) { return std::sin(x); });
    case ir::Op::cos: return float_unary([](auto x) -> decltype(x) { return std::cos(x); });
    case ir::Op::neg: return numeric_unary([](auto x) -> decltype(x) { return -x; });
    case ir::Op::add: return numeric_binary([](auto a, decltype(a) b) -> decltype(a) { return a + b; });
    case ir::Op::sub: return numeric_binary([](auto a, decltype(a) b) -> decltype(a) { return a - b; });
    case ir::Op::mul: return numeric_binary([](auto a, decltype(a) b) -> decltype(a) { return a * b; });
    case ir::Op::div: return numeric_binary([](auto a, decltype(a) b) -> decltype(a) { return a / b; });
    case ir::Op::max:
      return numeric_binary([](auto a, decltype(a) b) -> decltype(a) { return std::isnan(static_cast<double>(a)) ? a : (a > b ? a : b); });
    case ir::Op::min:
      return numeric_binary([](auto a, decltype(a) b) -> decltype(a) { return std::isnan(static_cast<double>(a)) ? a : (a < b ? a : b); });
    case ir::Op::pow: return float_binary([](auto a, decltype(a) b) -> decltype(a) { return std::pow(a, b); });
    case ir::Op::compare: return compare(n, operand, in[0], in[1], out, len);
    case ir::Op::select: return select(operand, in[0], in[1], in[2], out, len);
    case ir::Op::convert_element_type: return convert(operand, result, in[0], out, len);
    default: ASSERT(false);
  }
}

REMAT_WIDEST_CLONES(elementwise_range_cloned, elementwise_range_body)

}  // namespace

void elementwise_range(const ir::Node& n, DType operand, DType result, std::span<const std::byte* const> in,
                       std::byte* out, int64_t len) {
  elementwise_range_cloned(n, operand, result, in, out, len);
}

void convert_elements(DType from, DType to, const std::byte* x, std::byte* y, int64_t len) {
  convert_widest(from, to, x, y, len);
}

namespace {

// Runs `n` over all of `in` into `out`, each thread over its part.
void run_elementwise(const ir::Node& n, std::span<const Array> in, const Array& out) {
  const DType operand = in[n.op == ir::Op::select ? 1 : 0].type().dtype;
  const int64_t len = out.size();
  parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
    std::array<const std::byte*, 3> at{};
    for (size_t k = 0; k < in.size(); ++k) at[k] = in[k].bytes() + lo * dtype_size(in[k].type().dtype);
    elementwise_range(n, operand, out.type().dtype, std::span(at.data(), in.size()),
                      out.bytes() + lo * dtype_size(out.type().dtype), hi - lo);
  });
}

}  // namespace

#define ELEMENTWISE_KERNEL(op)                                                                              \
  void kernel_##op(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) { \
    run_elementwise(n, in, out[0]);                                                                         \
  }
ELEMENTWISE_KERNEL(exp)
ELEMENTWISE_KERNEL(log)
ELEMENTWISE_KERNEL(tanh)
ELEMENTWISE_KERNEL(logistic)
ELEMENTWISE_KERNEL(sqrt)
ELEMENTWISE_KERNEL(rsqrt)
ELEMENTWISE_KERNEL(sin)
ELEMENTWISE_KERNEL(cos)
ELEMENTWISE_KERNEL(neg)
ELEMENTWISE_KERNEL(add)
ELEMENTWISE_KERNEL(sub)
ELEMENTWISE_KERNEL(mul)
ELEMENTWISE_KERNEL(max)
ELEMENTWISE_KERNEL(min)
ELEMENTWISE_KERNEL(pow)
ELEMENTWISE_KERNEL(compare)
ELEMENTWISE_KERNEL(select)
ELEMENTWISE_KERNEL(convert_element_type)
#undef ELEMENTWISE_KERNEL

void kernel_div(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  if (in[0].type().dtype == DType::i32) {
    const int32_t* b = in[1].data<int32_t>();
    for (int64_t i = 0; i < in[1].size(); ++i) CHECK(b[i] != 0, "{}: integer division by zero", ir::op_name(n.op));
  }
  run_elementwise(n, in, out[0]);
}

void kernel_convert_group(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  for (size_t i = 0; i < in.size(); ++i) {
    const int64_t len = in[i].size();
    parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
      convert_elements(in[i].type().dtype, out[i].type().dtype, in[i].bytes() + lo * dtype_size(in[i].type().dtype),
                       out[i].bytes() + lo * dtype_size(out[i].type().dtype), hi - lo);
    });
  }
}

namespace {

// AdamW for one parameter (ir/ops.h) over elements [lo, hi): every operation of the primitives it replaces
// (train/step.cpp's formula, the loss scale's division first), in their order, each rounded to T by `r` as the
// primitive would store it. Element i is read before it is written, so p, m, v may be updated in place. A false
// `finite` keeps p, m, v. g is of T or of a narrower float, widened exactly on load.
void adamw_range_body(const ir::Node& n, std::span<const Array> in, std::span<Array> out, int64_t lo,
                      int64_t hi) {
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
    const bool unscale = in.size() == 10;
    const C loss_scale = unscale ? static_cast<C>(in[9].data<float>()[0]) : C(1);
    const T* p = in[0].data<T>();
    const T* m = in[1].data<T>();
    const T* v = in[2].data<T>();
    T* p2 = out[0].data<T>();
    T* m2 = out[1].data<T>();
    T* v2 = out[2].data<T>();
    if (!keep) {  // a skipped step: the operands as they are
      for (int64_t i = lo; i < hi; ++i) p2[i] = p[i], m2[i] = m[i], v2[i] = v[i];
      return;
    }
    auto update = [&](const auto* g) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        const C pi = load(p[i]), gl = static_cast<C>(load(g[i])), gi = r((unscale ? r(gl / loss_scale) : gl) * scale);
        const C mi = r(r(load(m[i]) * c) + r(gi * c1));
        const C vi = r(r(load(v[i]) * d) + r(r(gi * gi) * d1));
        const C decayed = r(pi - r(pi * lr_wd));
        const C step = r(r(mi / bias1) / r(r(std::sqrt(r(vi / bias2))) + eps));
        p2[i] = store<T>(decayed - r(step * lr));
        m2[i] = store<T>(mi);
        v2[i] = store<T>(vi);
      }
    };
    dispatch_widened<T>(in[3].type().dtype, n, [&](auto g_type) { update(in[3].data<decltype(g_type)>()); });
  });
}

REMAT_WIDEST_CLONES(adamw_range, adamw_range_body)

}  // namespace

void kernel_adamw(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const int64_t len = in[0].size();
  parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) { adamw_range(n, in, out, lo, hi); });
}

}  // namespace remat::exec
