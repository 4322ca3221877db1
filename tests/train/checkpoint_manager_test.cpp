// train::CheckpointManager without a training run: the file names of each mesh, which step folders count, which
// checkpoint a run resumes from among several (torn, corrupt, another mesh's), which it keeps and deletes, and
// what restoring copies. The ranks of a mesh are played one after another in this process (without MPI the
// barrier is a no-op). Files are checked by the names and values written here, not by the manager's reader.
// The end-to-end runs (killed, resumed, bit-identical) are tests/trainer/resume_test.cpp.
#include "train/checkpoint_manager.h"
#include "support/flip_a_bit.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace remat {
namespace {

namespace fs = std::filesystem;
using train::CheckpointLayout;
using train::CheckpointManager;
using train::Progress;
using testing_support::flip_a_bit;

// A small step state: two parameters, their moment, the loss scale, and two arguments that are not state.
struct State {
  exec::Array w = exec::Array::from<float>({2, 2}, {0, 0, 0, 0});
  exec::Array b = exec::Array::from<float>({2}, {0, 0});
  exec::Array m = exec::Array::from<float>({2, 2}, {0, 0, 0, 0});
  exec::Array scale = exec::Array::from<float>({}, {0});
  exec::Array counter = exec::Array::from<int32_t>({}, {0});
  exec::Array inputs = exec::Array::from<int32_t>({2}, {0, 0});

