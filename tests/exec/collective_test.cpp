// The collective kernels across real processes: run without mpirun, each test starts this test binary under
// `mpirun -np 3` on itself; each rank runs the collective on its own operand and checks the result against
// what is formed here from every rank's operand (computed locally: the operands are a function of the rank)
// — sums in rank order from zero. all_reduce: a chunk per rank, uneven chunks, fewer elements than ranks;
// all_gather and reduce_scatter: along the leading dimension and an inner one. Dtypes f32 and bf16, with
// values where the order of the additions changes the result.
#include "exec/exec.h"
#include "exec/mesh.h"
#include "ir/ir.h"
#include "support/mpirun.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

namespace remat {
namespace {

constexpr int kRanks = 3;

// Rank r's element i: magnitudes far apart, so that (a + b) + c differs from a + (b + c) in f32 and bf16, and
// a factor that tells elements apart in bf16 too.
double operand(int rank, int64_t i) {
  const double big[] = {1e8, -1e8, 3.0, 7e7};
  return big[rank] * (1 + 0.125 * static_cast<double>(i % 7)) + 0.37 * static_cast<double>(i % 5) - static_cast<double>(rank);
}

// Runs `test` (this binary, filtered to it) under mpirun with `ranks` ranks; true when this process is such a
// rank and should run the collective.
bool as_ranks(const char* test, int ranks = kRanks) {
  if (exec::Mesh::launched_ranks() > 1) return true;
  if (!testing_support::mpirun_installed()) {
    ADD_FAILURE() << "mpirun is not installed (scripts/setup.sh installs it)";
    return false;
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const testing_support::Output o = testing_support::run_command(fmt::format(
      "{} '{}' --gtest_filter=Collectives.{} --gtest_color=no 2>&1", testing_support::mpirun(ranks), self, test));
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("[  PASSED  ] 1 test"), std::string::npos) << o.text;
  return false;
}

// The sum in f32 of the ranks' element i (each rounded to `part_dtype`), in rank order from zero, each sum
// rounded to `dtype` as the add op rounds it.
double rank_order_sum(DType dtype, int64_t i, int ranks = kRanks, DType part_dtype = DType::f32) {
  if (part_dtype == DType::f32) part_dtype = dtype;
  exec::Array sum(ir::Type{dtype, {1}}), part(ir::Type{part_dtype, {1}});
  sum.set(0, 0.0);
  for (int r = 0; r < ranks; ++r) {
    part.set(0, operand(r, i));
    sum.set(0, static_cast<double>(static_cast<float>(sum.get(0)) + static_cast<float>(part.get(0))));
  }
  return sum.get(0);
}

exec::Array run_collective(const exec::Mesh& mesh, DType dtype, const ir::Shape& shape,
                           const std::function<ir::Tensor(ir::Tensor)>& collective) {
  ir::Graph g;
  ir::Builder b(g);
  b.result(collective(b.param("x", {dtype, shape})));
  exec::Array x(ir::Type{dtype, shape});
  for (int64_t i = 0; i < x.size(); ++i) x.set(i, operand(mesh.rank(), i));
  return exec::run(g, std::vector<exec::Array>{x}, {.mesh = &mesh})[0];
}

TEST(Collectives, AllReduceSumsEveryRanksOperandInRankOrder) {
  if (!as_ranks("AllReduce*")) return;
  const exec::Mesh mesh({{"data", kRanks}});
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t{2}, int64_t{7}, int64_t{3000}}) {
      const exec::Array y = run_collective(mesh, dtype, {n}, [](ir::Tensor x) { return ir::all_reduce(x, "data", kRanks); });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(y.get(i), rank_order_sum(dtype, i)) << dtype_name(dtype) << " n=" << n << " element " << i << " on rank " << mesh.rank();
    }
  }
}

