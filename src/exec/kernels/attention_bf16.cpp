// Flash attention for bf16 operands: attention.cpp's online softmax and tiles, with every product on bf16 values in
// pairs (pairs.h: vdpbf16ps where the CPU has AVX512_BF16, the same bits elsewhere), as FlashAttention on a GPU runs
// its products on bf16 tensor cores. Scores, statistics, probabilities and sums are f32; a product's operands are
// bf16: q, k, v and dout as given, the probabilities p and the score gradients ds rounded once (as dot_product's
// bf16 softmax is before its matmul). Scores are in base 2, s = (q·kᵀ)·c with c = scale·log2 e, and probabilities
// 2^(s - m) (exp2_nonpositive), as FlashAttention computes them: no ln 2 reduction per element. s - m is one fused
// multiply-add of q·kᵀ, c and -m (m: the row's running maximum, forward, or its log-sum-exp, backward), so no score
// is rounded on its own; hidden keys' probabilities are set to 0 bit by bit.
//
// A product pairs consecutive values of its contraction: head dims for q kᵀ and dout vᵀ (a row of q or k viewed as
// pairs, as stored), keys for p v and ds k (k and v laid out with two keys' rows interleaved, once per kv head),
// queries for dv and dk, which are accumulated transposed (dvᵀ += doutᵀ p, dkᵀ += qᵀ ds: the tile's p and ds
// with two queries' rows interleaved, and doutᵀ, qᵀ once per tile) and written back once per kv head.
#include "exec/kernels/attention.h"
#include "exec/kernels/pairs.h"

#include <omp.h>

#include <array>
#include <cmath>
#include <numbers>

