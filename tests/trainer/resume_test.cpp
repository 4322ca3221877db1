// Checkpoints and resume, end to end: a training process killed with SIGKILL at random instants (inside
// steps and inside checkpoint writes, every step writes one), or on purpose in the middle of writing one,
// and started again with the same run name continues from its latest complete checkpoint (the step it
// prints), and its losses, gradient norms and final parameters and moments are bit-identical to a run never
// interrupted.
#include "exec/exec.h"
#include "support/command.h"
#include "support/flip_a_bit.h"
#include "support/remat_process.h"
#include "support/temp_dir.h"
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <set>
#include <thread>

namespace remat {
namespace {

namespace fs = std::filesystem;
using testing_support::finish;
using testing_support::flip_a_bit;
using testing_support::metrics;
using testing_support::resumed_step;
using testing_support::running;

const std::vector<std::string> kArgs = {
    "train", "base_emb_dim=32", "base_num_decoder_layers=1", "base_num_query_heads=2", "base_num_kv_heads=2",
    "head_dim=16", "base_mlp_dim=64", "per_device_batch_size=2", "max_target_length=32", "steps=24",
    "eval_interval=8", "eval_steps=1", "sample_length=2", "enable_checkpointing=true", "checkpoint_period=1"};

// Starts `remat train ... run_name=<name>` in `dir`, its output into `log` (else discarded); returns its pid.
pid_t start(const fs::path& dir, const std::string& name, const fs::path& log = "/dev/null") {
  std::vector<std::string> args = kArgs;
  args.push_back("run_name=" + name);
  return testing_support::start_remat(dir, args, log);
}

// Whether `run`'s final checkpoint holds the same bytes in every tensor as `want`.
void expect_same_state(const train::SafeTensors& want, const fs::path& run, const std::string& name) {
  testing_support::expect_same_tensors(want, run / "checkpoints" / "24" / "state.safetensors", name);
}

TEST(Resume, KilledAtRandomInstantsAndResumedIsBitIdentical) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  const auto t0 = std::chrono::steady_clock::now();
  const auto ms_since_start = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
  const pid_t whole = start(dir, "whole");
  // When the first checkpoint appears (compiling comes before it): half the instants fall after it. Any step's
  // checkpoint counts: the run prunes old ones, and on a loaded machine this loop can sleep past step 1's life.
  const auto a_checkpoint = [&] {
    std::error_code error;  // the run creates and prunes folders while this reads
    for (fs::directory_iterator it(dir / "runs" / "whole" / "checkpoints", error), end; !error && it != end;
         it.increment(error))
      if (fs::exists(it->path() / "state.safetensors", error)) return true;
    return false;
  };
  while (!a_checkpoint() && running(whole)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double first_ms = ms_since_start();
  ASSERT_EQ(finish(whole), 0);
  const double whole_ms = ms_since_start();
  const auto want = metrics(dir / "runs" / "whole");
  ASSERT_EQ(want.size(), 24u);
  const train::SafeTensors last = train::read_safetensors(dir / "runs" / "whole" / "checkpoints" / "24" / "state.safetensors");
  const int instants = exec::kAddressSanitizer ? 5 : 20;
  std::mt19937 rng(2026);
  std::uniform_real_distribution<double> before(0.0, first_ms), after(first_ms, 0.8 * whole_ms);  // mostly before the end
  int killed_midway = 0;
  std::set<int64_t> resumed;  // the steps restarts continued from, inside the run
  for (int i = 0; i < instants; ++i) {
    const std::string name = fmt::format("killed{}", i);
    const pid_t pid = start(dir, name);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(i % 2 == 0 ? before(rng) : after(rng)));
    kill(pid, SIGKILL);
    killed_midway += finish(pid) == -1;
    const fs::path log = dir / (name + ".log");
    ASSERT_EQ(finish(start(dir, name, log)), 0) << name << ": the resumed run failed";
    if (const int64_t s = resumed_step(log); s > 0 && s < 24) resumed.insert(s);
    const fs::path run = dir / "runs" / name;
    EXPECT_EQ(metrics(run), want) << name << ": losses and gradient norms, every step";
    expect_same_state(last, run, name);
  }
  std::printf("%d of %d runs were killed before they finished (whole run %.0f ms, first checkpoint at %.0f ms); resumed "
              "from steps %s\n", killed_midway, instants, whole_ms, first_ms, fmt::format("{}", fmt::join(resumed, " ")).c_str());
  EXPECT_GE(killed_midway, 1) << "an instant fell inside a run";
  EXPECT_GE(resumed.size(), exec::kAddressSanitizer ? 1u : 3u) << "restarts continued from several steps inside the run";
}

// Killed while it writes the checkpoint of step 5: the file's temporary name is a pipe the test reads, so the
// writer is stopped inside write() with part of the file out, deterministically. The part becomes the
// temporary file a crash leaves; the restart ignores it, continues from step 4 and ends bit-identical.
TEST(Resume, KilledWhileWritingACheckpointResumesFromThePreviousOne) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path, folder = dir / "runs" / "torn" / "checkpoints" / "5";
  ASSERT_EQ(finish(start(dir, "whole")), 0);
  fs::create_directories(folder);
  const fs::path tmp = folder / "state.safetensors.tmp";
  ASSERT_EQ(mkfifo(tmp.c_str(), 0644), 0);
  const pid_t pid = start(dir, "torn");
  const int pipe = open(tmp.c_str(), O_RDONLY | O_NONBLOCK);  // the writer of step 5 opens the other end
  ASSERT_GE(pipe, 0);
  std::string part(4096, '\0');  // the header and the first bytes of the data; the rest fills the pipe and blocks
  size_t got = 0;
  while (got < part.size() && running(pid)) {
    const ssize_t n = read(pipe, part.data() + got, part.size() - got);
    if (n > 0) got += static_cast<size_t>(n);
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));  // no writer yet, or nothing written yet
  }
  ASSERT_EQ(got, part.size()) << "the run ended before it wrote step 5's checkpoint";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(running(pid)) << "the writer is still inside its write";
  kill(pid, SIGKILL);
  EXPECT_EQ(finish(pid), -1);
  close(pipe);
  ASSERT_FALSE(fs::exists(folder / "state.safetensors")) << "nothing takes the checkpoint's name before it is whole";
  ASSERT_TRUE(fs::exists(folder.parent_path() / "4" / "state.safetensors"));
  fs::remove(tmp);
  std::ofstream(tmp, std::ios::binary) << part;
  const fs::path log = dir / "torn.log";
  ASSERT_EQ(finish(start(dir, "torn", log)), 0);
  EXPECT_EQ(resumed_step(log), 4);
  EXPECT_EQ(metrics(dir / "runs" / "torn"), metrics(dir / "runs" / "whole"));
  expect_same_state(train::read_safetensors(dir / "runs" / "whole" / "checkpoints" / "24" / "state.safetensors"),
                    dir / "runs" / "torn", "torn");
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
  flip_a_bit(latest);
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

