// The dtype table: one X-macro row per element type. Everything that switches on dtype derives from it.
//   X(enumerator, text name, storage type)
// bf16 and f16 are stored as 16-bit patterns; conversions round to nearest even and keep NaN/Inf.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>

#if defined(__clang__) && __clang_major__ < 15
#include <immintrin.h>
#endif

namespace remat {

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

#define REMAT_DTYPES(X) \
  X(f64, "f64", double) \
  X(f32, "f32", float)  \
  X(bf16, "bf16", bf16_t) \
  X(f16, "f16", f16_t)  \
  X(i32, "i32", int32_t) \
  X(pred, "bool", uint8_t)

enum class DType : uint8_t {
#define X(e, text, ctype) e,
  REMAT_DTYPES(X)
#undef X
};

std::string_view dtype_name(DType d);
// Parses a text name ("f32", "bool", ...); nullopt when it is not one.
std::optional<DType> parse_dtype(std::string_view text);
int64_t dtype_size(DType d);
bool is_float(DType d);
// Whether every value of `from` is one of `to` (bf16 or f16 to f32 or f64, f32 to f64): a convert that widens exactly.
bool widens_exactly(DType from, DType to);

// Inline and branch-free, so that kernels' loops over bf16 data vectorize.
inline float bf16_to_float(bf16_t x) { return std::bit_cast<float>(uint32_t{x.bits} << 16); }
// The f32 bits u made bf16 bits (in the low half): rounded to nearest, ties to even; a NaN made quiet. U is uint32_t
// or a GCC vector of them (kernels that keep rows in registers round each lane with these operations), changed in
// place (a function returning a vector would change the calling convention between targets).
template <class U>
void round_to_bf16_bits(U& u) {
  const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const U quiet_nan = (u >> 16) | 0x40u;
  u = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}
inline bf16_t float_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  round_to_bf16_bits(u);
  return bf16_t{static_cast<uint16_t>(u)};
}
#if defined(__clang__) && __clang_major__ < 15
// clang 14 (the fuzz tree's compiler) has no _Float16 on x86-64: the F16C instructions (-mf16c), also IEEE
// round-to-nearest-even.
inline float f16_to_float(f16_t x) { return _cvtsh_ss(x.bits); }
inline f16_t float_to_f16(float x) { return f16_t{_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)}; }
#else
// _Float16 conversions are IEEE round-to-nearest-even in g++ on x86-64.
inline float f16_to_float(f16_t x) { return static_cast<float>(std::bit_cast<_Float16>(x.bits)); }
inline f16_t float_to_f16(float x) { return f16_t{std::bit_cast<uint16_t>(static_cast<_Float16>(x))}; }
#endif

}  // namespace remat
