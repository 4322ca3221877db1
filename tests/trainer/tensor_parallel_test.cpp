// Tensor and sequence parallelism end to end, under Open MPI's mpirun, on a small grouped-query model: t = 2
// tensor ranks train 20 steps whose losses and gradient norms match one process within a tolerance (a
// row-parallel matmul adds the ranks' partial products in another association than one device's dot; the
// vocabulary-parallel loss sums its exponentials per block), bit-identically between two launches, and with
// data parallelism beside them bit-identically to the same tensor degree accumulating the data ranks'
// microbatches; with packing=false over documents shorter than a sequence, whose padding targets the
// vocabulary-parallel loss must skip on every rank. Each rank's measured arena peak is its plan's.
#include "support/command.h"
#include "support/mpirun.h"
#include "support/run_metrics.h"
#include "support/sanitizer_subset.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

namespace remat {
namespace {

namespace fs = std::filesystem;

// 4 query heads over 2 kv heads (GQA), a vocabulary of 256 split over the tensor ranks.
const char* kRun = "train base_emb_dim=32 base_num_decoder_layers=2 base_num_query_heads=4 base_num_kv_heads=2 "
                   "head_dim=8 base_mlp_dim=64 per_device_batch_size=2 max_target_length=32 steps=20 "
                   "eval_interval=10 eval_steps=1 sample_length=2";

using testing_support::MetricsRow;
using testing_support::run_metrics;

testing_support::Output train(const fs::path& dir, const std::string& launcher, const std::string& args) {
  return testing_support::launch_remat(dir.string(), launcher, fmt::format("{} {}", kRun, args));
}

struct Launch {
  const char* name;
  int ranks;
  const char* args;  // the tensor keys, and what the one process shares (dtype, attention)
  double tolerance;  // relative, against one process
};

void PrintTo(const Launch& l, std::ostream* os) { *os << l.name; }

class TensorParallel : public ::testing::TestWithParam<Launch> {};

// The rank's measured arena peak equals its plan's (every rank's line: rank 0 prints it).
void expect_peak_as_planned(const std::string& text) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(measured peak (.+) device \(planned (.+)\))"))) << text;
  EXPECT_EQ(m[1].str(), m[2].str()) << "the arena peak is the plan's";
}

TEST_P(TensorParallel, MatchesOneProcessAndIsBitIdenticalToItself) {
  ASSERT_TRUE(testing_support::mpirun_installed()) << "mpirun is not installed (scripts/setup.sh installs it)";
  const Launch& l = GetParam();
  std::string shared;  // the keys the one process takes too: those that are not parallelism keys
  for (const std::string key : {"dtype=bfloat16", "attention=flash", "packing=false"})
    if (std::string(l.args).find(key) != std::string::npos) shared += " " + key;
  testing_support::TempDir dir;
  if (shared.find("packing=false") != std::string::npos) {  // documents shorter than a sequence: padded targets
    std::ofstream docs(dir.path / "docs.jsonl");
    for (int i = 0; i < 300; ++i) docs << fmt::format(R"({{"text": "document {} is {}"}})", i, std::string(static_cast<size_t>(i % 23), 'x')) << "\n";
    shared += fmt::format(" dataset_type=jsonl dataset_path={}", (dir.path / "docs.jsonl").string());
  }
  const testing_support::Output one = train(dir.path, testing_support::one_process(), "run_name=one" + shared);
  ASSERT_EQ(one.status, 0) << one.text;
  const testing_support::Output a = train(dir.path, testing_support::mpirun(l.ranks), fmt::format("run_name=a {}{}", l.args, shared));
  ASSERT_EQ(a.status, 0) << a.text;
  const testing_support::Output b = train(dir.path, testing_support::mpirun(l.ranks), fmt::format("run_name=b {}{}", l.args, shared));
  ASSERT_EQ(b.status, 0) << b.text;
  const std::vector<MetricsRow> want = run_metrics(dir.path / "runs" / "one"), got = run_metrics(dir.path / "runs" / "a");
  ASSERT_EQ(want.size(), 20u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const auto [step, loss, norm, validation] = want[i];
    EXPECT_NEAR(std::get<1>(got[i]), loss, l.tolerance * std::abs(loss)) << "step " << step;
    EXPECT_NEAR(std::get<2>(got[i]), norm, l.tolerance * std::abs(norm)) << "step " << step;
    if (validation >= 0) {
      EXPECT_NEAR(std::get<3>(got[i]), validation, l.tolerance * validation) << "step " << step;
    }
  }
  EXPECT_EQ(run_metrics(dir.path / "runs" / "b"), got) << "two launches give the same bits";
  expect_peak_as_planned(a.text);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, TensorParallel,
    ::testing::ValuesIn(testing_support::sanitizer_subset(
        std::vector<Launch>{
            Launch{"tensor2", 2, "ici_tensor_parallelism=2", 1e-5},
            Launch{"tensor2_sequence", 2, "ici_tensor_sequence_parallelism=2", 1e-5},
            Launch{"tensor2_flash", 2, "ici_tensor_parallelism=2 attention=flash", 1e-5},
            Launch{"tensor2_unpacked", 2, "ici_tensor_parallelism=2 packing=false", 1e-5},
            Launch{"tensor2_sequence_flash", 2, "ici_tensor_sequence_parallelism=2 attention=flash", 1e-5},
            Launch{"tensor2_bf16", 2, "ici_tensor_parallelism=2 dtype=bfloat16", 2e-2},
            Launch{"tensor2_sequence_bf16", 2, "ici_tensor_sequence_parallelism=2 dtype=bfloat16", 2e-2},
            Launch{"tensor4_kv_replicated", 4, "ici_tensor_parallelism=4 dcn_data_parallelism=1", 1e-5}},
        {"tensor2_sequence"})),
    [](const ::testing::TestParamInfo<Launch>& i) { return std::string(i.param.name); });

// 2 data-parallel (or FSDP) ranks, or 2 pipeline stages, x 2 tensor ranks: bit-identical to 2 tensor ranks
// accumulating the 2 microbatches.
struct Beside {
  const char* name;
  const char* args;    // both runs'
  const char* beside;  // the 4-rank run's: what replaces the accumulation
};

void PrintTo(const Beside& l, std::ostream* os) { *os << l.name; }

class TensorBeside : public ::testing::TestWithParam<Beside> {};

TEST_P(TensorBeside, DataRanksAreBitIdenticalToTensorRanksAccumulating) {
  ASSERT_TRUE(testing_support::mpirun_installed()) << "mpirun is not installed (scripts/setup.sh installs it)";
  const Beside& l = GetParam();
  testing_support::TempDir dir;
  const testing_support::Output want_run =
      train(dir.path, testing_support::mpirun(2), fmt::format("run_name=want gradient_accumulation_steps=2 {}", l.args));
  ASSERT_EQ(want_run.status, 0) << want_run.text;
  const testing_support::Output got_run =
      train(dir.path, testing_support::mpirun(4), fmt::format("run_name=got {} {}", l.args, l.beside));
  ASSERT_EQ(got_run.status, 0) << got_run.text;
  const std::vector<MetricsRow> want = run_metrics(dir.path / "runs" / "want");
  ASSERT_EQ(want.size(), 20u);
  EXPECT_EQ(run_metrics(dir.path / "runs" / "got"), want);
  expect_peak_as_planned(got_run.text);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, TensorBeside,
    ::testing::ValuesIn(testing_support::sanitizer_subset(
        std::vector<Beside>{Beside{"data2_tensor2", "ici_tensor_parallelism=2", ""},
                            Beside{"fsdp2_tensor2_sequence", "ici_tensor_sequence_parallelism=2 ici_fsdp_parallelism=-1 dcn_data_parallelism=1", ""},
                            Beside{"stage2_tensor2_sequence", "ici_tensor_sequence_parallelism=2 logits_via_embedding=false",
                                   "ici_pipeline_parallelism=2 pipeline_schedule=1f1b"}},
        {"fsdp2_tensor2_sequence"})),
    [](const ::testing::TestParamInfo<Beside>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace remat
