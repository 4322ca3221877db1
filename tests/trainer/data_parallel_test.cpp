// Data parallelism and FSDP end to end, under Open MPI's mpirun: N ranks each taking one microbatch of the
// global batch train bit-identically to one process accumulating the same N microbatches in order — every
// step's loss and gradient norm, and the validation losses — because every sum over the ranks is taken in
// rank order (FSDP's gradient reduce_scatter too, in f32 under bf16 compute), and the global norm is summed
// the same way whether the gradients are whole or sharded. Rank 0's measured arena peak equals its plan.
#include "support/command.h"
#include "support/mpirun.h"
#include "support/run_metrics.h"
#include "support/sanitizer_subset.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

namespace remat {
namespace {

namespace fs = std::filesystem;

const char* kRun = "train base_emb_dim=32 base_num_decoder_layers=2 base_num_query_heads=2 base_num_kv_heads=2 "
                   "head_dim=16 base_mlp_dim=64 per_device_batch_size=2 max_target_length=32 steps=20 "
                   "eval_interval=10 eval_steps=1 sample_length=2";

using testing_support::mpirun;

using testing_support::run_metrics;

testing_support::Output train(const fs::path& dir, const std::string& launcher, const std::string& args) {
  return testing_support::launch_remat(dir.string(), launcher, fmt::format("{} {}", kRun, args));
}

struct Launch {
  const char* name;
  int ranks;
  const char* args;    // the mesh's keys (and a dtype, given to the one process too)
  const char* layout;  // how the run describes its ranks
};

void PrintTo(const Launch& l, std::ostream* os) { *os << l.name; }

class Distributed : public ::testing::TestWithParam<Launch> {};

TEST_P(Distributed, RanksAreBitIdenticalToOneProcessAccumulatingTheirMicrobatches) {
  ASSERT_TRUE(testing_support::mpirun_installed()) << "mpirun is not installed (scripts/setup.sh installs it)";
  const Launch& l = GetParam();
  const std::string dtype = std::string(l.args).find("dtype") == std::string::npos ? "" : "dtype=bfloat16";
  testing_support::TempDir dir;
  const testing_support::Output one =
      train(dir.path, testing_support::one_process(), fmt::format("gradient_accumulation_steps={} run_name=one {}", l.ranks, dtype));
  ASSERT_EQ(one.status, 0) << one.text;
  const testing_support::Output many = train(dir.path, mpirun(l.ranks), fmt::format("run_name=many {}", l.args));
  ASSERT_EQ(many.status, 0) << many.text;
  EXPECT_NE(many.text.find(fmt::format("{} x 1 microbatch(es)", l.layout)), std::string::npos) << many.text;
  const auto want = run_metrics(dir.path / "runs" / "one"), got = run_metrics(dir.path / "runs" / "many");
  ASSERT_EQ(want.size(), 20u);
  EXPECT_EQ(got, want);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(many.text, m, std::regex(R"(measured peak (.+) device \(planned (.+)\))")))
      << many.text;
  EXPECT_EQ(m[1].str(), m[2].str()) << "rank 0's arena peak is its plan's";
  // The process's resident memory beyond its baseline (MPI included) and its plans: within the single-process
  // bound (tests/cli: 64 MiB). Under the sanitizers twice that, for their allocator's and shadow's own memory
  // (fsdp2_bf16 on an AVX2 CPU: 82 MiB unplanned under ASan, 12 MiB in the release build).
  ASSERT_TRUE(std::regex_search(many.text, m, std::regex(R"(\+ unplanned ([0-9.]+) (B|KiB|MiB)\n)"))) << many.text;
  EXPECT_TRUE(m[2].str() != "MiB" || std::stod(m[1].str()) < (exec::kAddressSanitizer ? 128 : 64)) << m[0].str();
  EXPECT_EQ(std::count(many.text.begin(), many.text.end(), '\n'), std::count(one.text.begin(), one.text.end(), '\n'))
      << "rank 0 alone prints:\n" << many.text;
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, Distributed,
    ::testing::ValuesIn(testing_support::sanitizer_subset(
        std::vector<Launch>{Launch{"data2", 2, "", "2 data-parallel ranks"}, Launch{"data4", 4, "", "4 data-parallel ranks"},
                            Launch{"fsdp2", 2, "ici_fsdp_parallelism=2", "2 ranks (1 data-parallel x 2 FSDP)"},
                            Launch{"fsdp4", 4, "ici_fsdp_parallelism=-1 dcn_data_parallelism=1", "4 ranks (1 data-parallel x 4 FSDP)"},
                            Launch{"data2_fsdp2", 4, "ici_fsdp_parallelism=2", "4 ranks (2 data-parallel x 2 FSDP)"},
                            Launch{"fsdp2_bf16", 2, "ici_fsdp_parallelism=2 dtype=bfloat16", "2 ranks (1 data-parallel x 2 FSDP)"}},
        {"data2", "data2_fsdp2", "fsdp2_bf16"})),
    [](const ::testing::TestParamInfo<Launch>& i) { return std::string(i.param.name); });

// Pipelines: 4 stages x 8 microbatches (8 layers: 2 per stage, or 1 per chunk interleaved) train 10 steps
// bit-identically to one process accumulating the same 8 microbatches — losses, gradient norms, validation
// losses; so do 2 stages in float16 (dynamic loss scaling: the bad-gradient count reduced over the stages), and
// 2 stages x 2 data-parallel (or FSDP) ranks bit-identically to 2 data-parallel (FSDP) ranks without a pipeline,
// each accumulating its 2 microbatches. Rank 0's arena peak is its plan's.
struct PipelineLaunch {
  const char* name;
  int ranks;
  const char* args;       // the pipeline and mesh keys
  const char* reference;  // the run it equals: launcher ranks (1: one process) and keys
  int reference_ranks;
};

void PrintTo(const PipelineLaunch& l, std::ostream* os) { *os << l.name; }

class Pipelines : public ::testing::TestWithParam<PipelineLaunch> {};

TEST_P(Pipelines, StagesAreBitIdenticalToTheirReference) {
  ASSERT_TRUE(testing_support::mpirun_installed()) << "mpirun is not installed (scripts/setup.sh installs it)";
  const PipelineLaunch& l = GetParam();
  const std::string model = "base_num_decoder_layers=8 steps=10 eval_interval=5 logits_via_embedding=false";
  testing_support::TempDir dir;
  const testing_support::Output want_run = train(dir.path, l.reference_ranks == 1 ? testing_support::one_process() : mpirun(l.reference_ranks),
                                                 fmt::format("{} run_name=want {}", model, l.reference));
  ASSERT_EQ(want_run.status, 0) << want_run.text;
  const testing_support::Output got_run = train(dir.path, mpirun(l.ranks), fmt::format("{} run_name=got {}", model, l.args));
  ASSERT_EQ(got_run.status, 0) << got_run.text;
  EXPECT_NE(got_run.text.find("pipeline: "), std::string::npos) << got_run.text;
  const auto want = run_metrics(dir.path / "runs" / "want"), got = run_metrics(dir.path / "runs" / "got");
  ASSERT_EQ(want.size(), std::string(l.args).find("steps=4") == std::string::npos ? 10u : 4u);
  EXPECT_EQ(got, want);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(got_run.text, m, std::regex(R"(measured peak (.+) device \(planned (.+)\))")))
      << got_run.text;
  EXPECT_EQ(m[1].str(), m[2].str()) << "rank 0's arena peak is its plan's";
  EXPECT_EQ(got_run.text.substr(got_run.text.rfind("sample (")), want_run.text.substr(want_run.text.rfind("sample (")))
      << "sampling passes the stages";
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, Pipelines,
    ::testing::ValuesIn(testing_support::sanitizer_subset(std::vector<PipelineLaunch>{
        PipelineLaunch{"gpipe4", 4, "per_device_batch_size=2 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
                                    "num_layers_per_pipeline_stage=2 pipeline_schedule=gpipe",
                       "per_device_batch_size=1 gradient_accumulation_steps=8", 1},
        PipelineLaunch{"one_f_one_b4", 4, "per_device_batch_size=2 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
                                          "num_layers_per_pipeline_stage=2 pipeline_schedule=1f1b",
                       "per_device_batch_size=1 gradient_accumulation_steps=8", 1},
        // A policy per stage (rank 0's is the one whose planned peak is checked): policies never change bits.
        PipelineLaunch{"one_f_one_b4_stage_policies", 4,
                       "per_device_batch_size=2 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
                       "num_layers_per_pipeline_stage=2 pipeline_schedule=1f1b "
                       "pipeline_stage_remat_policies=minimal,full,none,save_qkv_proj",
                       "per_device_batch_size=1 gradient_accumulation_steps=8", 1},
        // Zero-bubble: each backward split into B and W, the W's deferred; weight gradients still summed in
        // microbatch order.
        PipelineLaunch{"zb_h14", 4, "per_device_batch_size=2 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
                                    "num_layers_per_pipeline_stage=2 pipeline_schedule=zb_h1",
                       "per_device_batch_size=1 gradient_accumulation_steps=8", 1},
        // Layer groups: the nested backward scans split too.
        PipelineLaunch{"zb_h12_groups", 2, "per_device_batch_size=2 ici_pipeline_parallelism=2 num_pipeline_microbatches=4 "
                                           "num_layers_per_pipeline_stage=4 pipeline_schedule=zb_h1 layers_per_group=2",
                       "per_device_batch_size=1 gradient_accumulation_steps=4", 1},
        PipelineLaunch{"interleaved4", 4, "per_device_batch_size=2 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
                                          "num_layers_per_pipeline_stage=1 pipeline_schedule=interleaved_1f1b",
                       "per_device_batch_size=1 gradient_accumulation_steps=8", 1},
        PipelineLaunch{"one_f_one_b2_f16", 2, "per_device_batch_size=2 ici_pipeline_parallelism=2 num_pipeline_microbatches=4 "
                                              "num_layers_per_pipeline_stage=4 pipeline_schedule=1f1b dtype=float16 steps=4",
                       "per_device_batch_size=1 gradient_accumulation_steps=4 dtype=float16 steps=4", 1},  // f16 is slow
        PipelineLaunch{"one_f_one_b2_fsdp2", 4, "per_device_batch_size=1 ici_pipeline_parallelism=2 num_pipeline_microbatches=2 "
                                                "num_layers_per_pipeline_stage=4 pipeline_schedule=1f1b ici_fsdp_parallelism=2",
                       "per_device_batch_size=1 gradient_accumulation_steps=2 ici_fsdp_parallelism=2", 2},
        PipelineLaunch{"one_f_one_b2_data2", 4, "per_device_batch_size=1 ici_pipeline_parallelism=2 num_pipeline_microbatches=2 "
                                                "num_layers_per_pipeline_stage=4 pipeline_schedule=1f1b ici_data_parallelism=2",
                       "per_device_batch_size=1 gradient_accumulation_steps=2 ici_data_parallelism=2", 2}},
        {"interleaved4", "one_f_one_b2_fsdp2"})),
    [](const ::testing::TestParamInfo<PipelineLaunch>& i) { return std::string(i.param.name); });

