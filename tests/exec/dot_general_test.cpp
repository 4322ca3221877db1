// The oneDNN dot_general against its reference twin: random shapes with batch dims, every transpose
// combination of the operands, and layouts that need a copy.
#include "exec/exec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace remat {
namespace {

using namespace ir;

// Builds lhs/rhs with dims in the given storage orders: each operand is described by the logical groups
// [batch, free, contract] and a permutation saying how they are laid out in memory.
struct Layout {
  int64_t batch, m, k, n;
  IntList lhs_perm;  // storage order of lhs logical dims (b, m, k) -- b absent when batch == 0
  IntList rhs_perm;  // storage order of rhs logical dims (b, k, n)
};

void check_layout(const Layout& L, std::mt19937& rng, DType dtype = DType::f32) {
  bool has_batch = L.batch > 0;
  Shape lhs_logical = has_batch ? Shape{L.batch, L.m, L.k} : Shape{L.m, L.k};
  Shape rhs_logical = has_batch ? Shape{L.batch, L.k, L.n} : Shape{L.k, L.n};
  Shape ls, rs;
  for (int64_t d : L.lhs_perm) ls.push_back(lhs_logical[static_cast<size_t>(d)]);
  for (int64_t d : L.rhs_perm) rs.push_back(rhs_logical[static_cast<size_t>(d)]);
  auto pos = [](const IntList& perm, int64_t logical) {
    return static_cast<int64_t>(std::find(perm.begin(), perm.end(), logical) - perm.begin());
  };
  int64_t o = has_batch ? 1 : 0;
  DotDims dims{{pos(L.lhs_perm, o + 1)}, {pos(L.rhs_perm, o)}, {}, {}};
  if (has_batch) dims.lhs_batch = {pos(L.lhs_perm, 0)}, dims.rhs_batch = {pos(L.rhs_perm, 0)};
  Graph g;
  Builder b(g);
  b.result(dot_general(b.param("a", {dtype, ls}), b.param("b", {dtype, rs}), dims));
  std::uniform_real_distribution<float> dist(-1, 1);
  exec::Array a(g.type(g.params[0])), c(g.type(g.params[1]));
  for (int64_t i = 0; i < a.size(); ++i) a.set(i, dist(rng));
  for (int64_t i = 0; i < c.size(); ++i) c.set(i, dist(rng));
  std::vector<exec::Array> args{a, c};
  exec::Array fast = exec::run(g, args)[0];
  exec::Array ref = exec::run(g, args, exec::Options{.reference_kernels = true})[0];
  ASSERT_EQ(fast.type(), ref.type());
  // bf16: both round an f32 sum to bf16, summed in other orders: one bf16 step of the value apart at most.
  for (int64_t i = 0; i < fast.size(); ++i)
    ASSERT_NEAR(fast.get(i), ref.get(i),
                1e-5 * (1 + std::sqrt(static_cast<double>(L.k))) + (dtype == DType::bf16 ? std::abs(ref.get(i)) / 128 : 0))
        << print(g) << " at element " << i;
}

TEST(DotGeneral, OneDnnMatchesReferenceOnAllLayouts) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> size(1, 17);
  for (int trial = 0; trial < 6; ++trial) {
    for (int64_t batch : {0, 1, 3}) {
      IntList lp(batch ? 3 : 2), rp(batch ? 3 : 2);
      std::iota(lp.begin(), lp.end(), 0);
      do {
        std::iota(rp.begin(), rp.end(), 0);
        do {
          for (DType dtype : {DType::f32, DType::bf16})
            check_layout(Layout{batch ? size(rng) % 4 + 1 : 0, size(rng), size(rng), size(rng), lp, rp}, rng, dtype);
        } while (std::next_permutation(rp.begin(), rp.end()));
      } while (std::next_permutation(lp.begin(), lp.end()));
    }
  }
}

// A contraction longer than both output sides runs as fixed output tiles on every CPU (128 x 256 here, one oneDNN
// call each, thread-count invariant; bf16 widened to f32 where oneDNN has no bf16 matmul): whole tiles and a last
// row and column of tiles in every layout without batch dims, a last row of tiles in every layout with them, f32
// and bf16 (with batch dims alternately, one layout each: the reference kernel is slow under the sanitizers).
TEST(DotGeneral, TiledMatmulsMatchReferenceOnAllLayouts) {
  std::mt19937 rng(11);
  for (int64_t batch : {0, 2}) {
    IntList lp(batch ? 3 : 2), rp(batch ? 3 : 2);
    std::iota(lp.begin(), lp.end(), 0);
    int layout = 0;
    do {
      std::iota(rp.begin(), rp.end(), 0);
      do {
        const Layout l = batch ? Layout{batch, 129, 130, 100, lp, rp} : Layout{0, 130, 270, 260, lp, rp};
        for (DType dtype : {DType::f32, DType::bf16})
          if (!batch || (dtype == DType::bf16) == (layout % 2 == 1)) check_layout(l, rng, dtype);
        ++layout;
      } while (std::next_permutation(rp.begin(), rp.end()));
    } while (std::next_permutation(lp.begin(), lp.end()));
  }
}

// bf16 tiles of brgemm grow with the output (tile_shape): [770,385]^T x [770,769], a weight gradient's layout and
// the plain one, run as 192 x 384 tiles with a last row and column of one element (where bf16 is widened to f32,
// as 128 x 256 tiles); a weight gradient with a short contraction, [64,385]^T x [64,769], as the same tiles (the
// long contractions not under the sanitizers: the reference kernel took 9 s there).
TEST(DotGeneral, GrownBf16TilesMatchReference) {
  std::mt19937 rng(13);
  check_layout(Layout{0, 385, 64, 769, {1, 0}, {0, 1}}, rng, DType::bf16);
  if (exec::kAddressSanitizer) return;
  check_layout(Layout{0, 385, 770, 769, {1, 0}, {0, 1}}, rng, DType::bf16);
  check_layout(Layout{0, 385, 770, 769, {0, 1}, {0, 1}}, rng, DType::bf16);
}

