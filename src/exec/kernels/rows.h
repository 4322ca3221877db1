// A row's maximum and its sums in kRowLanes side-by-side partial results: lane i takes the elements j ≡ i
// (mod kRowLanes) of the row's full groups, the tail's elements lanes 0, 1, ... in turn; the lanes are then
// combined pairwise. A fixed count, so every target (and thread count) sums in the same order, and wide enough
// to vectorise at any width. softmax and its VJPs (softmax.cpp) and flash attention's online softmax
// (attention.cpp) take their rows' statistics here; reductions and the norms their windows' sums (reduce_window).
#pragma once

#include "exec/kernels/exp.h"
#include "exec/kernels/kernels.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <type_traits>

namespace remat::exec {

// Asks the caches for rows [from, to) of x (rows lx apart, D elements each). The hardware's prefetchers miss
// short runs of strided rows: the keys' and values' rows of one head (H·D or KV·D elements apart), a thread's
// share of the columns of a reduction over rows (the gradient norm's partial sums of the embedding; RMSNorm's dw
// pass, whose rows stay in the caches, gained nothing from it), or the visible prefixes of a causal softmax's rows.
template <class T>
void prefetch_rows(const T* x, int64_t lx, int64_t from, int64_t to, int64_t D) {
  for (int64_t j = from; j < to; ++j)
    for (int64_t d = 0; d < D; d += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(x + j * lx + d);
}
// How far ahead a reduction over rows asks for the row it will read (measured on the embedding gradient's column
// sums: 4 rows ahead slower, 12-32 no faster).
constexpr int64_t kRowsAhead = 8;

// The arithmetic type of the row kernels: f64 for f64 operands, else f32.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr int64_t kRowLanes = 16;

// Σ of a vector's 16 lanes, pairwise: lane i + 8 into lane i, then i + 4 into i, i + 2, i + 1 (halves of vectors).
template <class V>
auto sum_lanes(const V& v) {
  using A = std::remove_cvref_t<decltype(v[0])>;
  static_assert(sizeof(V) == 16 * sizeof(A));
  typedef A V8 __attribute__((vector_size(8 * sizeof(A))));
  typedef A V4 __attribute__((vector_size(4 * sizeof(A))));
  typedef A V2 __attribute__((vector_size(2 * sizeof(A))));
  const V8 s8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const V4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  const V2 s2 = __builtin_shufflevector(s4, s4, 0, 1) + __builtin_shufflevector(s4, s4, 2, 3);
  return A(s2[0] + s2[1]);
}
// Σ lane[i], in sum_lanes' order.
template <class A>
A combine_lanes(const A (&lane)[kRowLanes]) {
  static_assert(kRowLanes == 16);
  typedef A V16 __attribute__((vector_size(16 * sizeof(A))));
  V16 v;
  std::memcpy(&v, lane, sizeof(V16));
  return sum_lanes(v);
}

// Σ f(j) over j in [0, w); group16(j0), where given, is f(j0), ..., f(j0 + 15) as one vector (A float).
template <class A, class F, class Group16 = std::nullptr_t>
A row_sum(int64_t w, F f, Group16 group16 = nullptr) {
  A lane[kRowLanes] = {};
  int64_t j0 = 0;
  if constexpr (!std::is_null_pointer_v<Group16>) {
    static_assert(std::is_same_v<A, float>);
    Floats16 sum{};
    for (; j0 + kRowLanes <= w; j0 += kRowLanes) sum += group16(j0);
    std::memcpy(lane, &sum, sizeof(sum));
  }
  for (; j0 + kRowLanes <= w; j0 += kRowLanes)
#pragma omp simd
    for (int64_t i = 0; i < kRowLanes; ++i) lane[i] += f(j0 + i);
  for (int64_t j = j0; j < w; ++j) lane[j - j0] += f(j);
  return combine_lanes(lane);
}

// Eight doubles as one vector; a Floats16's low and high 8 lanes widened to them.
typedef double Doubles8 __attribute__((vector_size(64)));
inline Doubles8 low_f64(const Floats16& v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), Doubles8);
}
inline Doubles8 high_f64(const Floats16& v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), Doubles8);
}

