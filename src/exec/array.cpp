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

double Array::get(int64_t i) const {
  switch (type_->dtype) {
    case DType::f64: return data<double>()[i];
    case DType::f32: return data<float>()[i];
    case DType::bf16: return bf16_to_float(data<bf16_t>()[i]);
    case DType::f16: return f16_to_float(data<f16_t>()[i]);
    case DType::i32: return data<int32_t>()[i];
    case DType::pred: return data<uint8_t>()[i];
  }
  return 0;
}

void Array::set(int64_t i, double v) {
  switch (type_->dtype) {
    case DType::f64: data<double>()[i] = v; break;
    case DType::f32: data<float>()[i] = static_cast<float>(v); break;
    case DType::bf16: data<bf16_t>()[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::f16: data<f16_t>()[i] = float_to_f16(static_cast<float>(v)); break;
    case DType::i32: data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::pred: data<uint8_t>()[i] = v != 0; break;
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
