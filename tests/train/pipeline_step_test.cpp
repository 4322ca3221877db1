// Pipeline steps (train::pipeline_step_program) against the whole-model step with gradient accumulation over
// the same microbatches: every rank's loss, gradient norm and updated parameters bit-identical to one
// process's, for GPipe, 1F1B, interleaved 1F1B and ZB-H1; every rank's measured arena peak is its plan's. The
// multi-rank cases start this test binary under mpirun on itself; each rank runs its own program and the
// one-process reference, and compares.
#include "compile/compile.h"
#include "exec/executable.h"
#include "exec/mesh.h"
#include "support/models.h"
#include "support/mpirun.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

namespace remat {
namespace {

constexpr int64_t kBatch = 1, kSeq = 16, kSteps = 3;
constexpr uint64_t kSeed = 5;

struct Result {
  std::vector<float> loss, grad_norm;
  int64_t measured_peak = 0, planned_peak = 0;  // device arena bytes
  std::vector<exec::Array> params;  // after the steps, in the program's order
  std::vector<std::string> names;
};

// Step s's tokens [m, B, T] (inputs, then targets), the same on every rank.
std::vector<int32_t> tokens(int64_t m, int64_t step, bool targets) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + (targets ? 1 : 0)));
  std::uniform_int_distribution<int32_t> tok(0, 255);
  std::vector<int32_t> t(static_cast<size_t>(m * kBatch * kSeq));
  for (auto& x : t) x = tok(rng);
  return t;
}

// Runs kSteps of a compiled step whose parameters start as `params`; moments zero.
Result run_steps(const compile::Compiled& c, std::vector<exec::Array> params, int64_t m, const exec::Mesh* mesh) {
  exec::Executable e(c.program, c.plan, {.mesh = mesh, .poison = true});  // a buffer read outside its planned life: NaN
  const ir::Signature& sig = c.signature;
  std::vector<exec::Array> args;
  size_t next_param = 0;
  for (const ir::Slot& a : sig.args) {
    const ir::Type& t = c.program.type(c.program.params[args.size()]);
    if (a.role == ir::Role::parameter) args.push_back(params[next_param++]);
    else args.push_back(exec::Array::zeros(t));
  }
  Result r;
  for (int64_t s = 0; s < kSteps; ++s) {
    args[static_cast<size_t>(sig.arg("step"))].set(0, static_cast<double>(s));
    for (const char* batch : {"inputs", "targets"}) {
      const auto it = std::find_if(sig.args.begin(), sig.args.end(), [&](const ir::Slot& a) { return a.name == batch; });
      if (it == sig.args.end()) continue;
      args[static_cast<size_t>(it - sig.args.begin())] =
          exec::Array::from<int32_t>({m, kBatch, kSeq}, tokens(m, s, std::string(batch) == "targets"));
    }
    const std::vector<exec::Array>& out = e.run(args);
    r.loss.push_back(static_cast<float>(out[static_cast<size_t>(sig.result("loss"))].get(0)));
    r.grad_norm.push_back(static_cast<float>(out[static_cast<size_t>(sig.result("grad_norm"))].get(0)));
    for (const auto& [result, arg] : sig.updates()) {
      exec::Array& to = args[static_cast<size_t>(arg)];
      const exec::Array& from = out[static_cast<size_t>(result)];
      if (to.bytes() != from.bytes()) std::memcpy(to.bytes(), from.bytes(), static_cast<size_t>(from.type().bytes()));
    }
  }
  for (size_t i = 0; i < sig.args.size(); ++i)
    if (sig.args[i].role == ir::Role::parameter) r.params.push_back(args[i]), r.names.push_back(sig.args[i].name);
  r.measured_peak = e.measured_peak(plan::Space::device);
  r.planned_peak = c.plan.lower_bound[0];
  return r;
}

struct Case {
  std::string label;
  parallel::ScheduleKind kind;
  parallel::PipelineShape shape;
  std::string policy = "full";
};

nn::ModelConfig model_of(const Case& c) { return testing_support::small_model(8, true, c.policy); }

// The one-process reference: the whole model, gradient accumulation over the m microbatches.
Result reference(const Case& c) {
  const nn::ModelConfig model = model_of(c);
  const compile::Compiled step = compile::compile({.model = model, .shape = {kBatch, kSeq, c.shape.microbatches}});
  return run_steps(step, nn::init_params(model, kSeed), c.shape.microbatches, nullptr);
}