// enable_profiler under a pipeline: one trace.json with a named track per rank, holding each rank's forwards
// and backwards in its schedule's order (1F1B over 2 stages and 4 microbatches), never overlapping on a track,
// inside the kernel calls' span; without a pipeline, one track of kernel calls. (Timings are not asserted:
// bench/pipeline_bubble.sh measures the bubble.)
TEST(PipelineTrace, EachRankIsATrackOfItsScheduleInOrder) {
  ASSERT_TRUE(testing_support::mpirun_installed()) << "mpirun is not installed (scripts/setup.sh installs it)";
  testing_support::TempDir dir;
  const testing_support::Output o = train(
      dir.path, mpirun(2),
      "run_name=t steps=3 logits_via_embedding=false ici_pipeline_parallelism=2 num_pipeline_microbatches=4 "
      "num_layers_per_pipeline_stage=1 pipeline_schedule=1f1b enable_profiler=true skip_first_n_steps_for_profiler=1");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("trace of step 2: "), std::string::npos) << o.text;
  std::ifstream in(dir.path / "runs" / "t" / "trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<int, std::vector<std::pair<double, std::string>>> computes;  // track -> (start, name)
  std::map<int, std::vector<std::pair<double, double>>> spans;
  std::map<int, std::string> names;
  int kernels = 0;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    const int tid = e.at("tid").get<int>();
    if (e.at("ph") == "M") {
      names[tid] = e.at("args").at("name").get<std::string>();
      continue;
    }
    const std::string name = e.at("name").get<std::string>();
    if (e.at("args").contains("scope")) {
      ++kernels;
      continue;
    }
    if (name[0] != 'F' && name[0] != 'B') continue;
    const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
    computes[tid].emplace_back(ts, name);
    spans[tid].emplace_back(ts, ts + dur);
  }
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].rfind("rank 0 (idle ", 0), 0u) << names[0];
  EXPECT_GT(kernels, 100);
  const std::vector<std::vector<std::string>> order = {{"F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"},
                                                       {"F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"}};
  for (int r = 0; r < 2; ++r) {
    std::sort(computes[r].begin(), computes[r].end());
    std::vector<std::string> got;
    for (const auto& [ts, name] : computes[r]) got.push_back(name);
    EXPECT_EQ(got, order[static_cast<size_t>(r)]) << "rank " << r;
    std::sort(spans[r].begin(), spans[r].end());
    for (size_t i = 1; i < spans[r].size(); ++i) EXPECT_LE(spans[r][i - 1].second, spans[r][i].first) << "rank " << r;
  }
  const testing_support::Output one = train(dir.path, "", "run_name=one steps=2 enable_profiler=true");
  ASSERT_EQ(one.status, 0) << one.text;
  std::ifstream single(dir.path / "runs" / "one" / "trace.json");
  const nlohmann::json t1 = nlohmann::json::parse(single);
  std::set<int> tracks;
  for (const nlohmann::json& e : t1.at("traceEvents")) tracks.insert(e.at("tid").get<int>());
  EXPECT_EQ(tracks, std::set<int>{0});
}

