// Data movement kernels: broadcast, reshape, transpose, slices, concatenate, gather/scatter, iota, full.
#include "exec/kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace remat::exec {
namespace {

int64_t elem(const Array& a) { return dtype_size(a.type().dtype); }

// lax clamps dynamic start indices so the window stays inside the operand.
Dims clamped_starts(std::span<const Array> in, size_t first, const ir::Shape& operand, const ir::Shape& window) {
  Dims s;
  for (size_t d = 0; d < operand.size(); ++d) {
    int64_t v = in[first + d].data<int32_t>()[0];
    s.push_back(std::clamp<int64_t>(v, 0, operand[d] - window[d]));
  }
  return s;
}

int64_t offset_of(const Dims& index, const Dims& strides) {
  int64_t o = 0;
  for (size_t d = 0; d < index.size(); ++d) o += index[d] * strides[d];
  return o;
}

}  // namespace

void copy_all(const Array& from, Array& to) {
  if (to.bytes() != from.bytes()) std::memcpy(to.bytes(), from.bytes(), static_cast<size_t>(from.type().bytes()));
}

void kernel_broadcast_in_dim(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const ir::IntList& dims = n.attrs.ints("dims");
  const ir::Shape& xs = in[0].type().shape;
  Dims x_strides = strides_of(xs);
  Dims src(out[0].type().shape.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i)
    if (xs[i] != 1) src[static_cast<size_t>(dims[i])] = x_strides[i];
  copy_strided(in[0].bytes(), 0, src, out[0].bytes(), 0, strides_of(out[0].type().shape), out[0].type().shape,
               elem(in[0]));
}

// reshape, name, stop_gradient and pvary alias their operand: the output is a view of the same bytes.
void kernel_reshape(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  out[0] = in[0].view_as(out[0]);
}
void kernel_name(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  out[0] = in[0].view_as(out[0]);
}
void kernel_stop_gradient(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  out[0] = in[0].view_as(out[0]);
}
void kernel_pvary(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  out[0] = in[0].view_as(out[0]);
}
void kernel_check_finite(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  for (int64_t i = 0; i < in[0].size(); ++i) {
    const double v = in[0].get(i);
    CHECK(std::isfinite(v), "check_finite{}: element {} of {} is {}{}", n.scope.empty() ? "" : fmt::format(" (scope '{}')", n.scope),
          i, ir::type_str(in[0].type()), v, n.attrs.has("of") ? fmt::format(", the output of {}", n.attrs.str("of")) : "");
  }
  out[0] = in[0].view_as(out[0]);
}

// Memory-space moves. On the CPU backend both spaces are host memory, so these are copies into a buffer
// of the destination space; the planner accounts host and device bytes separately.
void kernel_offload(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  copy_all(in[0], out[0]);
}
void kernel_reload(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  copy_all(in[0], out[0]);
}

void kernel_transpose(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const ir::IntList& perm = n.attrs.ints("perm");
  Dims in_strides = strides_of(in[0].type().shape), src;
  for (int64_t p : perm) src.push_back(in_strides[static_cast<size_t>(p)]);
  copy_strided(in[0].bytes(), 0, src, out[0].bytes(), 0, strides_of(out[0].type().shape), out[0].type().shape,
               elem(in[0]));
}

void kernel_slice(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  Dims strides = strides_of(in[0].type().shape);
  copy_strided(in[0].bytes(), offset_of(n.attrs.ints("start"), strides), strides, out[0].bytes(), 0,
               strides_of(out[0].type().shape), out[0].type().shape, elem(in[0]));
}

void kernel_dynamic_slice(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const ir::Shape& window = out[0].type().shape;
  Dims strides = strides_of(in[0].type().shape);
  auto starts = clamped_starts(in, 1, in[0].type().shape, window);
  copy_strided(in[0].bytes(), offset_of(starts, strides), strides, out[0].bytes(), 0, strides_of(window), window,
               elem(in[0]));
}

void kernel_dynamic_update_slice(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  copy_all(in[0], out[0]);
  const ir::Shape& window = in[1].type().shape;
  Dims strides = strides_of(in[0].type().shape);
  auto starts = clamped_starts(in, 2, in[0].type().shape, window);
  copy_strided(in[1].bytes(), 0, strides_of(window), out[0].bytes(), offset_of(starts, strides), strides, window,
               elem(in[0]));
}

