// Checkpoints and resume, end to end: a training process killed with SIGKILL at random instants (inside
// steps and inside checkpoint writes, every step writes one) and started again with the same run name
// continues from its latest complete checkpoint, and its losses, gradient norms and final parameters and
// moments are bit-identical to a run never interrupted.
#include "exec/exec.h"
#include "support/command.h"
#include "support/temp_dir.h"
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace remat {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kArgs = {
    "train", "base_emb_dim=32", "base_num_decoder_layers=1", "base_num_query_heads=2", "base_num_kv_heads=2",
    "head_dim=16", "base_mlp_dim=64", "per_device_batch_size=2", "max_target_length=32", "steps=24",
    "eval_interval=8", "eval_steps=1", "sample_length=2", "enable_checkpointing=true", "checkpoint_period=1"};

// Starts `remat train ... run_name=<name>` in `dir`, output discarded; returns its pid.
pid_t start(const fs::path& dir, const std::string& name) {
  std::vector<std::string> args = kArgs;
  args.push_back("run_name=" + name);
  const pid_t pid = fork();
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    std::vector<char*> argv{const_cast<char*>(REMAT_BINARY)};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(REMAT_BINARY, argv.data());
    _exit(127);
  }
  return pid;
}

int finish(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// (step, loss, grad_norm) of every row of a run's metrics.jsonl, exactly as written.
std::vector<std::tuple<int64_t, double, double>> metrics(const fs::path& run) {
  std::vector<std::tuple<int64_t, double, double>> rows;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    rows.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>(), j.at("grad_norm").get<double>());
  }
  return rows;
}

TEST(Resume, KilledAtRandomInstantsAndResumedIsBitIdentical) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(finish(start(dir, "whole")), 0);
  const double whole_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto want = metrics(dir / "runs" / "whole");
  ASSERT_EQ(want.size(), 24u);
  const train::SafeTensors last = train::read_safetensors(dir / "runs" / "whole" / "checkpoints" / "24" / "state.safetensors");
  const int instants = exec::kAddressSanitizer ? 5 : 20;
  std::mt19937 rng(2026);
  std::uniform_real_distribution<double> when(0.0, 0.8 * whole_ms);  // mostly before the run ends
  int killed_midway = 0;
  for (int i = 0; i < instants; ++i) {
    const std::string name = fmt::format("killed{}", i);
    const pid_t pid = start(dir, name);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(when(rng)));
    kill(pid, SIGKILL);
    killed_midway += finish(pid) == -1;
    ASSERT_EQ(finish(start(dir, name)), 0) << name << ": the resumed run failed";
    const fs::path run = dir / "runs" / name;
    EXPECT_EQ(metrics(run), want) << name << ": losses and gradient norms, every step";
    const train::SafeTensors got = train::read_safetensors(run / "checkpoints" / "24" / "state.safetensors");
    ASSERT_EQ(got.tensors.size(), last.tensors.size());
    for (const auto& [tensor, a] : last.tensors) {
      const exec::Array& b = got.tensors.at(tensor);
      ASSERT_EQ(a.type(), b.type());
      EXPECT_EQ(std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())), 0) << name << ": " << tensor;
    }
  }
  std::printf("%d of %d runs were killed before they finished (whole run %.0f ms)\n", killed_midway, instants, whole_ms);
  EXPECT_GE(killed_midway, 1) << "an instant fell inside a run";
}

// The latest checkpoint corrupt (one flipped bit): the run says so, resumes from the one before, and ends
// where the uninterrupted run ended.
TEST(Resume, ACorruptLatestCheckpointFallsBackToThePreviousOne) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path, run = dir / "runs" / "r";
  ASSERT_EQ(finish(start(dir, "r")), 0);
  const fs::path latest = run / "checkpoints" / "24" / "state.safetensors";
  const train::SafeTensors want = train::read_safetensors(latest);
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "23")) << "max_num_checkpoints_to_keep 2";
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "22"));
  {
    std::fstream f(latest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-7, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-7, std::ios::end);
    f.put(static_cast<char>(c ^ 1));
  }
  std::string cmd = fmt::format("cd '{}' && '{}'", dir.string(), REMAT_BINARY);
  for (const std::string& a : kArgs) cmd += " " + a;
  const testing_support::Output o = testing_support::run_command(cmd + " run_name=r 2>&1");
  const std::string& out = o.text;
  ASSERT_EQ(o.status, 0) << out;
  EXPECT_NE(out.find("checksum"), std::string::npos) << out;
  EXPECT_NE(out.find("trying the previous checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find(fmt::format("resumed from {} (step 23)", (fs::path("runs") / "r" / "checkpoints" / "23" / "state.safetensors").string())),
            std::string::npos) << out;
  const train::SafeTensors got = train::read_safetensors(latest);
  for (const auto& [tensor, a] : want.tensors)
    EXPECT_EQ(std::memcmp(a.bytes(), got.tensors.at(tensor).bytes(), static_cast<size_t>(a.type().bytes())), 0) << tensor;
}

// load_parameters_path: the parameters come from the file, the optimizer starts fresh. With learning rate 0
// one step keeps every parameter bit for bit (p - p*0 - u*0), while the moments are the new run's own.
TEST(Resume, LoadParametersPathStartsFromSavedParametersWithAFreshOptimizer) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  ASSERT_EQ(finish(start(dir, "source")), 0);
  const fs::path saved = dir / "runs" / "source" / "checkpoints" / "24";
  std::string cmd = fmt::format("cd '{}' && '{}'", dir.string(), REMAT_BINARY);
  for (const std::string& a : kArgs) cmd += " " + a;
  cmd += fmt::format(" run_name=loaded steps=1 learning_rate=0 load_parameters_path='{}' > /dev/null 2>&1", saved.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const train::SafeTensors from = train::read_safetensors(saved / "state.safetensors");
  const train::SafeTensors got = train::read_safetensors(dir / "runs" / "loaded" / "checkpoints" / "1" / "state.safetensors");
  int parameters = 0, fresh_moments = 0;
  for (const auto& [name, a] : from.tensors) {
    const exec::Array& b = got.tensors.at(name);
    const bool same = std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())) == 0;
    if (name.rfind("opt_", 0) == 0) {
      fresh_moments += !same;
    } else {
      EXPECT_TRUE(same) << name << " is the saved parameter";
      ++parameters;
    }
  }
  EXPECT_GT(parameters, 0);
  EXPECT_EQ(fresh_moments, static_cast<int>(from.tensors.size()) - parameters) << "every moment is the new run's";
}

}  // namespace
}  // namespace remat