namespace remat::exec::flash {
namespace {

constexpr int64_t kPairsD = kMaxDh / 2;  // pairs of head dims a tile row holds

// One thread's tiles. Rows index queries, columns keys; u32 arrays hold bf16 pairs.
struct Tiles {
  uint32_t q[kRows][kPairsD], dout[kRows][kPairsD];                  // pairs of head dims
  uint32_t q_t[kMaxDh][kRows / 2], dout_t[kMaxDh][kRows / 2];        // transposed: pairs of queries
  float acc[kRows][kMaxDh];                                          // the context, or dq
  float s[kRows][kBlock], g[kRows][kBlock];                          // scores; the backward's dout vᵀ
  uint32_t along_keys[kRows][kBlock / 2];  // p (forward) or ds (backward) in pairs of keys
  uint32_t p_along_queries[kRows / 2][kBlock], ds_along_queries[kRows / 2][kBlock];  // the backward's, in pairs
  float m[kRows], l[kRows], delta[kRows];  // in base 2 (the backward's l: the log-sum-exp)
  Floats16 l16[kRows];  // the forward's running sums l, lane by lane (summed once a row's keys are done)
  // pair_product's scratch, for the largest product: q kᵀ's (p v's and dq's need kBlock·(kRows + kMaxDh) floats at
  // most, dv's and dk's kRows·(kMaxDh + kBlock))
  float split[pair_scratch(kRows, kBlock, kMaxDh / 2)];
};

// A product of the tile's: pair_product with the tile's scratch.
void product(Tiles& t, const PairProduct& p, int64_t rows, int64_t cols) { pair_product(p, rows, cols, t.split); }

// One kv head's keys and values in pairs, filled once per (batch, kv head): kt, vt transposed block by block (for
// each block of kBlock keys, D/2 rows of kBlock pairs of head dims, as attention.cpp's panels), kp, vp with
// two keys' rows interleaved (row j/2 of D pairs holds keys j and j + 1). The forward uses kt and vp.
struct Keys {
  uint32_t *kt, *vt, *kp, *vp;
};

int64_t tiles_bytes() { return aligned64(sizeof(Tiles)); }
int64_t key_array(int64_t S, int64_t D) { return padded_keys(S) * D / 2; }  // u32 of each of kt, vt, kp, vp
bool backward(const ir::Node& n) { return n.op == ir::Op::attention_grad; }
int64_t per_thread(const ir::Node& n, int64_t S, int64_t D) {
  return tiles_bytes() + aligned64((backward(n) ? 4 : 2) * key_array(S, D) * 4) +
         (backward(n) ? aligned64(2 * padded_keys(S) * D * 4) : 0);  // dkᵀ and dvᵀ of a kv head
}

Keys keys_of(Tiles& t, const ir::Node& n, const Problem& z) {
  uint32_t* at = reinterpret_cast<uint32_t*>(reinterpret_cast<std::byte*>(&t) + tiles_bytes());
  const int64_t size = key_array(z.S, z.D);
  return backward(n) ? Keys{at, at + size, at + 2 * size, at + 3 * size} : Keys{at, nullptr, nullptr, at + size};
}

const uint32_t* as_pairs(const bf16_t* x) { return reinterpret_cast<const uint32_t*>(x); }  // D even: rows aligned

// Two keys' rows interleaved: to[(j/2)·D + d] = (x(j, d), x(j + 1, d)), keys past S zero; x(j, d) at x[j·lx + d].
void interleave_keys(const bf16_t* x, int64_t lx, uint32_t* to, const Problem& z) {
  const bf16_t zero{0};
  for (int64_t j = 0; j < padded_keys(z.S); j += 2) {
    prefetch_rows(x, lx, j + 16, std::min(j + 18, z.S), z.D);
    for (int64_t d = 0; d < z.D; ++d)
      to[j / 2 * z.D + d] = bf16_pair(j < z.S ? x[j * lx + d] : zero, j + 1 < z.S ? x[(j + 1) * lx + d] : zero);
  }
}

// Fills `keys` with kv head g of batch b.
void load_keys(const Keys& keys, const bf16_t* k, const bf16_t* v, const Problem& z, int64_t b, int64_t g) {
  const int64_t first = (b * z.S * z.KV + g) * z.D, lx = z.KV * z.D;  // key j's row at first + j·lx
  for (int64_t s0 = 0; s0 < z.S; s0 += kBlock) {
    const int64_t cols = std::min(kBlock, z.S - s0), at = (first + s0 * lx) / 2;
    transpose(as_pairs(k) + at, lx / 2, keys.kt + s0 * z.D / 2, kBlock, cols, z.D / 2);
    if (keys.vt) transpose(as_pairs(v) + at, lx / 2, keys.vt + s0 * z.D / 2, kBlock, cols, z.D / 2);
  }
  interleave_keys(v + first, lx, keys.vp, z);
  if (keys.kp) interleave_keys(k + first, lx, keys.kp, z);
}

// Rows [i0, i0 + rows) of query head h (of q, or dout) into a tile: as pairs of head dims, and (for the backward)
// transposed as pairs of queries, a last odd row paired with zero.
void load_rows(const bf16_t* x, uint32_t (*to)[kPairsD], uint32_t (*to_t)[kRows / 2], const Problem& z, int64_t b,
               int64_t h, int64_t i0, int64_t rows) {
  auto row = [&](int64_t r) { return x + ((b * z.T + i0 + r) * z.H + h) * z.D; };
  for (int64_t r = 0; r < rows; ++r) std::memcpy(to[r], row(r), static_cast<size_t>(z.D) * sizeof(bf16_t));
  if (!to_t) return;
  for (int64_t r = 0; r < rows; r += 2)
    for (int64_t d = 0; d < z.D; ++d) to_t[d][r / 2] = bf16_pair(row(r)[d], r + 1 < rows ? row(r + 1)[d] : bf16_t{0});
}

// q kᵀ for the tile into s, unscaled: its readers take each probability as 2^(q·kᵀ·c - m) where the row sees the key
// (visible_keys), c = scores_scale, and 0 elsewhere.
void scores(Tiles& t, const Keys& keys, const Problem& z, int64_t rows, int64_t s0, int64_t cols) {
  product(t, {&t.q[0][0], kPairsD, keys.kt + s0 * z.D / 2, kBlock, &t.s[0][0], kBlock, z.D / 2, false}, rows, cols);
}
float scores_scale(const Problem& z) { return static_cast<float>(z.scale * std::numbers::log2e); }
// The keys of the block of `cols` from s0 that query i sees: all of them, or under a causal mask those up to i.
int64_t visible_keys(const Problem& z, int64_t i, int64_t s0, int64_t cols) {
  return z.causal ? std::clamp<int64_t>(i + 1 - s0, 0, cols) : cols;
}

// A row of a block's scores as vectors of 16 keys, in registers.
constexpr int64_t kVectors = kBlock / 16;
using Row = std::array<Floats16, kVectors>;

// The largest lane: in any order, as the maximum of floats that are not NaN does not depend on it (a NaN score
// makes its row's sum NaN either way).
float max_lanes(const Floats16& x) {
  typedef float V8 __attribute__((vector_size(32)));
  typedef float V4 __attribute__((vector_size(16)));
  const V8 m8 = max_of<V8>(__builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7),
                           __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15));
  const V4 m4 = max_of<V4>(__builtin_shufflevector(m8, m8, 0, 1, 2, 3), __builtin_shufflevector(m8, m8, 4, 5, 6, 7));
  return max_of(max_of(m4[0], m4[1]), max_of(m4[2], m4[3]));
}

