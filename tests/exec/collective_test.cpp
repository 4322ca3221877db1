// The all_reduce kernel across real processes: run without mpirun, the test starts this test binary under
// `mpirun -np 3` on itself; each rank reduces its own operand and checks the result against the sum formed
// here, in rank order from zero, of every rank's operand (computed locally: the operands are a function of
// the rank). Sizes cover a chunk per rank, uneven chunks and fewer elements than ranks; dtypes f32 and bf16,
// with values where the order of the additions changes the result.
#include "exec/exec.h"
#include "exec/mesh.h"
#include "ir/ir.h"
#include "support/command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

namespace remat {
namespace {

constexpr int kRanks = 3;

// Rank r's element i: magnitudes far apart, so that (a + b) + c differs from a + (b + c) in f32 and bf16.
double operand(int rank, int64_t i) {
  const double big[kRanks] = {1e8, -1e8, 3.0};
  return big[rank] + 0.37 * static_cast<double>(i % 5) - static_cast<double>(rank);
}

TEST(Collectives, AllReduceSumsEveryRanksOperandInRankOrder) {
  if (exec::Mesh::launched_ranks() == 1) {  // the driver: this binary again, under mpirun
    if (testing_support::run_command("command -v mpirun").status != 0) GTEST_SKIP() << "mpirun not installed (scripts/setup.sh)";
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const testing_support::Output o = testing_support::run_command(fmt::format(
        "{}mpirun --oversubscribe --bind-to none{} -np {} '{}' --gtest_filter=Collectives.AllReduce* --gtest_color=no 2>&1",
        exec::kAddressSanitizer ? "ASAN_OPTIONS=detect_leaks=0 " : "", geteuid() == 0 ? " --allow-run-as-root" : "",
        kRanks, self));
    EXPECT_EQ(o.status, 0) << o.text;
    EXPECT_NE(o.text.find("[  PASSED  ] 1 test"), std::string::npos) << o.text;
    return;
  }
  const exec::Mesh mesh({{"data", kRanks}});
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t n : {int64_t{2}, int64_t{7}, int64_t{3000}}) {
      ir::Graph g;
      ir::Builder b(g);
      b.result(ir::all_reduce(b.param("x", {dtype, {n}}), "data", kRanks));
      exec::Array x(ir::Type{dtype, {n}});
      for (int64_t i = 0; i < n; ++i) x.set(i, operand(mesh.rank(), i));
      const exec::Array y = exec::run(g, std::vector<exec::Array>{x}, {.mesh = &mesh})[0];
      for (int64_t i = 0; i < n; ++i) {
        exec::Array sum(ir::Type{dtype, {1}}), part(ir::Type{dtype, {1}});
        sum.set(0, 0.0);
        for (int r = 0; r < kRanks; ++r) {  // in f32, each sum rounded to the dtype (set), as the add op does
          part.set(0, operand(r, i));
          sum.set(0, static_cast<double>(static_cast<float>(sum.get(0)) + static_cast<float>(part.get(0))));
        }
        ASSERT_EQ(y.get(i), sum.get(0)) << dtype_name(dtype) << " n=" << n << " element " << i << " on rank " << mesh.rank();
      }
    }
  }
}

}  // namespace
}  // namespace remat
