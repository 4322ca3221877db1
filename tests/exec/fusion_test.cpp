// The fusion kernel and the fused step. The kernel, over tiles that cut rows and across threads, against a
// plain loop (an independent route to every broadcast's indexing) and against the unfused ops bit for bit;
// the whole training step fused and unfused (`fusion: false`) gives the same bits, on tiny and on a
// grouped-query double scan in bf16, and its planned arena is smaller.
#include "cli/config.h"
#include "compile/compile.h"
#include "exec/executable.h"
#include "exec/kernels/exp.h"
#include "support/training_steps.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace remat {
namespace {

using namespace ir;
using testing_support::count_ops;
using testing_support::same_bits;
using testing_support::StepRun;
using testing_support::train_steps;

// y = exp(x · c[i,j]) + r[k];  z = (y > u[i,0,k] ? y : s) as bf16, over [3,1000,7]: 21000 elements, ten tiles
// of 2048 that start mid-row, on every thread.
TEST(FusionKernel, BroadcastsAndChainsAcrossTilesEqualAPlainLoopAndTheUnfusedOps) {
  const int64_t I = 3, J = 1000, K = 7;
  Graph g;
  Builder b(g);
  const Shape shape{I, J, K};
  Tensor x = b.param("x", {DType::f32, shape}), c = b.param("c", {DType::f32, {I, J}});
  Tensor r = b.param("r", {DType::f32, {K}}), u = b.param("u", {DType::f32, {I, 1, K}}), s = b.param("s", {DType::f32, {}});
  Tensor y = exp(x * broadcast_in_dim(c, shape, {0, 1})) + broadcast_in_dim(r, shape, {2});
  Tensor z = convert(select(compare(y, broadcast_in_dim(u, shape, {0, 1, 2}), "gt"), y, broadcast_in_dim(s, shape, {})),
                     DType::bf16);
  b.result(y);
  b.result(z);
  Graph fused = g.clone();
  fuse(fused);
  verify(fused);
  ASSERT_EQ(count_ops(fused, Op::fusion), 1) << print(fused);
  ASSERT_EQ(count_ops(fused, Op::broadcast_in_dim), 4) << "each broadcast inside the fusion only";
  ASSERT_EQ(fused.nodes.size(), 1u) << print(fused);

  std::mt19937 rng(7);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<exec::Array> args;
  for (ValueId p : g.params) {
    args.emplace_back(g.type(p));
    for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, dist(rng));
  }
  const std::vector<exec::Array> want = exec::run(g, args), got = exec::run(fused, args);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(same_bits(got[0], want[0]));
  EXPECT_TRUE(same_bits(got[1], want[1]));
  const float* xs = args[0].data<float>();
  const float *cs = args[1].data<float>(), *rs = args[2].data<float>(), *us = args[3].data<float>(), sv = args[4].data<float>()[0];
  int64_t wrong = 0;
  for (int64_t i = 0; i < I; ++i)
    for (int64_t j = 0; j < J; ++j)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t at = (i * J + j) * K + k;
        const float yv = exec::exp_f32(xs[at] * cs[i * J + j]) + rs[k];  // the kernels' exp (exp_test)
        const float zv = yv > us[i * K + k] ? yv : sv;
        wrong += got[0].data<float>()[at] != yv || got[1].data<bf16_t>()[at].bits != float_to_bf16(zv).bits;
      }
  EXPECT_EQ(wrong, 0);
}

// A fusion's kernel needs a workspace (its tiles); a plan made without the backend's answer is refused when the
// executable is built, naming the fusion, not by the kernel mid-run.
TEST(FusionKernel, APlanWithoutItsWorkspaceIsRefusedUpFront) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {4, 4096}});
  b.result(exp(x * x) + x);
  fuse(g);
  ASSERT_EQ(count_ops(g, Op::fusion), 1) << print(g);
  try {
    exec::Executable e(g.clone(), plan::build(g, {}));
    FAIL() << "a fusion planned without workspace was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("fusion"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("of workspace and the plan has 0 B"), std::string::npos) << e.what();
  }
}

class FusedStep : public testing::TestWithParam<std::vector<std::string>> {};

// The layer's elementwise chains are ops of their own (rms_norm, swiglu, the masked softmax), so what fuses is the
// rest (the RoPE tables, the sum of the q, k, v projections' input cotangents, the optimizer's scalars): bits
// unchanged, and a plan no larger.
TEST_P(FusedStep, IsBitIdenticalToTheUnfusedStepAndPlansNoMore) {
  std::vector<std::string> on = GetParam(), off = GetParam();
  off.push_back("fusion=false");
  const StepRun fused = train_steps(on, 2), unfused = train_steps(off, 2);
  EXPECT_EQ(unfused.fusions, 0);
  EXPECT_GT(fused.fusions, 5);
  ASSERT_EQ(fused.results.size(), unfused.results.size());
  for (size_t i = 0; i < fused.results.size(); ++i) EXPECT_TRUE(same_bits(fused.results[i], unfused.results[i])) << "result " << i;
  EXPECT_LE(fused.peak, unfused.peak);
  std::printf("planned arena: fused %lld B, unfused %lld B; %d fusions\n", static_cast<long long>(fused.peak),
              static_cast<long long>(unfused.peak), fused.fusions);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, FusedStep,
    testing::Values(std::vector<std::string>{"remat_policy=full"},
                    std::vector<std::string>{"remat_policy=minimal", "dtype=bfloat16", "base_num_query_heads=4",
                                             "base_num_kv_heads=2", "base_num_decoder_layers=4", "layers_per_group=2",
                                             "per_device_batch_size=4"}),
    [](const testing::TestParamInfo<std::vector<std::string>>& info) { return info.index == 0 ? "tiny" : "gqa_double_scan_bf16"; });

}  // namespace
}  // namespace remat