  std::vector<train::StateTensor> tensors() const {
    return {{"w", ir::Role::parameter, w},      {"b", ir::Role::parameter, b},
            {"opt_m_w", ir::Role::optimizer_state, m}, {"loss_scale", ir::Role::loss_scale, scale},
            {"step", ir::Role::step, counter},  {"inputs", ir::Role::batch, inputs}};
  }
  // Every element of every argument set to `v`.
  void fill(double v) {
    for (exec::Array* a : {&w, &b, &m, &scale, &counter, &inputs})
      for (int64_t i = 0; i < a->size(); ++i) a->set(i, v);
  }
};

// One process's mesh (no MPI): the managers' barrier.
const exec::Mesh& one_process() {
  static const exec::Mesh mesh;
  return mesh;
}

const std::vector<uint8_t> kData = [] {
  std::vector<uint8_t> d(4096);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(i * 7 % 251);
  return d;
}();

train::CheckpointOptions options(const fs::path& run_dir, int64_t keep = 0) {
  return {.layout = {.run_dir = run_dir}, .keep = keep, .config_values = {{"learning_rate", "0.1"}}, .min_loss_scale = 1};
}

// Saves checkpoints `steps` with every state element equal to the step, the sampler advanced once per step.
void save_steps(CheckpointManager& m, State& s, train::Batcher& sampler, std::initializer_list<int64_t> steps) {
  std::vector<int32_t> in(16), out(16);  // one sequence (the samplers' seq is 16)
  for (int64_t step : steps) {
    sampler.next(1, in.data(), out.data());
    s.fill(static_cast<double>(step));
    m.save(s.tensors(), {.step = step, .skipped = step / 2}, sampler);
  }
}

std::vector<int64_t> folders(const fs::path& checkpoints) {
  std::vector<int64_t> out;
  for (const auto& e : fs::directory_iterator(checkpoints)) out.push_back(std::stoll(e.path().filename().string()));
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CheckpointLayout, OneFilePerStageAndShardInTheOrderOfTheRanks) {
  EXPECT_EQ((CheckpointLayout{.run_dir = "r"}.files()), std::vector<std::string>{"state.safetensors"});
  EXPECT_EQ((CheckpointLayout{.run_dir = "r", .stages = 1, .shards = 2}.files()),
            (std::vector<std::string>{"state.fsdp0-of-2.safetensors", "state.fsdp1-of-2.safetensors"}));
  EXPECT_EQ((CheckpointLayout{.run_dir = "r", .stages = 2, .shards = 1}.files()),
            (std::vector<std::string>{"state.stage0-of-2.safetensors", "state.stage1-of-2.safetensors"}));
  EXPECT_EQ((CheckpointLayout{.run_dir = "r", .stages = 2, .shards = 2}.files()),
            (std::vector<std::string>{"state.stage0-of-2.fsdp0-of-2.safetensors", "state.stage0-of-2.fsdp1-of-2.safetensors",
                                      "state.stage1-of-2.fsdp0-of-2.safetensors", "state.stage1-of-2.fsdp1-of-2.safetensors"}));
  EXPECT_EQ(CheckpointLayout{.run_dir = "runs/r"}.step_folder(12), fs::path("runs/r/checkpoints/12"));
}

TEST(CheckpointLayout, StepsAreTheFoldersNamedByACountNewestFirst) {
  testing_support::TempDir temp;
  const CheckpointLayout layout{.run_dir = temp.path};
  EXPECT_TRUE(layout.steps().empty()) << "no checkpoints folder yet";
  for (const char* d : {"3", "12", "100", "x1", "-4", "1e3", "99999999999999999999"}) fs::create_directories(layout.folder() / d);
  std::ofstream(layout.folder() / "7") << "a file, not a folder";
  EXPECT_EQ(layout.steps(), (std::vector<int64_t>{100, 12, 3}));
}

TEST(CheckpointManager, SavesTheStateTensorsAndProgressAndResumesThem) {
  testing_support::TempDir temp;
  State s;
  train::Batcher sampler(kData, 16, 5, "train");
  CheckpointManager saver(options(temp.path), one_process());
  save_steps(saver, s, sampler, {3});
  const std::string sampler_after = sampler.state();
  const train::SafeTensors file = train::read_safetensors(temp.path / "checkpoints" / "3" / "state.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, array] : file.tensors) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"b", "loss_scale", "opt_m_w", "w"})) << "the step counter and batch are not state";
  EXPECT_EQ(file.metadata.at("step"), "3");
  EXPECT_EQ(file.metadata.at("skipped_steps"), "1");
  EXPECT_EQ(file.metadata.at("config"), R"({"learning_rate":"0.1"})");

  s.fill(-1);
  train::Batcher fresh(kData, 16, 5, "train");
  CheckpointManager resumer(options(temp.path), one_process());
  testing::internal::CaptureStdout();
  const Progress p = resumer.resume(s.tensors(), fresh);
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            fmt::format("resumed from {} (step 3)\n", (temp.path / "checkpoints" / "3" / "state.safetensors").string()));
  EXPECT_EQ(p.step, 3);
  EXPECT_EQ(p.skipped, 1);
  EXPECT_EQ(fresh.state(), sampler_after);
  for (const exec::Array* a : {&s.w, &s.b, &s.m, &s.scale}) EXPECT_EQ(a->get(0), 3);
  EXPECT_EQ(s.counter.get(0), -1) << "not state: left as it was";
}

// Checkpoints 1..4; 4 torn (its folder without its file), 3 corrupt: the run resumes from 2, with 2's values.
TEST(CheckpointManager, ResumesFromTheNewestCheckpointThatIsCompleteAndReadable) {
  testing_support::TempDir temp;
  State s;
  train::Batcher sampler(kData, 16, 5, "train");
  CheckpointManager first(options(temp.path), one_process());
  std::string sampler_at_2;
  save_steps(first, s, sampler, {1, 2});
  sampler_at_2 = sampler.state();
  save_steps(first, s, sampler, {3, 4});
  const fs::path checkpoints = temp.path / "checkpoints";
  fs::remove(checkpoints / "4" / "state.safetensors");
  flip_a_bit(checkpoints / "3" / "state.safetensors");

  s.fill(-1);
  train::Batcher fresh(kData, 16, 5, "train");
  CheckpointManager second(options(temp.path), one_process());
  testing::internal::CaptureStdout();
  const Progress p = second.resume(s.tensors(), fresh);
  const std::string said = testing::internal::GetCapturedStdout();
  EXPECT_EQ(p.step, 2);
  EXPECT_EQ(p.skipped, 1);
  EXPECT_EQ(s.w.get(3), 2);
  EXPECT_EQ(s.m.get(0), 2);
  EXPECT_EQ(fresh.state(), sampler_at_2);
  EXPECT_NE(said.find("3/state.safetensors"), std::string::npos) << said;
  EXPECT_NE(said.find("trying the previous checkpoint"), std::string::npos) << said;
  EXPECT_EQ(said.find("4/state.safetensors': "), std::string::npos) << "a torn one is passed over in silence: " << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 2) << said;
}