// Rounding to bf16 pairs, with float_to_bf16's arithmetic (kNative false) or, where pair_product runs vdpbf16ps
// (pair_product_native: AVX512_BF16 under the x86-64-v4 kernels), with vcvtne2ps2bf16, two vectors in one
// instruction. That instruction also flushes subnormal values to zero, which vdpbf16ps (and its emulations, under
// DAZ) reads as zero anyway: the products, and so every output bit, do not depend on which rounding ran.
// x's lanes then y's, as 32 bf16 values: pair i holds lanes 2i and 2i + 1 of (x, y), pairs of keys of a row.
template <bool kNative>
Bits16 pairs_of_keys(const Floats16& x, const Floats16& y) {
  if constexpr (kNative) {  // the low 16 bf16 values from the last operand (x), the high from the one before (y)
    Bits16 pairs;
    asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(pairs) : "v"(y), "v"(x));
    return pairs;
  } else {
    const Bits16 a = bf16_bits(x), b = bf16_bits(y);
    const Bits16 even = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const Bits16 odd = __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return even | odd << 16;
  }
}
// Lane i of x with lane i of y: pair i holds (x[i], y[i]), two queries' values of one key.
template <bool kNative>
Bits16 pairs_of_rows(const Floats16& x, const Floats16& y) {
  if constexpr (kNative) {
    typedef uint16_t Halves32 __attribute__((vector_size(64)));
    const Halves32 h = std::bit_cast<Halves32>(pairs_of_keys<true>(x, y));  // x's 16 values, then y's
    return std::bit_cast<Bits16>(__builtin_shufflevector(h, h, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7,
                                                         23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
  } else {
    return bf16_bits(x) | bf16_bits(y) << 16;
  }
}

// A row of the block in pairs of keys, into `to` (one vector at a time: GCC copied an array of them through the
// stack).
template <bool kNative>
void store_pairs_of_keys(const Row& x, uint32_t* to) {
  for (int64_t v = 0; v < kVectors; v += 2) {
    const Bits16 pairs = pairs_of_keys<kNative>(x[v], x[v + 1]);
    std::memcpy(to + 8 * v, &pairs, sizeof(pairs));
  }
}

// The lanes of vector v of a block's row (keys 16v to 16v + 15) below `end` (all bits set), as bits to mask with.
Bits16 lanes_of(int64_t v, int64_t end) { return std::bit_cast<Bits16>(lanes_below(16 * v, end)); }

// Folds one block's scores into the tile's online softmax, each row in registers: each query's running maximum m,
// sum l and context acc rescaled to the new maximum, and the block's probabilities 2^(q·kᵀ·c - m) rounded to bf16
// pairs along its keys (zeros past the row's visible keys). The maximum is taken of the unscaled products (c > 0:
// rounding keeps their order), then scaled; a probability's exponent may so exceed 0 by half an ulp of m. Phase by
// phase over the rows, as attention.h's online_softmax, so that the rows' dependency chains overlap. l sums lane by
// lane (l16), across the blocks: one sum of lanes per row, at its end. Bitwise selects: GCC 12 turned `mask ? a : b`
// on these vectors into code lane by lane.
template <bool kNative>
void fold_block(Tiles& t, const Problem& z, int64_t i0, int64_t rows, int64_t s0, int64_t cols) {
  const Bits16 kMinusInf = Bits16{} + std::bit_cast<uint32_t>(-std::numeric_limits<float>::infinity());
  const float scale = scores_scale(z);
  float m_new[kRows], correction[kRows];
  int64_t visible[kRows];
  for (int64_t r = 0; r < rows; ++r) {  // the maxima, of the keys each row sees (the product wrote `cols` of them)
    visible[r] = visible_keys(z, i0 + r, s0, cols);
    Row x;
    std::memcpy(x.data(), t.s[r], sizeof(x));
    if (visible[r] < kBlock)
      for (int64_t v = 0; v < kVectors; ++v) {
        const Bits16 seen = lanes_of(v, visible[r]);
        x[v] = std::bit_cast<Floats16>((std::bit_cast<Bits16>(x[v]) & seen) | (kMinusInf & ~seen));
      }
    m_new[r] = max_of(t.m[r], max_lanes(max_of(max_of(x[0], x[1]), max_of(x[2], x[3]))) * scale);
  }
#pragma omp simd
  for (int64_t r = 0; r < rows; ++r) correction[r] = exp2_nonpositive(t.m[r] - m_new[r]);  // 0 at the first block
  for (int64_t r = 0; r < rows; ++r) {
    if (correction[r] != 1.0f) {  // a row whose maximum moved (x · 1 = x: the others keep their bits as they are)
#pragma omp simd
      for (int64_t d = 0; d < z.D; ++d) t.acc[r][d] *= correction[r];
      t.l16[r] *= correction[r];
    }
    Row p;
    std::memcpy(p.data(), t.s[r], sizeof(p));
    const Floats16 c = Floats16{} + scale, minus_m = Floats16{} - m_new[r];
    for (Floats16& x : p) x = exp2_nonpositive(fused_multiply_add(x, c, minus_m));
    if (visible[r] < kBlock)
      for (int64_t v = 0; v < kVectors; ++v)
        p[v] = std::bit_cast<Floats16>(std::bit_cast<Bits16>(p[v]) & lanes_of(v, visible[r]));
    t.l16[r] += ((p[0] + p[1]) + p[2]) + p[3];
    t.m[r] = m_new[r];
    store_pairs_of_keys<kNative>(p, t.along_keys[r]);
  }
}

// Heads [lo, hi) of the (batch, head) pairs of attention, in the calling thread's tiles.
template <bool kNative>
void heads_body(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const Problem& z,
                std::span<std::byte> workspace, int64_t bytes_per_thread, int64_t lo, int64_t hi) {
  const bf16_t *q = in[0].data<bf16_t>(), *k = in[1].data<bf16_t>(), *v = in[2].data<bf16_t>();
  bf16_t* o = out[0].data<bf16_t>();
  float* lse = out[1].data<float>();
  const int64_t rep = z.H / z.KV;
  Tiles& t = tiles_of<Tiles>(workspace, bytes_per_thread);
  const Keys kv = keys_of(t, n, z);
  for (int64_t bh = lo; bh < hi; ++bh) {
    const int64_t b = bh / z.H, h = bh % z.H, g = h / rep;
    if (bh == lo || h % rep == 0) load_keys(kv, k, v, z, b, g);  // a new kv head
    for (int64_t i0 = 0; i0 < z.T; i0 += kRows) {
      const int64_t rows = std::min(kRows, z.T - i0), keys = z.causal ? i0 + rows : z.S;
      load_rows(q, t.q, nullptr, z, b, h, i0, rows);
      for (int64_t r = 0; r < rows; ++r) {
        t.m[r] = -std::numeric_limits<float>::infinity(), t.l16[r] = Floats16{};
        std::fill(t.acc[r], t.acc[r] + z.D, 0.0f);
      }
      for (int64_t s0 = 0; s0 < keys; s0 += kBlock) {  // the online softmax, one block of keys at a time
        const int64_t cols = std::min(kBlock, keys - s0);
        scores(t, kv, z, rows, s0, cols);
        fold_block<kNative>(t, z, i0, rows, s0, cols);
        const int64_t key_pairs = (cols + 1) / 2;  // acc += p v
        product(t, {&t.along_keys[0][0], kBlock / 2, kv.vp + s0 / 2 * z.D, z.D, &t.acc[0][0], kMaxDh, key_pairs, true}, rows, z.D);
      }
      for (int64_t r = 0; r < rows; ++r) {
        t.l[r] = sum_lanes(t.l16[r]);
        bf16_t* orow = o + ((b * z.T + i0 + r) * z.H + h) * z.D;
        for (int64_t d = 0; d < z.D; ++d) orow[d] = float_to_bf16(t.acc[r][d] / t.l[r]);
        lse[(b * z.H + h) * z.T + i0 + r] = (t.m[r] + std::log2(t.l[r])) * std::numbers::ln2_v<float>;
      }
    }
  }
}

// The kernels for target I: with vcvtne2ps2bf16 where I is x86-64-v4 and pair_product runs vdpbf16ps.
template <Isa I, class... Args>
void heads_isa(Args&&... a) {
  if constexpr (I == Isa::x86_64_v4)
    if (pair_product_native()) return heads_body<true>(std::forward<Args>(a)...);
  heads_body<false>(std::forward<Args>(a)...);
}
REMAT_ISA_CLONES(heads, heads_isa)

// The block's probabilities p = 2^(q·kᵀ·c - lse·log2 e) and score gradients ds = p (dout·v - delta)·scale from the
// tile's products q kᵀ in s and dout vᵀ in g, two rows at a time in registers, rounded to bf16 pairs: p and ds along
// queries (rows r and r + 1 in a pair, a last odd row paired with zero), ds along keys. Columns a row does not see
// have p 0, those past `cols` ds 0 too.
template <bool kNative>
void block_pairs(Tiles& t, const Problem& z, int64_t i0, int64_t rows, int64_t s0, int64_t cols) {
  const float scale = static_cast<float>(z.scale);
  const Floats16 c = Floats16{} + scores_scale(z);
  // Selects below are bitwise, as fold_block's.
  auto row = [&](int64_t r, Row& p, Row& ds) {
    const int64_t visible = visible_keys(z, i0 + r, s0, cols);
    const Floats16 minus_l = Floats16{} - t.l[r];
    Row x, g;
    std::memcpy(x.data(), t.s[r], sizeof(x));
    std::memcpy(g.data(), t.g[r], sizeof(g));
    for (int64_t v = 0; v < kVectors; ++v) {
      const Bits16 in_block = lanes_of(v, cols);
      const Floats16 all = exp2_nonpositive(fused_multiply_add(x[v], c, minus_l));
      p[v] = std::bit_cast<Floats16>(std::bit_cast<Bits16>(all) & lanes_of(v, visible));
      ds[v] = std::bit_cast<Floats16>(std::bit_cast<Bits16>(p[v] * (g[v] - t.delta[r]) * scale) & in_block);
    }
    store_pairs_of_keys<kNative>(ds, t.along_keys[r]);
  };
  for (int64_t r = 0; r < rows; r += 2) {
    Row p0, ds0, p1{}, ds1{};
    row(r, p0, ds0);
    if (r + 1 < rows) row(r + 1, p1, ds1);
    for (int64_t v = 0; v < kVectors; ++v) {
      const Bits16 p_pair = pairs_of_rows<kNative>(p0[v], p1[v]), ds_pair = pairs_of_rows<kNative>(ds0[v], ds1[v]);
      std::memcpy(&t.p_along_queries[r / 2][16 * v], &p_pair, sizeof(p_pair));
      std::memcpy(&t.ds_along_queries[r / 2][16 * v], &ds_pair, sizeof(ds_pair));
    }
  }
}

// One block of keys of the backward, for the tile's rows: dvᵀ += doutᵀ p, dkᵀ += qᵀ ds, dq (acc) += ds k.
template <bool kNative>
void block_grad(Tiles& t, const Keys& kv, const Problem& z, int64_t i0, int64_t rows, int64_t s0, int64_t cols,
                float* dk_t, float* dv_t) {
  scores(t, kv, z, rows, s0, cols);
  product(t, {&t.dout[0][0], kPairsD, kv.vt + s0 * z.D / 2, kBlock, &t.g[0][0], kBlock, z.D / 2, false}, rows, cols);
  block_pairs<kNative>(t, z, i0, rows, s0, cols);
  const int64_t query_pairs = (rows + 1) / 2, key_pairs = (cols + 1) / 2;
  product(t, {&t.dout_t[0][0], kRows / 2, &t.p_along_queries[0][0], kBlock, dv_t + s0 * z.D, kBlock, query_pairs, true}, z.D, cols);
  product(t, {&t.q_t[0][0], kRows / 2, &t.ds_along_queries[0][0], kBlock, dk_t + s0 * z.D, kBlock, query_pairs, true}, z.D, cols);
  product(t, {&t.along_keys[0][0], kBlock / 2, kv.kp + s0 / 2 * z.D, z.D, &t.acc[0][0], kMaxDh, key_pairs, true}, rows, z.D);
}

// Key gradients of kv head g of batch b from their transposed accumulator x_t (a D x kBlock panel per block of
// keys): transposed in chunks of keys through the tile's acc, then rounded row by row.
void write_keys(const float* x_t, bf16_t* to, Tiles& t, const Problem& z, int64_t b, int64_t g) {
  int64_t chunk = kBlock;  // keys at a time: a divisor of kBlock, so a chunk stays in its panel, whose rows fit acc
  while (chunk * z.D > kRows * kMaxDh) chunk /= 2;
  float* rows = &t.acc[0][0];
  for (int64_t j0 = 0; j0 < z.S; j0 += chunk) {
    const int64_t keys = std::min(chunk, z.S - j0);
    transpose(x_t + j0 / kBlock * kBlock * z.D + j0 % kBlock, kBlock, rows, z.D, z.D, keys);  // rows[j·D + d]
    for (int64_t j = 0; j < keys; ++j) {
      bf16_t* row = to + ((b * z.S + j0 + j) * z.KV + g) * z.D;
      for (int64_t d = 0; d < z.D; ++d) row[d] = float_to_bf16(rows[j * z.D + d]);
    }
  }
}

// kv heads [lo, hi) of the (batch, kv head) pairs of attention_grad, in the calling thread's tiles.
template <bool kNative>
void grad_heads_body(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const Problem& z,
                     std::span<std::byte> workspace, int64_t bytes_per_thread, int64_t lo, int64_t hi) {
  const bf16_t *q = in[0].data<bf16_t>(), *k = in[1].data<bf16_t>(), *v = in[2].data<bf16_t>();
  const bf16_t *o = in[3].data<bf16_t>(), *dout = in[5].data<bf16_t>();
  const float* lse = in[4].data<float>();
  bf16_t *dq = out[0].data<bf16_t>(), *dk = out[1].data<bf16_t>(), *dv = out[2].data<bf16_t>();
  const int64_t rep = z.H / z.KV;
  Tiles& t = tiles_of<Tiles>(workspace, bytes_per_thread);
  const Keys kv = keys_of(t, n, z);
  // dkᵀ, then dvᵀ: per block of kBlock keys a D x kBlock panel (rows 256 bytes apart: as D rows of S, a block's
  // rows were a multiple of 4 KiB apart wherever S is a multiple of 1024, all in one set of the L1 cache)
  float* dk_t = reinterpret_cast<float*>(kv.kt + 4 * key_array(z.S, z.D));
  float* dv_t = dk_t + padded_keys(z.S) * z.D;
  for (int64_t bg = lo; bg < hi; ++bg) {
    const int64_t b = bg / z.KV, g = bg % z.KV;
    load_keys(kv, k, v, z, b, g);
    std::fill(dk_t, dk_t + 2 * padded_keys(z.S) * z.D, 0.0f);
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h)
      for (int64_t i0 = 0; i0 < z.T; i0 += kRows) {
        const int64_t rows = std::min(kRows, z.T - i0), keys = z.causal ? i0 + rows : z.S;
        load_rows(q, t.q, t.q_t, z, b, h, i0, rows);
        load_rows(dout, t.dout, t.dout_t, z, b, h, i0, rows);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t row = (b * z.T + i0 + r) * z.H + h;
          const bf16_t *dout_row = dout + row * z.D, *o_row = o + row * z.D;
          t.delta[r] = row_sum<float>(z.D, [&](int64_t d) { return load(dout_row[d]) * load(o_row[d]); });
          t.l[r] = lse[(b * z.H + h) * z.T + i0 + r] * std::numbers::log2e_v<float>;  // in base 2
          std::fill(t.acc[r], t.acc[r] + z.D, 0.0f);
        }
        for (int64_t s0 = 0; s0 < keys; s0 += kBlock)
          block_grad<kNative>(t, kv, z, i0, rows, s0, std::min(kBlock, keys - s0), dk_t, dv_t);
        for (int64_t r = 0; r < rows; ++r) {
          bf16_t* dqr = dq + ((b * z.T + i0 + r) * z.H + h) * z.D;
          for (int64_t d = 0; d < z.D; ++d) dqr[d] = float_to_bf16(t.acc[r][d]);
        }
      }
    write_keys(dk_t, dk, t, z, b, g);
    write_keys(dv_t, dv, t, z, b, g);
  }
}

