// The number of OpenMP threads never changes a result's bits: one process with every core and a rank with one
// thread must train identically (the MPI tests compare exactly those). Whole training steps at 1, 2 and 3
// threads — tiny and a grouped-query double scan, f32 and bf16, dot_product and flash attention, fusion on —
// against each other bit for bit. Every kernel splits work across threads by output (each output computed by one
// thread, in a fixed order), and so do the matmuls (the test below).
#include "exec/exec.h"
#include "support/training_steps.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

namespace remat {
namespace {

struct Case {
  std::string name;
  std::vector<std::string> overrides;
};

// Restores the process's OpenMP thread count at the end of the scope.
struct ThreadCount {
  const int saved = omp_get_max_threads();
  explicit ThreadCount(int n) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved); }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ThreadCountInvariance : public testing::TestWithParam<Case> {};

TEST_P(ThreadCountInvariance, OneStepIsBitIdenticalAtOneTwoAndThreeThreads) {
  std::vector<std::string> overrides = GetParam().overrides;
  // The sanitizer build runs ~10x slower: fewer tokens there, still over the kernels' parallel thresholds.
  overrides.push_back(exec::kAddressSanitizer ? "per_device_batch_size=2" : "per_device_batch_size=4");
  std::vector<testing_support::StepRun> runs;
  for (int threads : {1, 2, 3}) {
    ThreadCount guard(threads);
    runs.push_back(testing_support::train_steps(overrides, 1));
  }
  ASSERT_GT(runs[0].fusions, 0) << "fusion on";
  for (size_t t = 1; t < runs.size(); ++t) {
    ASSERT_EQ(runs[t].results.size(), runs[0].results.size());
    for (size_t i = 0; i < runs[0].results.size(); ++i)
      EXPECT_TRUE(testing_support::same_bits(runs[t].results[i], runs[0].results[i]))
          << "result " << i << " at " << t + 1 << " threads differs from 1 thread";
  }
}

// oneDNN picks a matmul's thread decomposition from the shape and the thread count, and splitting the
// contraction across threads changes the order of its sums. Bit-identical at 1, 2 and 3 threads: the shapes of
// a step (weight gradients summing over the tokens, with d_model-sized outputs), batched ones, and few outputs
// with a long contraction — [K,16]^T x [K,24], which oneDNN 2.6's f32 brgemm splits over K at 2 threads, so the
// kernel runs it (like every matmul whose contraction is longer than its output sides, and bf16 weight gradients)
// as fixed output tiles: grown bf16 tiles, and f32 tiles reading a swapped rhs from a copy in order, among them.
TEST(ThreadCountInvariance, MatmulsWithLongContractionsAreBitIdentical) {
  const int64_t tokens = exec::kAddressSanitizer ? 4096 : 32768;
  struct Shape {
    ir::Shape lhs, rhs;
    ir::DotDims dims;
  };
  const std::vector<Shape> shapes = {
      {{tokens, 128}, {tokens, 128}, {{0}, {0}, {}, {}}},      // [K,M] x [K,N] -> [M,N]: a weight gradient
      {{64, tokens}, {tokens, 64}, {{1}, {0}, {}, {}}},        // [M,K] x [K,N]
      {{4, 8, tokens}, {4, tokens, 8}, {{2}, {1}, {0}, {0}}},  // batched
      {{tokens, 16}, {tokens, 24}, {{0}, {0}, {}, {}}},        // few outputs
      {{4096, 300}, {4096, 200}, {{0}, {0}, {}, {}}},          // tiles with a last row and column
      {{1024, 385}, {1024, 769}, {{0}, {0}, {}, {}}},          // bf16: grown tiles (192 x 384), a last row and column
      {{2048, 256}, {2048, 1024}, {{0}, {0}, {}, {}}},         // f32: outputs enough for oneDNN to split them
      {{1024, 256}, {1024, 2048}, {{0}, {0}, {}, {}}},         // bf16: a weight gradient's tiles, K short
      {{1024, 1536}, {128, 1536}, {{1}, {1}, {}, {}}},         // f32: tiles reading the rhs transposed, in order
      {{2048, 96}, {96, 160}, {{1}, {0}, {}, {}}},             // many rows: the rhs packed (a projection)
      {{2048, 96}, {160, 96}, {{1}, {1}, {}, {}}},             // the same, the rhs stored transposed
  };
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const Shape& s : shapes) {
      ir::Graph g;
      ir::Builder b(g);
      b.result(ir::dot_general(b.param("a", {dtype, s.lhs}), b.param("b", {dtype, s.rhs}), s.dims));
      std::vector<exec::Array> args;
      for (ir::ValueId p : g.params) {
        args.emplace_back(g.type(p));
        for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, std::sin(0.37 * static_cast<double>(i)));
      }
      std::vector<exec::Array> out;
      for (int threads : {1, 2, 3}) {
        ThreadCount guard(threads);
        out.push_back(exec::run(g, args)[0]);
        EXPECT_TRUE(testing_support::same_bits(out.back(), out.front()))
            << ir::print(g) << "at " << threads << " threads differs from 1 thread";
      }
    }
}

std::vector<Case> cases() {
  std::vector<Case> all;
  const std::vector<std::string> gqa_double_scan = {"base_num_query_heads=4", "base_num_kv_heads=2",
                                                    "base_num_decoder_layers=4", "layers_per_group=2",
                                                    "remat_policy=minimal"};
  for (const bool double_scan : {false, true})
    for (const std::string dtype : {"float32", "bfloat16"})
      for (const std::string attention : {"dot_product", "flash"}) {
        Case c{.name = fmt::format("{}_{}_{}", double_scan ? "gqa_double_scan" : "tiny", dtype, attention),
               .overrides = {"dtype=" + dtype, "attention=" + attention}};
        if (double_scan) c.overrides.insert(c.overrides.end(), gqa_double_scan.begin(), gqa_double_scan.end());
        all.push_back(c);
      }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Configs, ThreadCountInvariance, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace remat