// keep=0 keeps all. With keep=2 (moved here from tests/trainer/resume_test.cpp, which ran two trainings for
// it): a run that passed over a torn folder (7) and a corrupt checkpoint (4) and resumed from 3 deletes its
// history (1, 2, 3) and what it wrote (5) once beyond the two newest complete ones, but never 4 or 7, which it
// did not write. A corrupt checkpoint is complete: it counts among the kept.
TEST(CheckpointManager, KeepsTheNewestCompleteOnesAndDeletesOnlyThoseItOwns) {
  testing_support::TempDir temp;
  const fs::path checkpoints = temp.path / "checkpoints";
  State s;
  train::Batcher sampler(kData, 16, 5, "train");
  CheckpointManager first(options(temp.path, 0), one_process());
  save_steps(first, s, sampler, {1, 2, 3, 4});
  EXPECT_EQ(folders(checkpoints), (std::vector<int64_t>{1, 2, 3, 4}));
  flip_a_bit(checkpoints / "4" / "state.safetensors");
  fs::create_directories(checkpoints / "7");

  CheckpointManager second(options(temp.path, 2), one_process());
  testing::internal::CaptureStdout();
  EXPECT_EQ(second.resume(s.tensors(), sampler).step, 3);
  testing::internal::GetCapturedStdout();
  save_steps(second, s, sampler, {5});
  EXPECT_EQ(folders(checkpoints), (std::vector<int64_t>{4, 5, 7}));
  save_steps(second, s, sampler, {6});
  EXPECT_EQ(folders(checkpoints), (std::vector<int64_t>{4, 5, 6, 7}));
  save_steps(second, s, sampler, {8});
  EXPECT_EQ(folders(checkpoints), (std::vector<int64_t>{4, 6, 7, 8}));
}

// Two FSDP shards, their ranks played in turn: the checkpoint is complete once both files are there, and rank 0
// refuses to go on before (the ranks would not share a folder).
TEST(CheckpointManager, ACheckpointIsCompleteWithTheFileOfEveryShard) {
  testing_support::TempDir temp;
  State s;
  train::Batcher sampler(kData, 16, 5, "train");
  train::CheckpointOptions o = options(temp.path);
  o.layout.shards = 2;
  o.shard = 1;
  CheckpointManager shard1(o, one_process());
  o.shard = 0;
  CheckpointManager shard0(o, one_process());
  const fs::path dir = temp.path / "checkpoints" / "1";
  try {
    save_steps(shard1, s, sampler, {1});
    ADD_FAILURE() << "saved without shard 0's file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("checkpoint {} lacks shard files", dir.string())), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_regular_file(dir / "state.fsdp1-of-2.safetensors"));
  EXPECT_FALSE(o.layout.complete(1));
  save_steps(shard0, s, sampler, {1});
  EXPECT_TRUE(fs::is_regular_file(dir / "state.fsdp0-of-2.safetensors"));
  EXPECT_TRUE(o.layout.complete(1));
}

// Parameters alone from a file (load_parameters_path), the moments left; a loss scale saved below the floor is
// raised to it on resume.
TEST(CheckpointManager, LoadingParametersLeavesTheRestAndAResumedScaleIsRaisedToTheFloor) {
  testing_support::TempDir temp;
  State s;
  train::Batcher sampler(kData, 16, 5, "train");
  CheckpointManager saver(options(temp.path), one_process());
  save_steps(saver, s, sampler, {1});  // every element 1
  s.scale.set(0, 0.25);
  saver.save(s.tensors(), {.step = 2, .skipped = 0}, sampler);

  s.fill(-1);
  CheckpointManager loader(options(temp.path), one_process());
  loader.load_parameters(s.tensors(), temp.path / "checkpoints" / "1");  // a folder: this rank's file in it
  EXPECT_EQ(s.w.get(0), 1);
  EXPECT_EQ(s.b.get(1), 1);
  EXPECT_EQ(s.m.get(0), -1);
  EXPECT_EQ(s.scale.get(0), -1);

  train::CheckpointOptions o = options(temp.path);
  o.min_loss_scale = 2;
  CheckpointManager resumer(o, one_process());
  testing::internal::CaptureStdout();
  EXPECT_EQ(resumer.resume(s.tensors(), sampler).step, 2);
  testing::internal::GetCapturedStdout();
  EXPECT_EQ(s.scale.get(0), 2);
}

}  // namespace
}  // namespace remat
