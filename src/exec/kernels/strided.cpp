#include "exec/kernels/kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace remat::exec {

Dims::Dims(size_t count, int64_t fill) : n_(count) {
  CHECK(count <= kMax, "rank {} exceeds the kernels' limit of {} dims", count, kMax);
  std::fill(v_.begin(), v_.begin() + static_cast<std::ptrdiff_t>(count), fill);
}

Dims::Dims(const std::vector<int64_t>& x) : n_(x.size()) {
  CHECK(x.size() <= kMax, "rank {} exceeds the kernels' limit of {} dims", x.size(), kMax);
  std::copy(x.begin(), x.end(), v_.begin());
}

void Dims::push_back(int64_t x) {
  CHECK(n_ < kMax, "rank exceeds the kernels' limit of {} dims", kMax);
  v_[n_++] = x;
}

Dims free_dims(int64_t rank, const ir::IntList& contract, const ir::IntList& batch) {
  Dims f;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(contract.begin(), contract.end(), d) == contract.end() &&
        std::find(batch.begin(), batch.end(), d) == batch.end())
      f.push_back(d);
  return f;
}

int64_t num_elements(const Dims& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Dims strides_of(const Dims& shape) {
  Dims s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

std::byte* take(std::span<std::byte>& workspace, int64_t bytes) {
  ASSERT(static_cast<size_t>(bytes) <= workspace.size());  // the plan gave what workspace_bytes asked
  std::byte* p = workspace.data();
  workspace = workspace.subspan(std::min(static_cast<size_t>(aligned64(bytes)), workspace.size()));
  return p;
}

namespace {

template <class T>
void copy_rows(const T* src, const Dims& ss, T* dst, const Dims& ds, const Dims& shape) {
  const size_t r = shape.size();
  const int64_t inner = shape[r - 1], si = ss[r - 1], di = ds[r - 1];
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < r; ++d) outer *= shape[d];
  parallel_ranges(outer, outer * inner >= kParallelMin, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
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
  });
}

}  // namespace

void copy_strided(const std::byte* src, int64_t src_base, const Dims& src_strides, std::byte* dst, int64_t dst_base,
                  const Dims& dst_strides, const Dims& shape, int64_t elem_size) {
  if (num_elements(shape) == 0) return;
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
