// SwiGLU's product and its VJP (ir/ops.h) with the bits of the primitives they replace: logistic as the
// elementwise kernel computes it (exp.h's logistic_of), and every product, difference and sum rounded to the
// operands' type in the order the composition's ops (and autodiff's VJPs of mul and logistic) round them. One pass
// over the elements, nothing stored between: the forward reads gate and up and writes the product; the backward
// reads gate, up and the cotangent, recomputes the logistic, and writes both cotangents. Element i of every operand
// is read before element i of a result is written, so a result may be written over gate (in place).
#include "exec/kernels/exp.h"
#include "exec/kernels/kernels.h"

namespace remat::exec {
namespace {

// Elements [lo, hi) of h = (gate·logistic(gate))·up, all of dtype dt.
void swiglu_range_body(const ir::Node& n, DType dt, const std::byte* gate_bytes, const std::byte* up_bytes,
                       std::byte* h_bytes, int64_t lo, int64_t hi) {
  dispatch_float(dt, n, [&](auto type) {
    using T = decltype(type);
    using C = Compute<T>;
    const T* gate = reinterpret_cast<const T*>(gate_bytes);
    const T* up = reinterpret_cast<const T*>(up_bytes);
    T* h = reinterpret_cast<T*>(h_bytes);
    auto rounded = [](C v) { return load(store<T>(v)); };  // a value as its op stores it
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const C x = load(gate[i]);
      const C silu = rounded(x * rounded(logistic_of(x)));
      h[i] = store<T>(silu * load(up[i]));
    }
  });
}

REMAT_WIDEST_CLONES(swiglu_range, swiglu_range_body)

// Elements [lo, hi) of dgate and dup from gate, up and the cotangent g, all of dtype dt.
void swiglu_grad_range_body(const ir::Node& n, DType dt, const std::byte* gate_bytes, const std::byte* up_bytes,
                            const std::byte* g_bytes, std::byte* dgate_bytes, std::byte* dup_bytes, int64_t lo,
                            int64_t hi) {
  dispatch_float(dt, n, [&](auto type) {
    using T = decltype(type);
    using C = Compute<T>;
    const T* gate = reinterpret_cast<const T*>(gate_bytes);
    const T* up = reinterpret_cast<const T*>(up_bytes);
    const T* g = reinterpret_cast<const T*>(g_bytes);
    T* dgate = reinterpret_cast<T*>(dgate_bytes);
    T* dup = reinterpret_cast<T*>(dup_bytes);
    auto rounded = [](C v) { return load(store<T>(v)); };
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const C x = load(gate[i]), u = load(up[i]), gi = load(g[i]);
      const C s = rounded(logistic_of(x));
      const C t = rounded(gi * u);  // silu's cotangent (mul's VJP: the cotangent times the other operand)
      const C direct = rounded(t * s);  // through silu = x·s's first operand
      const C ds = rounded(t * x);      // through its second, s
      const C slope = rounded(s * rounded(C(1) - s));  // logistic's VJP: ds·(s·(1 − s))
      dgate[i] = store<T>(direct + rounded(ds * slope));
      dup[i] = store<T>(gi * rounded(x * s));
    }
  });
}

REMAT_WIDEST_CLONES(swiglu_grad_range, swiglu_grad_range_body)

}  // namespace

void kernel_swiglu(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const int64_t len = out[0].size();
  parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
    swiglu_range(n, out[0].type().dtype, in[0].bytes(), in[1].bytes(), out[0].bytes(), lo, hi);
  });
}

void kernel_swiglu_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const int64_t len = out[0].size();
  parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
    swiglu_grad_range(n, out[0].type().dtype, in[0].bytes(), in[1].bytes(), in[2].bytes(), out[0].bytes(),
                      out[1].bytes(), lo, hi);
  });
}

}  // namespace remat::exec