// [2, 3, 2] per rank, gathered along dim 0 ([6, 3, 2]) and dim 1 ([2, 9, 2]); element (a, b, c) of the result
// is rank r's element at the gathered index minus r's offset.
TEST(Collectives, AllGatherConcatenatesTheRanksOperandsInRankOrder) {
  if (!as_ranks("AllGather*")) return;
  const exec::Mesh mesh({{"data", kRanks}});
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t dim : {0, 1}) {
      const exec::Array y =
          run_collective(mesh, dtype, {2, 3, 2}, [&](ir::Tensor x) { return ir::all_gather(x, "data", kRanks, dim); });
      const int64_t d = dim == 0 ? 2 : 3;  // the gathered dimension's size on each rank
      exec::Array one(ir::Type{dtype, {1}});
      for (int64_t a = 0; a < (dim == 0 ? 2 * kRanks : 2); ++a)
        for (int64_t b = 0; b < (dim == 1 ? 3 * kRanks : 3); ++b)
          for (int64_t c = 0; c < 2; ++c) {
            const int64_t g = dim == 0 ? a : b, r = g / d, local_a = dim == 0 ? g % d : a, local_b = dim == 1 ? g % d : b;
            one.set(0, operand(static_cast<int>(r), (local_a * 3 + local_b) * 2 + c));
            const int64_t at = (a * (dim == 1 ? 3 * kRanks : 3) + b) * 2 + c;
            ASSERT_EQ(y.get(at), one.get(0)) << dtype_name(dtype) << " dim " << dim << " (" << a << "," << b << "," << c << ")";
          }
    }
  }
}

// [6, 3] per rank: the rank-order sum of all operands, this rank's block of rows (dim 0) or columns of a
// [2, 6] operand (dim 1).
TEST(Collectives, ReduceScatterKeepsThisRanksBlockOfTheRankOrderSum) {
  if (!as_ranks("ReduceScatter*")) return;
  const exec::Mesh mesh({{"data", kRanks}});
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t dim : {0, 1}) {
      const ir::Shape shape = dim == 0 ? ir::Shape{6, 3} : ir::Shape{2, 6};
      const exec::Array y = run_collective(mesh, dtype, shape, [&](ir::Tensor x) { return ir::reduce_scatter(x, "data", kRanks, dim); });
      const int64_t rows = dim == 0 ? 2 : 2, cols = dim == 0 ? 3 : 2;
      for (int64_t a = 0; a < rows; ++a)
        for (int64_t b = 0; b < cols; ++b) {
          const int64_t i = dim == 0 ? (mesh.rank() * 2 + a) * 3 + b : a * 6 + mesh.rank() * 2 + b;
          ASSERT_EQ(y.get(a * cols + b), rank_order_sum(dtype, i)) << dtype_name(dtype) << " dim " << dim << " (" << a << "," << b << ")";
        }
    }
  }
}

