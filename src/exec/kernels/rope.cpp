// The rotary position embedding (ir/ops.h), which is also its own VJP (with −sin). x [B,T,N,Dh] is rows of Dh
// elements, row r at position (r / N) % T; a parallel loop hands each thread whole rows. Each product and the sum
// is rounded to x's dtype as the unfused mul and add round them, so the op gives the bits of
// x·cos + [−x₂, x₁]·sin built from those primitives. Pair i is read before it is written: y may be x (in place).
#include "exec/kernels/kernels.h"

namespace remat::exec {
namespace {

// Rows [lo, hi) of y from x (dtype dt), `half` = Dh/2 pairs a row, `heads` rows a position of `positions`.
void rope_rows_body(const ir::Node& n, DType dt, const std::byte* x_bytes, const std::byte* cos_bytes,
                    const std::byte* sin_bytes, std::byte* y_bytes, int64_t positions, int64_t heads, int64_t half,
                    int64_t lo, int64_t hi) {
  dispatch_float(dt, n, [&](auto type) {
    using T = decltype(type);
    using C = Compute<T>;
    const T* x = reinterpret_cast<const T*>(x_bytes);
    const T* cos = reinterpret_cast<const T*>(cos_bytes);
    const T* sin = reinterpret_cast<const T*>(sin_bytes);
    T* y = reinterpret_cast<T*>(y_bytes);
    auto rounded = [](C v) { return load(store<T>(v)); };  // a product as mul stores it
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * 2 * half;
      T* yr = y + r * 2 * half;
      const T* c = cos + r / heads % positions * half;
      const T* s = sin + r / heads % positions * half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const C x1 = load(xr[i]), x2 = load(xr[half + i]), ci = load(c[i]), si = load(s[i]);
        yr[i] = store<T>(rounded(x1 * ci) - rounded(x2 * si));  // x₁·cos + (−x₂)·sin: the same IEEE result
        yr[half + i] = store<T>(rounded(x2 * ci) + rounded(x1 * si));
      }
    }
  });
}

REMAT_WIDEST_CLONES(rope_rows, rope_rows_body)

}  // namespace

void kernel_rope(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const ir::Type& t = in[0].type();
  const int64_t rows = t.shape[0] * t.shape[1] * t.shape[2];
  parallel_ranges(rows, t.num_elements() >= kParallelMin, [&](int64_t lo, int64_t hi) {
    rope_rows(n, t.dtype, in[0].bytes(), in[1].bytes(), in[2].bytes(), out[0].bytes(), t.shape[1], t.shape[2],
              t.shape[3] / 2, lo, hi);
  });
}

}  // namespace remat::exec
