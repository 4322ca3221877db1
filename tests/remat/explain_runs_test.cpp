// `remat explain`'s runs/step column (Explanation::runs, counted from the differentiated graph) against the
// profiler's count of real kernel calls when that graph runs: equal for every op, under policies that
// recompute, save and offload, with scanned and double-scanned layers.
#include "compile/compile.h"
#include "exec/executable.h"
#include "remat/remat.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <regex>

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

// Under a pipeline the policy applies once, on each layer's region inside the stage's microbatch iteration, with
// the layers' checkpoint names: `remat explain` lists per layer the same residuals (what, shape, dtype, decision,
// rule) as without a pipeline — for minimal and for dots_with_no_batch_dims_saveable (no vmap over stages, so no
// batch dimension on the dots) — and no forward op of a microbatch runs more than twice per layer (its forward,
// at most one recompute), double scan included, counted from the graph and from a run's kernel calls.
std::string without_pipeline_scope(std::string s) {
  const std::regex prefix(R"(pipeline/chunk\d+/microbatch\d+/)");
  return std::regex_replace(s, prefix, "");
}

std::vector<std::string> layer_rows(const rematerialize::Explanation& e) {
  std::vector<std::string> rows;
  for (const rematerialize::ResidualRecord& r : e.residuals)
    rows.push_back(fmt::format("{} | {} | {} | {} | {} | {}", r.policy, without_pipeline_scope(r.what), ir::type_str(r.type),
                               static_cast<int>(r.residency), r.rule, without_pipeline_scope(r.scope)));
  return rows;
}

class ExplainPipeline : public testing::TestWithParam<std::string> {};

TEST_P(ExplainPipeline, EachLayerSavesWhatItSavesWithoutAPipeline) {
  const nn::ModelConfig c = testing_support::micro_model(8, true, GetParam());
  const compile::Compiled whole =
      compile::compile({.model = c, .shape = {1, 8, 1}, .kind = compile::Kind::grads});
  const parallel::Schedule s = parallel::make_schedule(parallel::ScheduleKind::one_f_one_b, {4, 4, 1});
  const compile::Compiled stage =
      compile::compile({.model = c, .shape = {1, 8, 4}, .pipeline = &s, .stage = 1});  // layers 2-3 only
  const std::vector<std::string> want = layer_rows(whole.explanation), got = layer_rows(stage.explanation);
  ASSERT_GT(want.size(), 20u);
  EXPECT_EQ(got, want);
  size_t saved = 0;
  for (const rematerialize::ResidualRecord& r : stage.explanation.residuals)
    saved += !r.region_input && !r.alias && r.residency == autodiff::Residency::save;
  EXPECT_GT(saved, 0u) << "the policy saves something per layer under the pipeline";
}

INSTANTIATE_TEST_SUITE_P(Policies, ExplainPipeline, testing::Values("minimal", "dots_with_no_batch_dims_saveable"));

TEST(ExplainPipeline, NoForwardOpRunsMoreThanTwicePerLayerAndMicrobatchOrThriceInGroups) {
  for (int64_t group : {0, 2}) {
    nn::ModelConfig c = testing_support::micro_model(4, true, "full");
    c.layers_per_group = group;
    const parallel::Schedule s = parallel::make_schedule(parallel::ScheduleKind::gpipe, {1, 2, 1});
    const compile::Compiled step = compile::compile({.model = c, .shape = {2, 8, 2}, .pipeline = &s});
    std::vector<exec::Array> args;
    for (const ir::ValueId v : step.program.params) args.push_back(exec::Array::zeros(step.program.type(v)));
    const std::vector<exec::Array> init = nn::init_params(c, 1);
    std::copy(init.begin(), init.end(), args.begin());
    exec::Profile profile;
    exec::Executable(step.program, step.plan, {.profile = &profile}).run(args);
    auto runs = [](const std::map<uint64_t, int64_t>& m, uint64_t origin) {
      auto it = m.find(origin);
      return it == m.end() ? int64_t{0} : it->second;
    };
    for (const rematerialize::ResidualRecord& r : step.explanation.residuals) {
      if (r.region_input) continue;
      // Microbatch 0's producers, by origin: once per layer forward, at most once per layer recomputed (and in
      // groups once more, in the group's recompute); a broadcast or constant that fusion copied into all its
      // readers is no kernel of its own (it runs 0 times).
      EXPECT_EQ(runs(step.explanation.runs, r.origin), runs(profile.runs_by_origin, r.origin)) << r.what;
      const bool copy = r.what.starts_with("broadcast_in_dim") || r.what.starts_with("iota") || r.what.starts_with("full");
      if (copy && runs(profile.runs_by_origin, r.origin) == 0) continue;
      EXPECT_LE(profile.runs_by_origin.at(r.origin), (group > 0 ? 3 : 2) * r.trip_count)
          << r.what << " (groups of " << group << ")";
      EXPECT_GE(profile.runs_by_origin.at(r.origin), r.trip_count) << r.what;
    }
  }
}

}  // namespace
}  // namespace remat