// A 2 x 2 mesh (data, fsdp), FSDP's collectives over the group "data,fsdp": an all_gather of the fsdp
// shards converted to bf16 before they are sent (the data-parallel replicas hold the same shard), the
// transpose's reduce_scatter of bf16 operands summed over all four ranks in f32, in rank order, each rank
// keeping the block of its fsdp coordinate, and an all_reduce over the group.
TEST(Collectives, GroupCollectivesSpanDataAndFsdp) {
  constexpr int kGroup = 4;
  if (!as_ranks("GroupCollectives*", kGroup)) return;
  const exec::Mesh mesh({{"data", 2}, {"fsdp", 2}});
  const int f = mesh.axis("fsdp").rank, data_rank = mesh.axis("data").rank;
  ASSERT_EQ(mesh.rank(), data_rank * 2 + f);
  ASSERT_EQ(mesh.axis("data,fsdp").rank, mesh.rank());
  // The replicas of a shard hold the same operand: rank (d, f) gathers the operands of ranks (0, 0) and (0, 1).
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor shard = b.param("x", {DType::f32, {2, 3}});
  b.result(ir::all_gather(shard, "data,fsdp", kGroup, 1, 2, DType::bf16));
  exec::Array x(ir::Type{DType::f32, {2, 3}});
  for (int64_t i = 0; i < x.size(); ++i) x.set(i, operand(f, i) + 0.001);
  const exec::Array gathered = exec::run(g, std::vector<exec::Array>{x}, {.mesh = &mesh})[0];
  ASSERT_EQ(gathered.type(), (ir::Type{DType::bf16, {2, 6}}));
  exec::Array one(ir::Type{DType::bf16, {1}});
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t c = 0; c < 6; ++c) {
      one.set(0, operand(static_cast<int>(c / 3), a * 3 + c % 3) + 0.001);
      ASSERT_EQ(gathered.get(a * 6 + c), one.get(0)) << "(" << a << "," << c << ") on rank " << mesh.rank();
    }

  const exec::Array scattered = run_collective(mesh, DType::bf16, {2, 4}, [](ir::Tensor t) {
    return ir::reduce_scatter(t, "data,fsdp", kGroup, 1, 2, DType::f32);
  });
  ASSERT_EQ(scattered.type(), (ir::Type{DType::f32, {2, 2}}));
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t c = 0; c < 2; ++c)
      ASSERT_EQ(scattered.get(a * 2 + c), rank_order_sum(DType::f32, a * 4 + f * 2 + c, kGroup, DType::bf16))
          << "(" << a << "," << c << ") on rank " << mesh.rank();

  const exec::Array summed = run_collective(mesh, DType::f32, {5}, [](ir::Tensor t) { return ir::all_reduce(t, "data,fsdp", kGroup); });
  for (int64_t i = 0; i < 5; ++i) ASSERT_EQ(summed.get(i), rank_order_sum(DType::f32, i, kGroup)) << i;
}

// One check (axis_of, exec/kernels/kernels.h) guards every kernel that runs along a mesh axis: a collective and the
// messages alike fail on a mesh whose axis has other ranks than they were compiled for, naming the op, its scope
// and the axis; without a mesh a collective says to run under mpirun. In one process, without mpirun.
TEST(MeshAxisCheck, CollectivesAndMessagesFailAlikeOffTheirMesh) {
  auto error = [](const exec::Mesh* mesh, const std::function<ir::Tensor(ir::Builder&, ir::Tensor)>& op) {
    ir::Graph g;
    ir::Builder b(g);
    const ir::Type t{DType::f32, {4}};
    ir::Tensor x = b.param("x", t);
    {
      auto s = b.scope("stage0");
      b.result(op(b, x));
    }
    try {
      exec::run(g, std::vector<exec::Array>{exec::Array(t)}, {.mesh = mesh});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto all_reduce = [](ir::Builder&, ir::Tensor x) { return ir::all_reduce(x, "data", 2); };
  auto send = [](ir::Builder&, ir::Tensor x) { return ir::send_done(ir::send(x, "data", 2, 1, 0)); };
  auto recv = [](ir::Builder& b, ir::Tensor x) { return x + ir::recv(b, x.type(), "data", 2, 1, 0); };
  const exec::Mesh one({{"data", 1}});
  const std::string wrong = " (scope 'stage0') was compiled for 2 ranks along 'data', the mesh has 1";
  EXPECT_NE(error(&one, all_reduce).find("all_reduce" + wrong), std::string::npos) << error(&one, all_reduce);
  EXPECT_NE(error(&one, send).find("send" + wrong), std::string::npos) << error(&one, send);
  EXPECT_NE(error(&one, recv).find("recv" + wrong), std::string::npos) << error(&one, recv);
  const std::string none = " along mesh axis 'data' (scope 'stage0') needs a mesh: run under mpirun";
  EXPECT_NE(error(nullptr, all_reduce).find("all_reduce" + none), std::string::npos) << error(nullptr, all_reduce);
}

}  // namespace
}  // namespace remat