// Rank 0 writes the (replicated) state, or under FSDP the first rank of each shard's replicas writes that
// shard's file (under a pipeline, each stage its own; under tensor parallelism, each tensor shard its own); a run stopped after 12 of 20 steps and started again under mpirun resumes on every rank
// from that checkpoint and ends bit-identical to one never stopped. An FSDP checkpoint is refused by a run
// of another FSDP degree, naming the files it found; one missing a shard is torn: the run resumes from the
// checkpoint before it.
class Checkpoints : public ::testing::TestWithParam<const char*> {};

TEST_P(Checkpoints, TwoRanksResumeBitIdentically) {
  ASSERT_TRUE(testing_support::mpirun_installed()) << "mpirun is not installed (scripts/setup.sh installs it)";
  testing_support::TempDir dir;
  const std::string checkpoints = fmt::format("enable_checkpointing=true checkpoint_period=4 {}", GetParam());
  const testing_support::Output whole = train(dir.path, mpirun(2), checkpoints + " run_name=whole");
  ASSERT_EQ(whole.status, 0) << whole.text;
  const testing_support::Output first = train(dir.path, mpirun(2), checkpoints + " run_name=split steps=12");
  ASSERT_EQ(first.status, 0) << first.text;
  const testing_support::Output rest = train(dir.path, mpirun(2), checkpoints + " run_name=split");
  ASSERT_EQ(rest.status, 0) << rest.text;
  EXPECT_NE(rest.text.find("(step 12)"), std::string::npos) << rest.text;
  auto training = [](std::vector<std::tuple<int64_t, double, double, double>> rows) {  // the stopped run evaluated at 12
    for (auto& row : rows) std::get<3>(row) = 0;
    return rows;
  };
  EXPECT_EQ(training(run_metrics(dir.path / "runs" / "split")), training(run_metrics(dir.path / "runs" / "whole")));
  EXPECT_EQ(std::get<3>(run_metrics(dir.path / "runs" / "split").back()), std::get<3>(run_metrics(dir.path / "runs" / "whole").back()));
  const fs::path last = dir.path / "runs" / "split" / "checkpoints" / "20";
  if (std::string(GetParam()).empty()) {
    EXPECT_TRUE(fs::is_regular_file(last / "state.safetensors"));
    return;
  }
  if (std::string(GetParam()).find("pipeline") != std::string::npos) {  // a file per stage
    EXPECT_TRUE(fs::is_regular_file(last / "state.stage0-of-2.safetensors"));
    EXPECT_TRUE(fs::is_regular_file(last / "state.stage1-of-2.safetensors"));
    return;
  }
  if (std::string(GetParam()).find("tensor") != std::string::npos) {  // a file per tensor shard, refused at degree 1
    EXPECT_TRUE(fs::is_regular_file(last / "state.tensor0-of-2.safetensors"));
    EXPECT_TRUE(fs::is_regular_file(last / "state.tensor1-of-2.safetensors"));
    const testing_support::Output one = train(dir.path, "", "enable_checkpointing=true run_name=split steps=24");
    EXPECT_EQ(one.status, 2) << one.text;
    EXPECT_NE(one.text.find("was written by another mesh (state.tensor0-of-2.safetensors, state.tensor1-of-2.safetensors)"),
              std::string::npos)
        << one.text;
    return;
  }
  EXPECT_TRUE(fs::is_regular_file(last / "state.fsdp0-of-2.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(last / "state.fsdp1-of-2.safetensors"));
  const testing_support::Output other = train(dir.path, "", "enable_checkpointing=true run_name=split steps=24");
  EXPECT_EQ(other.status, 2) << other.text;
  EXPECT_NE(other.text.find("was written by another mesh (state.fsdp0-of-2.safetensors, state.fsdp1-of-2.safetensors), "
                            "this run's rank 0 needs state.safetensors"),
            std::string::npos)
      << other.text;
  // A shard that never reached the disk: that checkpoint is torn, and every rank resumes from the one before.
  const auto before = run_metrics(dir.path / "runs" / "whole");
  fs::remove(dir.path / "runs" / "whole" / "checkpoints" / "20" / "state.fsdp1-of-2.safetensors");
  const testing_support::Output again = train(dir.path, mpirun(2), checkpoints + " run_name=whole");
  ASSERT_EQ(again.status, 0) << again.text;
  EXPECT_NE(again.text.find("(step 16)"), std::string::npos) << again.text;
  EXPECT_EQ(training(run_metrics(dir.path / "runs" / "whole")), training(before));
}

INSTANTIATE_TEST_SUITE_P(Meshes, Checkpoints,
                         ::testing::Values("", "ici_fsdp_parallelism=2",
                                           "ici_pipeline_parallelism=2 logits_via_embedding=false pipeline_schedule=1f1b",
                                           "ici_tensor_parallelism=2"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.index == 0 ? "data2" : i.index == 1 ? "fsdp2" : i.index == 2 ? "stages2" : "tensor2");
                         });

// Rank 0 alone writes metrics; when it cannot, its error ends the whole launch (MPI_Abort) instead of leaving
// rank 1 waiting in its first all-reduce.
TEST(DataParallelConfig, AnErrorOnOneRankEndsTheLaunch) {
  testing_support::TempDir dir;
  fs::create_directories(dir.path / "runs" / "x" / "metrics.jsonl");  // a folder where the file should go
  const testing_support::Output o = train(dir.path, mpirun(2), "run_name=x");
  EXPECT_NE(o.status, 0) << o.text;  // a hang fails at run_command's time limit
  EXPECT_NE(o.text.find("cannot write metrics file"), std::string::npos) << o.text;
}

TEST(DataParallelConfig, ADegreeTheLaunchCannotHoldIsAnErrorNamingTheKey) {
  testing_support::TempDir dir;
  const testing_support::Output o = train(dir.path, "", "ici_data_parallelism=2");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_NE(o.text.find("ici_data_parallelism=2 needs a multiple of 2 ranks, but 1 process was launched: start "
                        "`mpirun -np 2 remat train ...`"),
            std::string::npos)
      << o.text;
}

}  // namespace
}  // namespace remat