// This rank's pipeline program, compared with the reference: loss and norm bit for bit, and each of its
// parameters against the rows of the reference's.
void check_rank(const Case& c, int64_t rank, const exec::Mesh* mesh) {
  const nn::ModelConfig model = model_of(c);
  const parallel::Schedule schedule = parallel::make_schedule(c.kind, c.shape);
  const compile::Compiled step = compile::compile(
      {.model = model, .shape = {kBatch, kSeq, c.shape.microbatches}, .pipeline = &schedule, .stage = rank});
  const std::vector<nn::StagePart> parts = train::pipeline_parts(model, c.shape, rank);
  std::vector<exec::Array> params;
  for (const nn::StagePart& part : parts)
    for (const nn::ParamSpec& s : nn::stage_param_specs(model, part)) params.emplace_back(s.type);
  nn::init_stage_params(model, kSeed, parts, params);
  const Result got = run_steps(step, params, c.shape.microbatches, mesh);
  const Result want = reference(c);
  EXPECT_EQ(got.measured_peak, got.planned_peak) << "rank " << rank << ": the arena peak is the plan's";
  for (int64_t s = 0; s < kSteps; ++s) {
    EXPECT_EQ(got.loss[static_cast<size_t>(s)], want.loss[static_cast<size_t>(s)]) << "rank " << rank << " step " << s;
    EXPECT_EQ(got.grad_norm[static_cast<size_t>(s)], want.grad_norm[static_cast<size_t>(s)]) << "rank " << rank << " step " << s;
  }
  // Each parameter against the reference's rows, byte for byte.
  const std::vector<nn::ParamSpec> whole = nn::param_specs(model);
  size_t at = 0;
  for (const nn::StagePart& part : parts)
    for (const nn::ParamSpec& s : nn::stage_param_specs(model, part)) {
      const size_t w = static_cast<size_t>(
          std::find_if(whole.begin(), whole.end(), [&](const nn::ParamSpec& x) { return x.path == s.path; }) - whole.begin());
      const exec::Array& mine = got.params[at++];
      const exec::Array& ref = want.params[w];
      const bool stacked = s.axes[0] == "layers";
      const int64_t row = ref.type().bytes() / ref.type().shape[0];
      EXPECT_EQ(std::memcmp(mine.bytes(), ref.bytes() + (stacked ? part.first_layer * row : 0),
                            static_cast<size_t>(mine.type().bytes())),
                0)
          << "rank " << rank << ": " << got.names[at - 1] << " differs from the one-process run";
    }
}

TEST(PipelineStep, OneStageRunsAsTheAccumulatingStep) {
  check_rank({"one_stage", parallel::ScheduleKind::gpipe, {1, 4, 1}}, 0, nullptr);
}

std::vector<Case> cases() {
  using parallel::ScheduleKind;
  return {{"gpipe", ScheduleKind::gpipe, {4, 8, 1}},
          {"one_f_one_b", ScheduleKind::one_f_one_b, {4, 8, 1}},
          {"interleaved", ScheduleKind::interleaved_1f1b, {4, 8, 2}},
          {"one_f_one_b_minimal", ScheduleKind::one_f_one_b, {4, 8, 1}, "minimal"},
          {"zb_h1", ScheduleKind::zb_h1, {4, 8, 1}},  // W recomputes what full recomputes
          {"zb_h1_minimal", ScheduleKind::zb_h1, {4, 8, 1}, "minimal"}};
}

class PipelineRanks : public testing::TestWithParam<Case> {};

TEST_P(PipelineRanks, EveryRankMatchesOneProcessBitForBit) {
  const Case& c = GetParam();
  const int ranks = static_cast<int>(c.shape.stages);
  if (exec::Mesh::launched_ranks() == 1) {
    ASSERT_TRUE(testing_support::mpirun_installed()) << "mpirun is not installed (scripts/setup.sh installs it)";
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const testing_support::Output o = testing_support::run_command(
        fmt::format("{} '{}' --gtest_filter=Schedules/PipelineRanks.EveryRankMatchesOneProcessBitForBit/{} --gtest_color=no 2>&1",
                    testing_support::mpirun(ranks), self, c.label));
    EXPECT_EQ(o.status, 0) << o.text;
    EXPECT_NE(o.text.find("[  PASSED  ] 1 test"), std::string::npos) << o.text;
    return;
  }
  exec::Mesh mesh({{"stage", ranks}});
  check_rank(c, mesh.rank(), &mesh);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineRanks, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.label; });

}  // namespace
}  // namespace remat