// Rewrites the safetensors file `from` into `to` after `edit` changed its JSON header and its data, read and
// written here by the format's definition (an u64 little-endian header length, a JSON header of dtype /
// shape / data_offsets, the data) rather than by train/checkpoint.cpp. The metadata's checksum, which covers
// the data, is dropped (a file of another writer has none).
void rewrite(const fs::path& from, const fs::path& to, const std::function<void(nlohmann::json&, std::string&)>& edit) {
  std::ifstream in(from, std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  std::string data = bytes.substr(8 + n);
  edit(header, data);
  header["__metadata__"].erase("checksum");
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i) length[static_cast<size_t>(i)] = static_cast<char>(text.size() >> (8 * i));
  std::ofstream(to, std::ios::binary) << length << text << data;
}

// Sets every element of the tensors named opt_* (Adam's moments, f32) to `marker`.
void mark_moments(const fs::path& from, const fs::path& to, float marker) {
  int marked = 0;
  rewrite(from, to, [&](nlohmann::json& header, std::string& data) {
    for (const auto& [name, t] : header.items()) {
      if (name.rfind("opt_", 0) != 0) continue;
      ASSERT_EQ(t.at("dtype"), "F32") << name;
      for (uint64_t at = t.at("data_offsets")[0]; at < t.at("data_offsets")[1].get<uint64_t>(); at += 4)
        std::memcpy(data.data() + at, &marker, 4);
      ++marked;
    }
  });
  ASSERT_GT(marked, 0) << "the file holds moments";
}

