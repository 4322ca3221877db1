// Array: a typed host buffer (64-byte aligned). Copies share storage; arrays are immutable once a kernel
// has written them, which is what makes sharing (views, aliases) safe.
// The type is either owned (shared, immutable) or borrowed from a graph that outlives the array: the
// executor's views borrow, so a steady-state step copies arrays without touching the heap.
//   Array a = Array::from<float>({2, 3}, {1, 2, 3, 4, 5, 6});
//   float* p = a.data<float>();  Array row = a.slice0(1);  // f32[3], a view
#pragma once

#include "ir/ir.h"

#include <cstddef>
#include <memory>
#include <vector>

namespace remat::exec {

class Array {
 public:
  Array() = default;
  explicit Array(ir::Type type);  // uninitialized contents
  static Array zeros(ir::Type type);
  // pred[bytes], uninitialized, allocated at exactly that size (64-byte aligned): under AddressSanitizer
  // the byte after it is a redzone.
  static Array exact(int64_t bytes);
  static Array unallocated(const ir::Type* type);  // a borrowed type without storage (kernels set it)
  template <class T>
  static Array from(ir::Shape shape, const std::vector<T>& values);

  const ir::Type& type() const { return *type_; }
  std::byte* bytes() const { return ptr_; }
  template <class T>
  T* data() const { return reinterpret_cast<T*>(ptr_); }
  int64_t size() const { return type_->num_elements(); }

  // Element `i` (row-major) of any dtype, as a double: for tests and printing.
  double get(int64_t i) const { return element(type_->dtype, ptr_, i); }
  void set(int64_t i, double v) { set_element(type_->dtype, ptr_, i, v); }
  // The same over raw storage of dtype `d` (bf16 and f16 round to nearest even, through f32).
  static double element(DType d, const std::byte* p, int64_t i);
  static void set_element(DType d, std::byte* p, int64_t i, double v);
  template <class T>
  std::vector<T> to_vector() const { return std::vector<T>(data<T>(), data<T>() + size()); }

  Array view(ir::Type type, int64_t byte_offset = 0) const;  // shares storage
  Array view(const ir::Type* type, int64_t byte_offset = 0) const;  // shares storage, borrows the type
  Array view_as(const Array& typed) const;  // shares storage, with typed's type (an alias: reshape, name)
  // The same array owning its type (a copy of a borrowed one), safe past the graph that lent it.
  Array detached() const;
  Array with_type(std::shared_ptr<const ir::Type> type) const;  // the same storage, owning `type` (equal)
  Array slice0(int64_t i) const;                              // row i along axis 0, a view
  Array slice0(int64_t i, const ir::Type* row) const;        // the same, borrowing the row's type
  Array clone() const;                                        // deep copy

 private:
  const ir::Type* type_ = &kNoType;
  std::shared_ptr<const ir::Type> owned_type_;  // set when the type is owned
  static const ir::Type kNoType;
  std::shared_ptr<std::byte> storage_;
  std::byte* ptr_ = nullptr;
};

template <class T>
Array Array::from(ir::Shape shape, const std::vector<T>& values) {
  DType d{};
  if constexpr (std::is_same_v<T, double>) d = DType::f64;
  else if constexpr (std::is_same_v<T, float>) d = DType::f32;
  else if constexpr (std::is_same_v<T, int32_t>) d = DType::i32;
  else static_assert(sizeof(T) == 0, "Array::from supports double, float and int32_t");
  Array a(ir::Type{d, std::move(shape)});
  CHECK(static_cast<int64_t>(values.size()) == a.size(), "Array::from: {} values for shape {}", values.size(),
        ir::shape_str(a.type().shape));
  std::copy(values.begin(), values.end(), a.data<T>());
  return a;
}

}  // namespace remat::exec
