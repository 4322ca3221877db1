// How dot_general (dot_general.cpp) decomposes a matmul, from its shapes alone: whether it runs as fixed output
// tiles (never the thread count decides: the bits depend on the decomposition), each tile's shape, and which
// operands the tiles read from a copy. Included by dot_general.cpp alone.
#pragma once

#include "base/dtype.h"

#include <algorithm>
#include <cstdint>

namespace remat::exec {

// The matmul's sizes: B batch entries of (M, K) x (K, N).
struct Sizes {
  int64_t B = 1, M = 1, K = 1, N = 1;
};

constexpr int64_t kTileRows = 128, kTileCols = 256;  // a fixed output tile's rows and columns, unless grown

// A fixed output tile's rows and columns (at most M and N).
struct TileShape {
  int64_t rows = 0, cols = 0;
};

// The tile of a tiled matmul, from the shapes alone (never the thread count: a tile's bits depend on its shape).
// Each tile's call packs its K-long rows of lhs and columns of rhs, work that per FLOP falls as 1/rows + 1/cols:
// a grown tile (bf16, not widened, read in place) is up to 3x kTileRows x kTileCols (the medium MLP's weight
// gradients at 4096 tokens, [4096,3072]^T x [4096,768]: 524 -> 722 GFLOP/s), its longer side halved while fewer
// than 8 tiles would be left for the threads ([4096,768]^T x [4096,768]: 192 x 384). f32 tiles ran as fast at
// every size. A side is at least 1 (an empty output has no tiles).
inline TileShape tile_shape(const Sizes& z, bool grow) {
  const TileShape least{std::clamp<int64_t>(z.M, 1, kTileRows), std::clamp<int64_t>(z.N, 1, kTileCols)};
  if (!grow) return least;
  constexpr int64_t kMinTiles = 8;
  auto count = [&](const TileShape& t) { return z.B * ((z.M + t.rows - 1) / t.rows) * ((z.N + t.cols - 1) / t.cols); };
  TileShape t{std::clamp<int64_t>(z.M, 1, 3 * kTileRows), std::clamp<int64_t>(z.N, 1, 3 * kTileCols)};
  while (count(t) < kMinTiles && (t.rows > least.rows || t.cols > least.cols)) {
    if (t.cols > least.cols && t.cols * kTileRows >= t.rows * kTileCols)
      t.cols = std::max(least.cols, t.cols / 2);
    else
      t.rows = std::max(least.rows, t.rows / 2);
  }
  return t;
}

inline bool long_contraction(const Sizes& z) { return z.K > z.M && z.K > z.N; }

// A bf16 product without batch dims whose lhs is stored transposed — a weight gradient, [tokens, m]^T x
// [tokens, n] — runs faster as grown tiles than as one brgemm matmul: WeightGradient/2048/768/3072 558-626 ->
// 690-729 GFLOP/s, /2048/768/32000 (the logits') 568-600 -> 703-753, none slower (f32: no change either way).
inline bool tiles_faster(const Sizes& z, bool lhs_swapped, DType dtype) {
  return dtype == DType::bf16 && z.B == 1 && lhs_swapped;
}

// Whether f32 tiles read their swapped rhs from a copy in [K, N] order: oneDNN's single-threaded f32 matmul
// (gemm:jit) read a long contraction's transposed rhs slowly, [2048,3072] x [768,3072]^T (the medium MLP's input
// gradients) 35-38 -> 28.4 ms with the copy (0.7 ms: transpose_blocks); where the copy is no larger than twice the
// output, so the workspace it adds stays within the matmul's own size (the logits' [768, vocab] would add 98 MB at
// the backward's start for 10%).
inline bool transposes_rhs(const Sizes& z, bool rhs_swapped, DType dtype) {
  return dtype == DType::f32 && rhs_swapped && long_contraction(z) && z.K <= 2 * z.M;
}

// Where a tile's operand is read from a copy: widened, or where its rows are a multiple of 4 KiB apart (they
// would share an L1 set: oneDNN's f32 GEMM without AVX-512 ran 2.7x slower on [2048,768] x [768,3072]; it packs
// an lhs that is not swapped itself). The copy's rows are 64 bytes longer than the tile's: the lhs's `rows`
// (swapped) or K long, the rhs's K (swapped) or `cols`.
inline int64_t copied_ld(int64_t tile_row, int64_t in_place_row, bool copy_aliasing, bool widened, int64_t element_size) {
  if (!widened && !(copy_aliasing && in_place_row * element_size % 4096 == 0)) return 0;
  return tile_row + 64 / element_size;
}

}  // namespace remat::exec