// A tiled matmul with no rows or no columns (the tiles' sides are at least 1: no division by an empty side).
TEST(DotGeneral, TiledMatmulsWithAnEmptyOutput) {
  std::mt19937 rng(19);
  for (DType dtype : {DType::f32, DType::bf16}) {
    check_layout(Layout{0, 0, 300, 100, {1, 0}, {0, 1}}, rng, dtype);
    check_layout(Layout{0, 100, 300, 0, {1, 0}, {1, 0}}, rng, dtype);
  }
}

// f32 tiles of a long contraction read a swapped rhs from a copy in order where it is no larger than twice the
// output (transposes_rhs): [200,300] x [100,300]^T, [200,390] x [300,390]^T (a last column of tiles), and
// [3,200,300] x [3,100,300]^T with batch dims.
TEST(DotGeneral, TilesReadASwappedRhsFromATransposedCopy) {
  std::mt19937 rng(17);
  check_layout(Layout{0, 200, 300, 100, {0, 1}, {1, 0}}, rng);
  check_layout(Layout{0, 200, 390, 300, {0, 1}, {1, 0}}, rng);
  check_layout(Layout{3, 200, 300, 100, {0, 1, 2}, {0, 2, 1}}, rng);
}

// Where a tile's operand rows are a multiple of 4 KiB apart (they would share an L1 set), the tile reads a copy of
// them with longer rows: an rhs of 1024 f32 columns, one stored transposed with 1024 f32 contracted elements, and
// an lhs stored transposed with 1024 f32 rows. The contractions are longer than the output sides, so they run as
// tiles on every CPU.
TEST(DotGeneral, TilesReadOperandRowsFourKibApartFromACopy) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::f32, DType::bf16}) {
    check_layout(Layout{0, 70, 1040, 1024, {0, 1}, {0, 1}}, rng, dtype);
    check_layout(Layout{0, 130, 1024, 270, {0, 1}, {1, 0}}, rng, dtype);
    check_layout(Layout{0, 1024, 1040, 60, {1, 0}, {0, 1}}, rng, dtype);
  }
}

// A matrix rhs read by 2048 rows or more is packed into oneDNN's blocked layout first (on CPUs where the matmul is
// oneDNN's brgemm, AVX-512; elsewhere these run the unpacked paths): stored and stored transposed, with output
// sides that are no multiple of the blocks, f32 and bf16, against the reference.
TEST(DotGeneral, ManyRowsReadTheirRhsPacked) {
  std::mt19937 rng(3);
  for (DType dtype : {DType::f32, DType::bf16})
    for (const IntList& rhs : {IntList{0, 1}, IntList{1, 0}})
      for (const IntList& lhs : {IntList{0, 1}, IntList{1, 0}}) check_layout(Layout{0, 2048, 72, 90, lhs, rhs}, rng, dtype);
}

// An rhs whose dims are in neither order is copied into [K, N] first, then packed from the copy: x [2048, 8, 12]
// times w [8, 160, 12], contracted over their 8 and 12.
TEST(DotGeneral, ARhsCopiedIntoOrderIsPackedFromTheCopy) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (DType dtype : {DType::f32, DType::bf16}) {
    Graph g;
    Builder b(g);
    Tensor x = b.param("x", {dtype, {2048, 8, 12}}), w = b.param("w", {dtype, {8, 160, 12}});
    b.result(dot_general(x, w, DotDims{{1, 2}, {0, 2}, {}, {}}));
    std::vector<exec::Array> args{exec::Array(x.type()), exec::Array(w.type())};
    for (auto& a : args)
      for (int64_t i = 0; i < a.size(); ++i) a.set(i, dist(rng));
    exec::Array fast = exec::run(g, args)[0], ref = exec::run(g, args, {.reference_kernels = true})[0];
    EXPECT_EQ(type_str(fast.type()), std::string(dtype_name(dtype)) + "[2048,160]");
    for (int64_t i = 0; i < fast.size(); ++i)
      ASSERT_NEAR(fast.get(i), ref.get(i), 1e-4 + (dtype == DType::bf16 ? std::abs(ref.get(i)) / 128 : 0)) << i;
  }
}

TEST(DotGeneral, MultiDimFreeAndBatchGroups) {
  // x [B, T, H, D] . w [D, H, F]? Use a projection with two free dims and a two-dim batch.
  Graph g;
  Builder b(g);
  Tensor q = b.param("q", {DType::f32, {2, 5, 3, 4}});  // [batch, seq, heads, dim]
  Tensor k = b.param("k", {DType::f32, {2, 6, 3, 4}});
  b.result(dot_general(q, k, DotDims{{3}, {3}, {0, 2}, {0, 2}}));  // -> [batch, heads, seq_q, seq_k]
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<exec::Array> args{exec::Array(q.type()), exec::Array(k.type())};
  for (auto& a : args)
    for (int64_t i = 0; i < a.size(); ++i) a.set(i, dist(rng));
  exec::Array fast = exec::run(g, args)[0], ref = exec::run(g, args, {.reference_kernels = true})[0];
  EXPECT_EQ(type_str(fast.type()), "f32[2,3,5,6]");
  for (int64_t i = 0; i < fast.size(); ++i) ASSERT_NEAR(fast.get(i), ref.get(i), 1e-5);
}

}  // namespace
}  // namespace remat
