// `remat explain`'s runs/step column (Explanation::runs, counted from the differentiated graph) against the
// profiler's count of real kernel calls when that graph runs: equal for every op, under policies that
// recompute, save and offload, with scanned and double-scanned layers.
#include "remat/remat.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

namespace remat {
namespace {

class ExplainRuns : public testing::TestWithParam<std::tuple<std::string, int64_t>> {};

TEST_P(ExplainRuns, RunsPerStepAreTheExecutedKernelCalls) {
  auto [policy, group] = GetParam();
  nn::ModelConfig c = testing_support::micro_model(4, true, policy);
  c.layers_per_group = group;
  rematerialize::Decider decider;
  ir::Graph step = train::grads_program(c, {2, 8, 1}, &decider).graph;
  rematerialize::Explanation e = rematerialize::explain(decider.records(), nn::loss_graph(c, 2, 8), step);
  std::vector<exec::Array> args = nn::init_params(c, 1);
  args.push_back(exec::Array::zeros({DType::i32, {1, 2, 8}}));
  args.push_back(exec::Array::zeros({DType::i32, {1, 2, 8}}));
  exec::Profile profile;
  exec::run(step, args, {.profile = &profile});
  EXPECT_EQ(e.runs, profile.runs_by_origin) << policy;
  // The column itself: every residual that is not a region input shows its producer's executed count.
  int rows = 0;
  for (const rematerialize::ResidualRecord& r : e.residuals) {
    if (r.region_input) continue;
    ++rows;
    EXPECT_EQ(e.runs.at(r.origin), profile.runs_by_origin.at(r.origin)) << r.what;
    EXPECT_GE(e.runs.at(r.origin), r.trip_count) << r.what;
  }
  EXPECT_GT(rows, 5);
}

INSTANTIATE_TEST_SUITE_P(Policies, ExplainRuns,
                         testing::Combine(testing::Values("full", "minimal", "minimal_offloaded", "dots_saveable"),
                                          testing::Values(0, 2)),
                         [](const testing::TestParamInfo<std::tuple<std::string, int64_t>>& i) {
                           return fmt::format("{}_groups_of_{}", std::get<0>(i.param), std::get<1>(i.param));
                         });

}  // namespace
}  // namespace remat