// g where the arithmetic type A is f32, else nullptr: a group16 argument (row_sum, reduce_window) that only f32
// lanes can take.
template <class A, class G>
auto if_f32(G g) {
  if constexpr (std::is_same_v<A, float>) return g;
  else return nullptr;
}

// A window of n elements f(0), ..., f(n − 1) reduced in 8 accumulators (reduce_sum's and sum_of_squares' contiguous
// windows, reduce.cpp; the norms' row sums, norm.cpp): lane j takes elements j, j + 8, ..., the tail's elements
// lanes 0, 1, ... in turn, then the lanes are combined pairwise in a fixed order: independent chains the core runs
// side by side, and a result that depends on the window alone, not on threads. (A max over +0 and -0, or over NaNs
// of different payloads, may pick another of them than a sequential scan would.) group16, where given, is
// f(j0), ..., f(j0 + 15) as f32 lanes, for sums alone (Acc double, combine adding: the vectors add, whatever
// combine does): whole groups then go into the 8 lanes as two vectors of f64, the same additions in the same order
// (GCC kept a bf16 block's loads at 128 bits, with spills).
template <class Acc, class Combine, class F, class Group16 = std::nullptr_t>
Acc reduce_window(int64_t n, Acc init, Combine combine, F f, Group16 group16 = nullptr) {
  constexpr int64_t kLanes = 8;
  std::array<Acc, kLanes> lane;
  lane.fill(init);
  int64_t r = 0;
  if constexpr (!std::is_null_pointer_v<Group16>) {
    static_assert(std::is_same_v<Acc, double>);
    Doubles8 sum;
    std::memcpy(&sum, lane.data(), sizeof(sum));
    for (; r + 2 * kLanes <= n; r += 2 * kLanes) {
      const Floats16 v = group16(r);
      sum = sum + low_f64(v);
      sum = sum + high_f64(v);
    }
    std::memcpy(lane.data(), &sum, sizeof(sum));
  }
  for (; r + kLanes <= n; r += kLanes) {
    std::array<decltype(f(r)), kLanes> next;  // the block's elements first: a bf16 block's widening vectorises
    for (int64_t j = 0; j < kLanes; ++j) next[j] = f(r + j);
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = combine(lane[j], static_cast<Acc>(next[j]));
  }
  for (int64_t j = 0; r < n; ++r, ++j) lane[j] = combine(lane[j], static_cast<Acc>(f(r)));
  for (int64_t w = kLanes / 2; w > 0; w /= 2)
    for (int64_t j = 0; j < w; ++j) lane[j] = combine(lane[j], lane[j + w]);
  return lane[0];
}

