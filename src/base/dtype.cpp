#include "base/dtype.h"

#include <bit>
#include <cstring>

namespace remat {

std::string_view dtype_name(DType d) {
  switch (d) {
#define X(e, text, ctype) \
  case DType::e:          \
    return text;
    REMAT_DTYPES(X)
#undef X
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view text) {
#define X(e, name, ctype) \
  if (text == name) return DType::e;
  REMAT_DTYPES(X)
#undef X
  return std::nullopt;
}

int64_t dtype_size(DType d) {
  switch (d) {
#define X(e, text, ctype) \
  case DType::e:          \
    return sizeof(ctype);
    REMAT_DTYPES(X)
#undef X
  }
  return 0;
}

bool is_float(DType d) { return d == DType::f64 || d == DType::f32 || d == DType::bf16 || d == DType::f16; }

float bf16_to_float(bf16_t x) { return std::bit_cast<float>(uint32_t{x.bits} << 16); }

bf16_t float_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

// _Float16 conversions are IEEE round-to-nearest-even in g++ on x86-64.
float f16_to_float(f16_t x) { return static_cast<float>(std::bit_cast<_Float16>(x.bits)); }

f16_t float_to_f16(float x) { return f16_t{std::bit_cast<uint16_t>(static_cast<_Float16>(x))}; }

}  // namespace remat