template <Isa I, class... Args>
void grad_heads_isa(Args&&... a) {
  if constexpr (I == Isa::x86_64_v4)
    if (pair_product_native()) return grad_heads_body<true>(std::forward<Args>(a)...);
  grad_heads_body<false>(std::forward<Args>(a)...);
}
REMAT_ISA_CLONES(grad_heads, grad_heads_isa)

Problem even_problem_of(const ir::Node& n, std::span<const Array> in) {
  const Problem z = problem_of(n, in);
  CHECK(z.D % 2 == 0, "{}: bf16 flash attention pairs head dims and needs an even head_dim, got {}; use "
        "attention=dot_product or an f32 dtype for this model", ir::op_name(n.op), z.D);
  return z;
}

}  // namespace

int64_t workspace_bf16(const ir::Node& n, std::span<const ir::Type> in) {
  return static_cast<int64_t>(omp_get_max_threads()) * per_thread(n, in[1].shape[1], in[0].shape[3]);
}

void attention_bf16(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const Problem z = even_problem_of(n, in);
  const int64_t bytes_per_thread = per_thread(n, z.S, z.D);
  parallel_ranges(z.B * z.H, z.B * z.H * z.T * z.S * z.D >= kParallelMin, [&](int64_t lo, int64_t hi) {
    heads(n, in, out, z, ctx.workspace, bytes_per_thread, lo, hi);
  });
}

void attention_grad_bf16(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const Problem z = even_problem_of(n, in);
  const int64_t bytes_per_thread = per_thread(n, z.S, z.D);
  parallel_ranges(z.B * z.KV, z.B * z.H * z.T * z.S * z.D >= kParallelMin, [&](int64_t lo, int64_t hi) {
    grad_heads(n, in, out, z, ctx.workspace, bytes_per_thread, lo, hi);
  });
}

}  // namespace remat::exec::flash