void kernel_concatenate(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const size_t dim = static_cast<size_t>(n.attrs.integer("dim"));
  Dims out_strides = strides_of(out[0].type().shape);
  int64_t at = 0;
  for (const Array& x : in) {
    copy_strided(x.bytes(), 0, strides_of(x.type().shape), out[0].bytes(), at * out_strides[dim], out_strides,
                 x.type().shape, elem(x));
    at += x.type().shape[dim];
  }
}

void kernel_gather(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const Array& table = in[0];
  const int32_t* idx = in[1].data<int32_t>();
  const int64_t rows = table.type().shape[0], count = in[1].size();
  const int64_t row_bytes = table.type().shape[0] == 0 ? 0 : table.type().bytes() / rows;
  for (int64_t i = 0; i < count; ++i)
    CHECK(idx[i] >= 0 && idx[i] < rows, "{}: index {} at position {} is outside the table's {} rows{}", ir::op_name(n.op),
          idx[i], i, rows, n.scope.empty() ? "" : fmt::format(" (scope '{}')", n.scope));
  parallel_ranges(count, count * row_bytes >= kParallelMin * 4, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      std::memcpy(out[0].bytes() + i * row_bytes, table.bytes() + idx[i] * row_bytes, static_cast<size_t>(row_bytes));
  });
}

void kernel_scatter_add(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  copy_all(in[0], out[0]);
  const int32_t* idx = in[1].data<int32_t>();
  const int64_t rows = in[0].type().shape[0], count = in[1].size();
  const int64_t row = rows == 0 ? 0 : in[0].size() / rows;
  dispatch_numeric(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    T* o = out[0].data<T>();
    const T* u = in[2].data<T>();
    for (int64_t i = 0; i < count; ++i) {
      CHECK(idx[i] >= 0 && idx[i] < rows, "{}: index {} at position {} is outside the operand's {} rows",
            ir::op_name(n.op), idx[i], i, rows);
      T* dst = o + idx[i] * row;
      const T* src = u + i * row;
      for (int64_t j = 0; j < row; ++j) dst[j] = store<T>(load(dst[j]) + load(src[j]));
    }
  });
}

void constant_range(const ir::Node& n, const ir::Type& type, int64_t lo, int64_t len, std::byte* out) {
  if (len == 0) return;
  if (n.op == ir::Op::full) {
    Array::set_element(type.dtype, out, 0, n.attrs.real("value"));
    dispatch_bits(dtype_size(type.dtype), [&](auto bits) {
      using U = decltype(bits);
      U* d = reinterpret_cast<U*>(out);
#pragma omp simd
      for (int64_t i = 1; i < len; ++i) d[i] = d[0];
    });
    return;
  }
  ASSERT(n.op == ir::Op::iota);
  // Element lo + i holds ((lo + i) / inner) % size: runs of `inner` equal values, counted without a division.
  const size_t dim = static_cast<size_t>(n.attrs.integer("dim"));
  const int64_t inner = strides_of(Dims(type.shape))[dim], size = type.shape[dim];
  int64_t value = (lo / inner) % size, run = inner - lo % inner;
  if (inner == 1 && type.dtype == DType::i32) {  // no dims of size > 1 after `dim`: ramps 0, 1, ..., size - 1
    int32_t* d = reinterpret_cast<int32_t*>(out);
    for (int64_t i = 0, ramp = std::min(size - value, len); i < len;
         i += ramp, value = 0, ramp = std::min(size, len - i))
      for (int64_t k = 0; k < ramp; ++k) d[i + k] = static_cast<int32_t>(value + k);
    return;
  }
  for (int64_t i = 0; i < len; i += run, run = inner, value = value + 1 == size ? 0 : value + 1) {
    run = std::min(run, len - i);
    if (type.dtype == DType::i32) {
      std::fill_n(reinterpret_cast<int32_t*>(out) + i, run, static_cast<int32_t>(value));
      continue;
    }
    for (int64_t j = i; j < i + run; ++j) Array::set_element(type.dtype, out, j, static_cast<double>(value));
  }
}

namespace {

void fill_constant(const ir::Node& n, Array& o) {
  const int64_t len = o.size(), size = dtype_size(o.type().dtype);
  parallel_ranges(len, len >= kParallelMin, [&](int64_t lo, int64_t hi) {
    constant_range(n, o.type(), lo, hi - lo, o.bytes() + lo * size);
  });
}

}  // namespace

void kernel_iota(const ir::Node& n, std::span<const Array>, std::span<Array> out, const KernelContext&) {
  fill_constant(n, out[0]);
}

void kernel_full(const ir::Node& n, std::span<const Array>, std::span<Array> out, const KernelContext&) {
  fill_constant(n, out[0]);
}

}  // namespace remat::exec
