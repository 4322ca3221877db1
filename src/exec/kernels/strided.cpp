#include "exec/kernels/kernels.h"

#include <cstring>

namespace remat::exec {

ir::IntList strides_of(const ir::Shape& shape) {
  ir::IntList s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

namespace {

template <class T>
void copy_rows(const T* src, const ir::IntList& ss, T* dst, const ir::IntList& ds, const ir::Shape& shape) {
  const size_t r = shape.size();
  const int64_t inner = shape[r - 1], si = ss[r - 1], di = ds[r - 1];
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < r; ++d) outer *= shape[d];
#pragma omp parallel for if (outer * inner >= kParallelMin)
  for (int64_t o = 0; o < outer; ++o) {
    int64_t so = 0, dofs = 0, rem = o;
    for (size_t d = r - 1; d-- > 0;) {
      int64_t idx = rem % shape[d];
      rem /= shape[d];
      so += idx * ss[d];
      dofs += idx * ds[d];
    }
    const T* s = src + so;
    T* t = dst + dofs;
    if (si == 1 && di == 1) {
      std::memcpy(t, s, static_cast<size_t>(inner) * sizeof(T));
    } else {
      for (int64_t i = 0; i < inner; ++i) t[i * di] = s[i * si];
    }
  }
}

}  // namespace

void copy_strided(const std::byte* src, int64_t src_base, const ir::IntList& src_strides, std::byte* dst,
                  int64_t dst_base, const ir::IntList& dst_strides, const ir::Shape& shape, int64_t elem_size) {
  if (ir::num_elements(shape) == 0) return;
  if (shape.empty()) {
    std::memcpy(dst + dst_base * elem_size, src + src_base * elem_size, static_cast<size_t>(elem_size));
    return;
  }
  switch (elem_size) {
    case 1: copy_rows(reinterpret_cast<const uint8_t*>(src) + src_base, src_strides, reinterpret_cast<uint8_t*>(dst) + dst_base, dst_strides, shape); break;
    case 2: copy_rows(reinterpret_cast<const uint16_t*>(src) + src_base, src_strides, reinterpret_cast<uint16_t*>(dst) + dst_base, dst_strides, shape); break;
    case 4: copy_rows(reinterpret_cast<const uint32_t*>(src) + src_base, src_strides, reinterpret_cast<uint32_t*>(dst) + dst_base, dst_strides, shape); break;
    case 8: copy_rows(reinterpret_cast<const uint64_t*>(src) + src_base, src_strides, reinterpret_cast<uint64_t*>(dst) + dst_base, dst_strides, shape); break;
    default: ASSERT(false);
  }
}

}  // namespace remat::exec
