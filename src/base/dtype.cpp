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
bool widens_exactly(DType from, DType to) { return is_float(from) && is_float(to) && dtype_size(from) < dtype_size(to); }

}  // namespace remat