// Sixteen elements of a row as f32 lanes, for the row kernels' whole groups: the lanes' own operations, so the bits
// are the scalar loop's at any vector width (the omp simd loops stayed 256 bits wide under AVX-512; these take one
// zmm there). T: float, bf16 or f16.
typedef uint16_t Halves16 __attribute__((vector_size(32)));
// x[0, 16), widened.
template <class T>
Floats16 load16(const T* x) {
  Floats16 v;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&v, x, sizeof(v));
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    Halves16 h;
    std::memcpy(&h, x, sizeof(h));
    v = std::bit_cast<Floats16>(__builtin_convertvector(h, Bits16) << 16);
  } else {
    for (int i = 0; i < 16; ++i) v[i] = load(x[i]);
  }
  return v;
}
// The bf16 bits of x's lanes (float_to_bf16's arithmetic), in the low halves.
inline Bits16 bf16_bits(const Floats16& x) {
  Bits16 u = std::bit_cast<Bits16>(x);
  round_to_bf16_bits(u);
  return u;
}
// to[0, 16) = v rounded to T (store<T>).
template <class T>
void store16(T* to, const Floats16& v) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(to, &v, sizeof(v));
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    const Halves16 h = __builtin_convertvector(bf16_bits(v), Halves16);
    std::memcpy(to, &h, sizeof(h));
  } else {
    for (int i = 0; i < 16; ++i) to[i] = store<T>(v[i]);
  }
}
// v rounded to T and widened back: load(store<T>(v)) in each lane.
template <class T>
Floats16 round16(const Floats16& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    return std::bit_cast<Floats16>(bf16_bits(v) << 16);
  } else {
    Floats16 r;
    for (int i = 0; i < 16; ++i) r[i] = load(store<T>(v[i]));
    return r;
  }
}
// Each lane's index, 0 to 15.
inline constexpr Bits16 kLanes16 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
// The lanes of j0, ..., j0 + 15 that are below end (all bits set), as a vector condition.
inline Ints16 lanes_below(int64_t j0, int64_t end) {
  return kLanes16 < static_cast<uint32_t>(std::clamp<int64_t>(end - j0, 0, 16));
}
// The lane of j0, ..., j0 + 15 that is j (all bits set), if any, as a vector condition.
inline Ints16 lane_at(int64_t j0, int64_t j) {
  const int64_t i = j - j0;
  return kLanes16 == static_cast<uint32_t>(i >= 0 && i < 16 ? i : 16);  // 16: no lane
}

// The maximum of the row x[0, w) over its non-NaN elements (−inf when there are none). A NaN needs no care
// here: its exp makes the row's sum NaN, and so every probability, as the primitives give.
template <class A, class T>
A row_max(const T* x, int64_t w) {
  A lane[kRowLanes];
  std::fill(lane, lane + kRowLanes, -std::numeric_limits<A>::infinity());
  int64_t j0 = 0;
  if constexpr (std::is_same_v<A, float>) {  // whole groups as one vector: the lanes' own operations, any width
    Floats16 v = Floats16{} - std::numeric_limits<A>::infinity();
    for (; j0 + kRowLanes <= w; j0 += kRowLanes) v = max_of(v, load16(x + j0));
    std::memcpy(lane, &v, sizeof(v));
  } else {
    for (; j0 + kRowLanes <= w; j0 += kRowLanes)
#pragma omp simd
      for (int64_t i = 0; i < kRowLanes; ++i) lane[i] = std::max(lane[i], static_cast<A>(load(x[j0 + i])));
  }
  for (int64_t j = j0; j < w; ++j) lane[j - j0] = std::max(lane[j - j0], static_cast<A>(load(x[j])));
  for (int64_t w = kRowLanes / 2; w > 0; w /= 2)  // pairwise: no chain of 15 dependent compares
    for (int64_t i = 0; i < w; ++i) lane[i] = std::max(lane[i], lane[i + w]);
  return lane[0];
}

// p[j] = exp(x[j] − m) for the row x[0, w) (p may be x); returns their sum.
template <class A, class T>
A row_exps(const T* x, int64_t w, A m, A* p) {
  A lane[kRowLanes] = {};
  int64_t j0 = 0;
  if constexpr (std::is_same_v<A, float>) {
    Floats16 sum{};
    for (; j0 + kRowLanes <= w; j0 += kRowLanes) {
      const Floats16 e = exp_nonpositive(load16(x + j0) - m);
      std::memcpy(p + j0, &e, sizeof(e));
      sum += e;
    }
    std::memcpy(lane, &sum, sizeof(sum));
  } else {
    for (; j0 + kRowLanes <= w; j0 += kRowLanes)
#pragma omp simd
      for (int64_t i = 0; i < kRowLanes; ++i)
        lane[i] += p[j0 + i] = exp_nonpositive_of(static_cast<A>(load(x[j0 + i])) - m);
  }
  for (int64_t j = j0; j < w; ++j) lane[j - j0] += p[j] = exp_nonpositive_of(static_cast<A>(load(x[j])) - m);
  return combine_lanes(lane);
}

}  // namespace remat::exec