// load_parameters_path: the parameters come from the file, the optimizer starts fresh. With learning rate 0
// one step keeps every parameter bit for bit (p - p*0 - u*0). The moments are the new run's own: a source
// whose moments are all 1e30 gives the same moments as the unmarked source, bit for bit.
TEST(Resume, LoadParametersPathStartsFromSavedParametersWithAFreshOptimizer) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  ASSERT_EQ(finish(start(dir, "source")), 0);
  const fs::path saved = dir / "runs" / "source" / "checkpoints" / "24", marked = dir / "marked.safetensors";
  mark_moments(saved / "state.safetensors", marked, 1e30f);
  ASSERT_EQ(train::read_safetensors(marked).tensors.size(), train::read_safetensors(saved / "state.safetensors").tensors.size());
  const auto load = [&](const std::string& name, const fs::path& from) {
    std::string cmd = fmt::format("cd '{}' && '{}'", dir.string(), REMAT_BINARY);
    for (const std::string& a : kArgs) cmd += " " + a;
    cmd += fmt::format(" run_name={} steps=1 learning_rate=0 load_parameters_path='{}' > /dev/null 2>&1", name, from.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return train::read_safetensors(dir / "runs" / name / "checkpoints" / "1" / "state.safetensors");
  };
  const train::SafeTensors from = train::read_safetensors(saved / "state.safetensors");
  const train::SafeTensors plain = load("plain", saved), got = load("loaded", marked);
  int parameters = 0, moments = 0;
  for (const auto& [name, a] : from.tensors) {
    const exec::Array& b = got.tensors.at(name);
    const size_t size = static_cast<size_t>(a.type().bytes());
    if (name.rfind("opt_", 0) == 0) {
      EXPECT_EQ(std::memcmp(plain.tensors.at(name).bytes(), b.bytes(), size), 0) << name << " is the new run's own";
      ++moments;
    } else {
      EXPECT_EQ(std::memcmp(a.bytes(), b.bytes(), size), 0) << name << " is the saved parameter";
      ++parameters;
    }
  }
  EXPECT_GT(parameters, 0);
  EXPECT_GT(moments, 0);
}

// A checkpoint another safetensors writer left in the run's folder, without remat's metadata (or with a config
// that is not JSON), is refused naming the file and the field (std::out_of_range and a JSON parse error
// escaped main).
TEST(Resume, ACheckpointWithoutRematsMetadataIsRefusedNamingIt) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  ASSERT_EQ(finish(start(dir, "r")), 0);
  const fs::path file = fs::path("runs") / "r" / "checkpoints" / "24" / "state.safetensors";
  std::string cmd = fmt::format("cd '{}' && '{}'", dir.string(), REMAT_BINARY);
  for (const std::string& a : kArgs) cmd += " " + a;
  cmd += " run_name=r 2>&1 >/dev/null";
  rewrite(dir / file, dir / file, [](nlohmann::json& header, std::string&) { header["__metadata__"].erase("step"); });
  testing_support::Output o = testing_support::run_command(cmd);
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_EQ(o.text, fmt::format("error: checkpoint '{}' has no metadata 'step': not a checkpoint remat wrote\n", file.string()));
  rewrite(dir / file, dir / file, [](nlohmann::json& header, std::string&) { header["__metadata__"]["config"] = "{steps"; });
  o = testing_support::run_command(cmd);
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_EQ(o.text.rfind(fmt::format("error: checkpoint '{}': its metadata 'config' is not a JSON object of strings", file.string()), 0),
            0u) << o.text;
}

// Every checkpoint of the run unreadable: the run refuses (exit 2, one line naming them and the choices)
// rather than start again from step 0 and overwrite them, and leaves them as they were.
TEST(Resume, EveryCheckpointCorruptIsRefusedNamingThem) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path, run = dir / "runs" / "r";
  ASSERT_EQ(finish(start(dir, "r")), 0);
  const fs::path files[] = {fs::path("runs") / "r" / "checkpoints" / "23" / "state.safetensors",
                            fs::path("runs") / "r" / "checkpoints" / "24" / "state.safetensors"};
  for (const fs::path& f : files) flip_a_bit(dir / f);
  const auto before = fs::last_write_time(dir / files[1]);
  std::string cmd = fmt::format("cd '{}' && '{}'", dir.string(), REMAT_BINARY);
  for (const std::string& a : kArgs) cmd += " " + a;
  const testing_support::Output o = testing_support::run_command(cmd + " run_name=r 2>&1 >/dev/null");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_EQ(std::count(o.text.begin(), o.text.end(), '\n'), 1) << o.text;
  EXPECT_NE(o.text.find(fmt::format("error: every checkpoint of run '{}' is unreadable: {}, {};",
                                    (fs::path("runs") / "r").string(), files[1].string(), files[0].string())),
            std::string::npos) << o.text;
  EXPECT_NE(o.text.find("Choose another run_name, or delete them"), std::string::npos) << o.text;
  for (const fs::path& f : files) EXPECT_TRUE(fs::exists(dir / f)) << f;
  EXPECT_EQ(fs::last_write_time(dir / files[1]), before);
}

}  // namespace
}  // namespace remat
