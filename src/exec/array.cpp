#include "exec/array.h"

#include <sys/mman.h>

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <new>

namespace remat::exec {

using ir::Type;

namespace {
// Page faults cost ~11 us per 4 KiB page on these machines: buffers of 2 MiB and more are 2 MiB-aligned
// and asked to be backed by transparent huge pages, one fault per 2 MiB.
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

const ir::Type Array::kNoType{};

Array::Array(Type type) : owned_type_(std::make_shared<const Type>(std::move(type))) {
  type_ = owned_type_.get();
  const size_t bytes = static_cast<size_t>(type_->bytes());
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = bytes == 0 ? align : (bytes + align - 1) / align * align;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(align, rounded));
  if (p != nullptr && align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
  CHECK(p != nullptr, "out of host memory allocating {} ({} bytes)", ir::type_str(*type_), bytes);
  storage_ = std::shared_ptr<std::byte>(p, [](std::byte* q) { std::free(q); });
  ptr_ = p;
}

Array Array::exact(int64_t bytes) {
  Array a;
  a.owned_type_ = std::make_shared<const Type>(Type{DType::pred, {bytes}});
  a.type_ = a.owned_type_.get();
  auto* p = static_cast<std::byte*>(::operator new(static_cast<size_t>(std::max<int64_t>(bytes, 1)), std::align_val_t{64}));
  a.storage_ = std::shared_ptr<std::byte>(p, [](std::byte* q) { ::operator delete(q, std::align_val_t{64}); });
  a.ptr_ = p;
  return a;
}

Array Array::zeros(Type type) {
  Array a(std::move(type));
  std::memset(a.ptr_, 0, static_cast<size_t>(a.type_->bytes()));
  return a;
}

double Array::element(DType d, const std::byte* p, int64_t i) {
  switch (d) {
    case DType::f64: return reinterpret_cast<const double*>(p)[i];
    case DType::f32: return reinterpret_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_float(reinterpret_cast<const bf16_t*>(p)[i]);
    case DType::f16: return f16_to_float(reinterpret_cast<const f16_t*>(p)[i]);
    case DType::i32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::pred: return reinterpret_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

void Array::set_element(DType d, std::byte* p, int64_t i, double v) {
  switch (d) {
    case DType::f64: reinterpret_cast<double*>(p)[i] = v; break;
    case DType::f32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::bf16: reinterpret_cast<bf16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::f16: reinterpret_cast<f16_t*>(p)[i] = float_to_f16(static_cast<float>(v)); break;
    case DType::i32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::pred: reinterpret_cast<uint8_t*>(p)[i] = v != 0; break;
  }
}

Array Array::unallocated(const Type* type) {
  Array a;
  a.type_ = type;
  return a;
}

Array Array::view(Type type, int64_t byte_offset) const {
  Array a = view(&type, byte_offset);
  a.owned_type_ = std::make_shared<const Type>(std::move(type));
  a.type_ = a.owned_type_.get();
  return a;
}

Array Array::view(const Type* type, int64_t byte_offset) const {
  ASSERT(byte_offset + type->bytes() <= type_->bytes());
  Array a;
  a.type_ = type;
  a.storage_ = storage_;
  a.ptr_ = ptr_ + byte_offset;
  return a;
}

Array Array::view_as(const Array& typed) const {
  Array a = view(typed.type_);
  a.owned_type_ = typed.owned_type_;
  return a;
}

Array Array::detached() const {
  return owned_type_ ? *this : with_type(std::make_shared<const Type>(*type_));
}

Array Array::with_type(std::shared_ptr<const Type> type) const {
  ASSERT(*type == *type_);
  Array a = *this;
  a.owned_type_ = std::move(type);
  a.type_ = a.owned_type_.get();
  return a;
}

Array Array::slice0(int64_t i) const {
  ASSERT(type_->rank() >= 1);
  return view(Type{type_->dtype, ir::Shape(type_->shape.begin() + 1, type_->shape.end())},
              i * (type_->bytes() / type_->shape[0]));
}

Array Array::slice0(int64_t i, const Type* row) const {
  ASSERT(type_->rank() >= 1 && i >= 0 && i < type_->shape[0]);
  return view(row, i * row->bytes());
}

Array Array::clone() const {
  Array a(*type_);
  std::memcpy(a.ptr_, ptr_, static_cast<size_t>(type_->bytes()));
  return a;
}

}  // namespace remat::exec
