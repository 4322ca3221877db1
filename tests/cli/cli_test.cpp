// End to end: the `remat` binary as a user runs it. `train` prints progress, evaluation, the sample and
// the final line, and writes one JSONL record per step that agrees with what it printed; `plan` exits 3
// over hbm_limit with XLA's "needs X of Y" line and 0 under it; `--timeline` writes a well-formed SVG with
// one band per category; a bad key exits 2 naming it.
#include "cli/config.h"
#include "compile/compile.h"
#include "ir/cost.h"
#include "exec/exec.h"
#include "nn/nn.h"
#include "support/filecheck.h"
#include "support/command.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace remat {
namespace {

namespace fs = std::filesystem;

using testing_support::Output;

// Runs `remat ARGS` in `folder` (default: the repository root); the output has stdout and stderr.
Output remat_cli(const std::string& args, const std::string& folder = std::string(REMAT_TEST_DATA) + "/..") {
  return testing_support::run_command(fmt::format("cd '{}' && '{}' {} 2>&1", folder, REMAT_BINARY, args));
}

using testing_support::TempDir;

// A 1-layer model small enough to train a few steps in a test.
const char* kSmall = "base_emb_dim=32 base_num_decoder_layers=1 base_num_query_heads=2 base_num_kv_heads=2 head_dim=16 "
                     "base_mlp_dim=64 per_device_batch_size=2 max_target_length=32";

std::string captured(const std::string& text, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(pattern)) ? m[1].str() : "";
}

TEST(Cli, TrainPrintsProgressEvalSampleAndWritesMatchingMetrics) {
  TempDir dir;
  Output o = remat_cli(fmt::format("train {} steps=4 log_period=2 eval_interval=2 eval_steps=1 sample_length=16 "
                                   "base_output_directory={} run_name=e2e",
                                   kSmall, dir.path.string()));
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(testing_support::filecheck(R"(
// CHECK: remat: policy full; saved {{[0-9.]+ [KMG]?i?B}} on device, 0 B offloaded to host; {{.*}} GFLOP recompute
// CHECK-NEXT: plan: arena
// CHECK: train: 4 steps x 1 microbatch(es) x 2 sequences x 32 tokens = 64 tokens/step
// CHECK: step     2/4 | loss {{[0-9]+\.[0-9]+}} | lr {{[0-9.]+e-0[0-9]}} | {{ *[0-9]+}} tok/s | {{ *[0-9.]+}} ms/step | ETA
// CHECK-NEXT: eval      2/4 | validation loss {{[0-9]+\.[0-9]+}} nats/token, {{[0-9]+\.[0-9]+}} nats/byte
// CHECK: step     4/4 | loss
// CHECK-NEXT: eval      4/4 | validation loss
// CHECK-NEXT: done in {{.*}}; metrics in {{.*}}metrics.jsonl; measured peak [[PEAK:[0-9.]+ [KMG]?i?B]] device (planned [[PEAK]])
// CHECK-NEXT: process: peak RSS {{[0-9.]+ [KMG]?i?B}} = baseline {{[0-9.]+ [KMG]?i?B}} (before compiling) + planned {{[0-9.]+ [KMG]?i?B}} (step {{[0-9.]+ [KMG]?i?B}}, evaluation {{[0-9.]+ [KMG]?i?B}}, sampling {{[0-9.]+ [KMG]?i?B}}: arguments and arenas{{(, evaluation and sampling in the step's arenas)?}}) + unplanned {{-?[0-9.]+ [KMG]?i?B}}
// CHECK-NEXT: sample (temperature 0.7, prompt "The "):
// CHECK-NEXT: The
// CHECK: final: train loss {{[0-9]+\.[0-9]+}}, validation loss {{[0-9]+\.[0-9]+}} nats/token, {{[0-9]+\.[0-9]+}} nats/byte
)",
                                       o.text),
            "");
  std::ifstream in(dir.path / "e2e" / "metrics.jsonl");
  ASSERT_TRUE(in.good()) << "no metrics.jsonl under " << dir.path;
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(records.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(records[i].at("step"), i + 1);
    EXPECT_TRUE(std::isfinite(records[i].at("loss").get<double>()));
    EXPECT_GT(records[i].at("grad_norm").get<double>(), 0);
    EXPECT_EQ(records[i].contains("validation_loss"), i % 2 == 1) << records[i];
  }
  // The printed figures are the recorded ones.
  EXPECT_EQ(captured(o.text, R"(final: train loss ([0-9.]+))"), fmt::format("{:.4f}", records[3].at("loss").get<double>()));
  EXPECT_EQ(captured(o.text, R"(eval +4/4 \| validation loss ([0-9.]+))"),
            fmt::format("{:.4f}", records[3].at("validation_loss").get<double>()));
  EXPECT_EQ(captured(o.text, R"(eval +2/4 \| validation loss ([0-9.]+))"),
            fmt::format("{:.4f}", records[1].at("validation_loss").get<double>()));
}

TEST(Cli, PlanOverTheLimitExitsThreeWithTheNeedsLine) {  // the tiny default: 85 MiB
  Output json = remat_cli("plan --json");
  ASSERT_EQ(json.status, 0) << json.text;
  const int64_t total = nlohmann::json::parse(json.text).at("total");
  ASSERT_GT(total, 1 << 20) << "the figures below print in MiB";
  const int64_t half = total / 2;
  Output over = remat_cli(fmt::format("plan hbm_limit={}", half));
  EXPECT_EQ(over.status, 3) << over.text;
  EXPECT_NE(over.text.find(fmt::format("Out of memory: needs {:.2f} MiB of {:.2f} MiB (over by {:.2f} MiB)", total / 1048576.0,
                                       half / 1048576.0, (total - half) / 1048576.0)),
            std::string::npos)
      << over.text;
  EXPECT_EQ(remat_cli(fmt::format("plan hbm_limit={}", total - 1)).status, 3);
  Output fits = remat_cli(fmt::format("plan hbm_limit={}", total));
  EXPECT_EQ(fits.status, 0) << fits.text;
  EXPECT_EQ(fits.text.find("Out of memory"), std::string::npos);
}

TEST(Cli, TimelineIsWellFormedSvgWithOneBandPerCategory) {
  TempDir dir;
  const fs::path svg = dir.path / "t.svg";
  Output o = remat_cli(fmt::format("plan {} --timeline {}", kSmall, svg.string()));
  ASSERT_EQ(o.status, 0) << o.text;
  std::string text = testing_support::read_file(svg.string());
  // Drop the polygons' long point lists first: std::regex recurses per character and would overflow the stack.
  int polygons = 0;
  for (size_t at = 0; (at = text.find("points=\"", at)) != std::string::npos; ++polygons) {
    const size_t close = text.find('"', at + 8);
    ASSERT_NE(close, std::string::npos);
    text.erase(at + 8, close - at - 8);
    at += 9;
  }
  EXPECT_EQ(polygons, 7);
  // Well-formed: every element closed, in order.
  std::vector<std::string> open;
  const std::regex tag(R"(<(/?)([a-z]+)[^>]*?(/?)>)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), tag); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    if (m[1] == "/") {
      ASSERT_FALSE(open.empty()) << "</" << m[2] << "> closes nothing";
      ASSERT_EQ(open.back(), m[2].str());
      open.pop_back();
    } else if (m[3] != "/") {
      open.push_back(m[2]);
    }
  }
  EXPECT_TRUE(open.empty()) << "unclosed <" << (open.empty() ? "" : open.back()) << ">";
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  // One filled band per category, each with its legend entry in the same colour.
  const std::regex band(R"re(<polygon points="" fill="(#[0-9a-f]{6})" stroke="none"/>\n<rect [^>]*fill="(#[0-9a-f]{6})"/><text [^>]*>([a-z ]+)</text>)re");
  std::vector<std::string> names, colours;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), band); it != std::sregex_iterator(); ++it) {
    EXPECT_EQ((*it)[1], (*it)[2]);
    colours.push_back((*it)[1]);
    names.push_back((*it)[3]);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"parameters", "optimizer state", "batch", "weight copies", "saved residuals",
                                             "gradients", "temporaries"}));
  std::sort(colours.begin(), colours.end());
  EXPECT_EQ(std::unique(colours.begin(), colours.end()), colours.end()) << "distinct colours";
}

// The configs are built in: from an empty folder outside the repository, with a config file of the user's
// own (in yet another folder) that names `model: tiny`.
TEST(Cli, RunsFromAnyFolderWithAConfigFileAnywhere) {
  TempDir work, elsewhere;
  std::ofstream(elsewhere.path / "mine.yml") << "model: tiny\nsteps: 2\neval_interval: 2\neval_steps: 1\n"
                                                "sample_length: 4\nper_device_batch_size: 2\n";
  Output o = remat_cli(fmt::format("train {} max_target_length=32 base_num_decoder_layers=1",
                                   (elsewhere.path / "mine.yml").string()),
                       work.path.string());
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("train: 2 steps x 1 microbatch(es) x 2 sequences x 32 tokens"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("1 layers (scan_layers=true), d=128"), std::string::npos) << "the tiny preset, built in: " << o.text;
  EXPECT_TRUE(fs::is_regular_file(work.path / "runs" / "tiny" / "metrics.jsonl")) << "runs/ under the working folder";
  // A preset beside the user's file wins over the built-in one of the same name.
  fs::create_directories(elsewhere.path / "models");
  std::ofstream(elsewhere.path / "models" / "tiny.yml") << "base_mlp_dim: 48\n";
  Output p = remat_cli(fmt::format("explain {}", (elsewhere.path / "mine.yml").string()), work.path.string());
  ASSERT_EQ(p.status, 0) << p.text;
  EXPECT_NE(p.text.find("[2,128,48]"), std::string::npos) << "mlp width from models/tiny.yml beside the file: " << p.text;
  Output bad = remat_cli("plan model=nope", work.path.string());
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.text.find("has no preset 'nope'; available: llama2-70b, llama2-7b, llama3-8b, tiny, tinyllama-1.1b"), std::string::npos)
      << bad.text;
}

// "1.50 GiB" -> bytes (to the 2 decimals printed).
double parse_size(const std::string& text) {
  double value = 0;
  char unit[8] = {};
  EXPECT_EQ(std::sscanf(text.c_str(), "%lf %7s", &value, unit), 2) << text;
  const std::string u = unit;
  return value * (u == "GiB" ? 1 << 30 : u == "MiB" ? 1 << 20 : u == "KiB" ? 1 << 10 : 1);
}

// The plan is the process: a model whose parameters (41M, 164 MB in f32) dwarf the 64 MiB allowance
// trains, evaluates and samples within the training step's plan (what `remat plan` totals: evaluation and
// sampling run in its arenas, on its parameters) plus the process's baseline, in f32 and bf16, with remat
// full and none, and with fused projections (whose initialisation stacks unfused draws). Peak RSS is the
// kernel's VmHWM, read by the binary; an evaluation or a sampler holding its own copy of the weights,
// or a kernel allocating its workspace outside the arena, shows here.
TEST(Cli, PeakMemoryIsThePlansPlusTheBaseline) {
  // AddressSanitizer's shadow memory and quarantine are not planned: there, one run, and only the lower bounds.
  const std::vector<const char*> runs = {"dtype=float32 remat_policy=full", "dtype=float32 remat_policy=none",
                                         "dtype=bfloat16 remat_policy=full", "dtype=bfloat16 remat_policy=none",
                                         "dtype=float32 remat_policy=minimal fused_qkv=true fused_mlp=true"};
  TempDir work;
  const std::string model = "base_emb_dim=512 base_num_decoder_layers=2 base_num_query_heads=8 base_num_kv_heads=8 "
                            "head_dim=64 base_mlp_dim=2048 vocab_size=32000 max_target_length=128 "
                            "per_device_batch_size=4 steps=3 eval_steps=2 eval_interval=3 sample_length=2";
  for (size_t r = 0; r < (exec::kAddressSanitizer ? 1 : runs.size()); ++r) {
      const char* run = runs[r];
      Output o = remat_cli(fmt::format("train {} {}", model, run), work.path.string());
      ASSERT_EQ(o.status, 0) << o.text;
      const std::string size = "([0-9.]+ [KMG]?i?B)";
      const double peak = parse_size(captured(o.text, "process: peak RSS " + size));
      const double baseline = parse_size(captured(o.text, "= baseline " + size));
      const double planned = parse_size(captured(o.text, "\\+ planned " + size));
      const double step = parse_size(captured(o.text, "\\(step " + size));
      EXPECT_GT(step, 4 * 41e6 * 3) << "parameters and both moments are in the step's plan";
      if (!exec::kAddressSanitizer) {
        EXPECT_LE(peak, planned + baseline + 64.0 * (1 << 20)) << run << "\n" << o.text;
        EXPECT_LE(peak, step + baseline + 64.0 * (1 << 20)) << "evaluation and sampling run in the step's arenas\n" << o.text;
      }
      EXPECT_GE(peak, planned) << "the arenas are faulted in when created";
  }
}

// No silent divergence: a learning rate of 1e30 makes step 2's gradient norm non-finite; the run stops with
// a non-zero status naming the step and, from running that step again (from the last checkpoint, or from the
// start) with a finite check after every op, the first op whose output went non-finite; no checkpoint of it.
TEST(Cli, DivergenceStopsNamingTheStepAndTheFirstNonFiniteOp) {
  TempDir work;
  Output o = remat_cli(fmt::format("train {} steps=4 learning_rate=1e30 warmup_steps=0 enable_checkpointing=true "
                                   "checkpoint_period=1",
                                   kSmall),
                       work.path.string());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_EQ(testing_support::filecheck(R"(
// CHECK: error: training diverged at step 2: loss {{[^,]+}}, gradient norm {{[^;]+}}; the first non-finite value: {{.*}}check_finite (scope '{{[^']+}}'): element {{[0-9]+}} of {{[a-z0-9]+\[[0-9,]*\]}} is {{-?(nan|inf)}}, the output of {{[a-z_]+}} (scope '{{[^']+}}'{{.*}}. The last checkpoint (step 1) is kept. Lower learning_rate (now 1e+30)
)", o.text), "") << o.text;
  const fs::path checkpoints = work.path / "runs" / "tiny" / "checkpoints";
  EXPECT_TRUE(fs::exists(checkpoints / "1" / "state.safetensors"));
  EXPECT_FALSE(fs::exists(checkpoints / "2"));
  std::ifstream metrics(work.path / "runs" / "tiny" / "metrics.jsonl");
  std::string first, second;
  std::getline(metrics, first);
  EXPECT_FALSE(std::getline(metrics, second)) << "one row: step 1";
  EXPECT_EQ(nlohmann::json::parse(first).at("step"), 1);
  Output again = remat_cli(fmt::format("train {} steps=4 learning_rate=1e30 warmup_steps=0 run_name=fresh", kSmall),
                           work.path.string());
  EXPECT_EQ(again.status, 2);
  const std::string op = "(the first non-finite value: [^\\n]*?)\\. (The last|Lower)";
  EXPECT_NE(captured(o.text, op), "");
  EXPECT_EQ(captured(again.text, op), captured(o.text, op))
      << "replayed from the start, the same op: " << again.text;
}

// The sample reaches the terminal escaped: a control byte as \xNN, a backslash doubled.
TEST(Cli, SampleEscapesNonPrintableBytes) {
  TempDir work;
  Output o = remat_cli(fmt::format("train {} steps=1 sample_length=2 \"sample_prompt=$(printf 'A\\001B\\\\')\"", kSmall),
                       work.path.string());
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("prompt \"A\\x01B\\\\\"):\nA\\x01B\\\\"), std::string::npos) << o.text;
  for (char c : o.text) EXPECT_TRUE(c == '\n' || c == '\t' || (c >= 32 && c < 127)) << "byte " << static_cast<int>(c);
}

TEST(Cli, UnknownKeyExitsTwoNamingIt) {
  Output o = remat_cli("plan no_such_key=1");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_NE(o.text.find("no_such_key"), std::string::npos) << o.text;
}

// Under a pipeline `remat plan` plans every rank's own program from shapes alone. The most microbatches each
// stashes at once, read from its plan (the buffers of each microbatch's actions), follow the schedules' known
// counts — GPipe m on every rank, 1F1B min(p - s, m) on rank s, Megatron's interleaved 1F1B
// min((p - s - 1)·2 + (v - 1)·p + 1, v·m) — as the schedule simulation's own count does; the bubble is
// (p-1)/(m+p-1) of the time for equal stages.
TEST(Cli, PlanShowsEveryPipelineRanksPlan) {
  struct Case {
    const char* keys;
    std::function<int(int)> stashed;  // by rank
  };
  const int p = 4, m = 8, v = 2;
  const std::vector<Case> cases = {
      {"pipeline_schedule=1f1b num_layers_per_pipeline_stage=2", [&](int s) { return std::min(p - s, m); }},
      {"pipeline_schedule=gpipe num_layers_per_pipeline_stage=2", [&](int) { return m; }},
      {"pipeline_schedule=interleaved_1f1b num_layers_per_pipeline_stage=1",
       [&](int s) { return std::min((p - s - 1) * 2 + (v - 1) * p + 1, v * m); }}};
  for (const Case& c : cases) {
    testing_support::Output o = testing_support::run_command(
        fmt::format("'{}' plan base_num_decoder_layers=8 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 {} --json 2>&1",
                    REMAT_BINARY, c.keys));
    ASSERT_EQ(o.status, 0) << o.text;
    const nlohmann::json ranks = nlohmann::json::parse(o.text).at("pipeline").at("ranks");
    ASSERT_EQ(ranks.size(), 4u);
    for (int r = 0; r < 4; ++r) {
      const nlohmann::json& rank = ranks[static_cast<size_t>(r)];
      EXPECT_EQ(rank.at("most_stashed").get<int>(), c.stashed(r)) << c.keys << " rank " << r;
      EXPECT_EQ(rank.at("peak_in_flight").get<int>(), c.stashed(r)) << c.keys << " rank " << r;
      if (std::string(c.keys).find("interleaved") == std::string::npos) {
        EXPECT_NEAR(rank.at("bubble").get<double>(), 3.0 / 11.0, 1e-12) << c.keys;
      }
      EXPECT_GT(rank.at("total").get<double>(), rank.at("arguments").at("parameters").get<double>()) << rank.dump();
      // Messages: one activation [B, T, D] f32 per microbatch and chunk to the next stage, its gradient back.
      const double message = 4.0 * 8 * 128 * 128;  // base.yml: 16 x 4 stages / 8 = 8 sequences of 128 tokens, D 128
      const nlohmann::json& comm = rank.at("communication").at("by_op");
      const int sends = (r < 3 ? 8 : 0) + (r > 0 ? 8 : 0);  // one chunk per rank outside interleaving
      if (std::string(c.keys).find("interleaved") == std::string::npos) {
        EXPECT_EQ(comm.contains("send") ? comm.at("send").at("count").get<int>() : 0, sends) << c.keys << " rank " << r;
        EXPECT_EQ(comm.contains("recv") ? comm.at("recv").at("bytes").get<double>() : 0, sends * message) << c.keys;
      }
    }
  }
  testing_support::Output text = testing_support::run_command(
      fmt::format("'{}' plan ici_pipeline_parallelism=2 pipeline_schedule=gpipe num_pipeline_microbatches=2 "
                  "base_num_decoder_layers=2 2>&1", REMAT_BINARY));
  EXPECT_NE(text.text.find("rank  0 | F0 F1 "), std::string::npos) << text.text;
  EXPECT_NE(text.text.find("Each rank's plan"), std::string::npos) << text.text;
  testing_support::Output split = testing_support::run_command(fmt::format(
      "'{}' plan ici_pipeline_parallelism=2 per_device_batch_size=1 num_pipeline_microbatches=4 base_num_decoder_layers=2 2>&1",
      REMAT_BINARY));
  EXPECT_EQ(split.status, 2) << split.text;
  EXPECT_NE(split.text.find("per_device_batch_size=1 x ici_pipeline_parallelism=2 = 2 sequences per pipeline do not "
                            "split into num_pipeline_microbatches=4 equal microbatches"),
            std::string::npos)
      << split.text;
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// `remat plan` with data parallelism: one device's all-reduces are one per parameter tensor and one for the
// loss (counted from the model's parameter list), over the parameters' f32 bytes and the loss's 4, and each
// device sends 2 (N-1)/N of them (chunks out, sums back). Without it there is no communication.
TEST(Cli, PlanReportsEachDevicesCommunication) {
  const nn::ModelConfig tiny = cli::load_config("", {}).run.model;
  const double param_bytes = 4.0 * static_cast<double>(nn::param_count(tiny));
  for (int ranks : {2, 8}) {
    testing_support::Output o = testing_support::run_command(
        fmt::format("'{}' plan ici_data_parallelism={} --json 2>&1", REMAT_BINARY, ranks));
    ASSERT_EQ(o.status, 0) << o.text;
    const nlohmann::json c = nlohmann::json::parse(o.text).at("communication").at("by_op").at("all_reduce");
    EXPECT_EQ(c.at("count").get<size_t>(), nn::param_specs(tiny).size() + 1);
    EXPECT_EQ(c.at("bytes").get<double>(), param_bytes + 4);
    EXPECT_DOUBLE_EQ(c.at("sent").get<double>(), 2.0 * (ranks - 1) / ranks * (param_bytes + 4));
  }
  testing_support::Output one = testing_support::run_command(fmt::format("'{}' plan --json 2>&1", REMAT_BINARY));
  EXPECT_TRUE(nlohmann::json::parse(one.text).at("communication").at("by_op").empty()) << one.text;
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// `--layers-per-group` with remat_policy=auto: the group size searched with both policies, printed so that the
// three lines given by hand plan the same step (on tiny, with offloading ruled out, groups of one layer win at
// 41 MiB: 40.94 against 41.94 without groups); without auto the flag is refused naming the fix.
TEST(Cli, AutoWithTheGroupSizePrintsThreeLinesThatPlanTheSameByHand) {
  const std::string model = "model=tiny hbm_limit=41MiB host_limit=1KiB";
  Output a = remat_cli(fmt::format("plan {} remat_policy=auto --layers-per-group", model));
  ASSERT_EQ(a.status, 0) << a.text;
  const std::string size = captured(a.text, R"(\n  layers_per_group: ([0-9]+)\n)"),
                    policy = captured(a.text, R"(\n  remat_policy: (custom\([^)]*\)))"),
                    group = captured(a.text, R"(\n  group_remat_policy: ([^\n]+)\n)");
  ASSERT_NE(size, "") << a.text;
  ASSERT_NE(policy, "") << a.text;
  EXPECT_NE(size, "0") << "groups win under this budget: " << a.text;
  ASSERT_NE(group, "") << a.text;
  Output b = remat_cli(fmt::format("plan {} layers_per_group={} 'remat_policy={}' 'group_remat_policy={}'", model, size,
                                   policy, group));
  ASSERT_EQ(b.status, 0) << b.text;
  const std::string total = R"(Total device memory: ([0-9.]+ [KMG]iB))";
  EXPECT_EQ(captured(a.text, total), captured(b.text, total));
  EXPECT_NE(captured(b.text, total), "");
  Output refused = remat_cli(fmt::format("plan {} remat_policy=full --layers-per-group", model));
  EXPECT_EQ(refused.status, 2);
  EXPECT_NE(refused.text.find("--layers-per-group searches the group size with remat_policy=auto (remat_policy is 'full')"),
            std::string::npos) << refused.text;
}

// Losses and gradient norms per step from a run's metrics.jsonl.
std::vector<std::pair<double, double>> losses(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::vector<std::pair<double, double>> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    out.emplace_back(j.at("loss").get<double>(), j.at("grad_norm").get<double>());
  }
  return out;
}

// remat_policy=auto trains with the placement it prints, bit for bit as when that placement is given by hand;
// it is not the all-device one (the budget binds: some name is recomputed or offloaded, as the measured rates
// make cheaper), and it fits. Two searches and two runs: the release build only (Makefile RELEASE_ONLY).
TEST(Cli, AutoPolicyTrainsAsThePrintedPolicyGivenByHand) {
  TempDir dir;
  const std::string model = "base_emb_dim=32 base_num_decoder_layers=2 base_num_query_heads=2 base_num_kv_heads=2 "
                            "head_dim=16 base_mlp_dim=64 per_device_batch_size=4 max_target_length=64 steps=3 "
                            "eval_interval=100 sample_length=0";
  Output a = remat_cli(fmt::format("train {} remat_policy=auto hbm_limit=1.6MiB base_output_directory={} run_name=auto",
                                   model, dir.path.string()));
  ASSERT_EQ(a.status, 0) << a.text;
  const std::string policy = captured(a.text, R"(remat_policy: (custom\([^)]*\)))");
  ASSERT_NE(policy, "") << a.text;
  EXPECT_TRUE(policy.find("=remat") != std::string::npos || policy.find("=offload") != std::string::npos) << policy;
  const double peak = std::stod(captured(a.text, R"(peak ([0-9.]+) MiB)"));
  EXPECT_LE(peak, 1.6);
  Output b = remat_cli(fmt::format("train {} 'remat_policy={}' base_output_directory={} run_name=by_hand", model, policy,
                                   dir.path.string()));
  ASSERT_EQ(b.status, 0) << b.text;
  const auto x = losses(dir.path / "auto"), y = losses(dir.path / "by_hand");
  ASSERT_EQ(x.size(), 3u);
  EXPECT_EQ(x, y);
  // Nothing fits: an error naming the smallest peak.
  Output none = remat_cli(fmt::format("train {} remat_policy=auto hbm_limit=1MiB base_output_directory={}", model, dir.path.string()));
  EXPECT_EQ(none.status, 2);
  EXPECT_NE(none.text.find("nothing fits hbm_limit 1.00 MiB: the smallest peak any placement"), std::string::npos) << none.text;
  Output plan = remat_cli(fmt::format("plan {} remat_policy=auto hbm_limit=1MiB", model));
  EXPECT_EQ(plan.status, 3) << plan.text;
}

// oneDNN limited to AVX2 (DNNL_MAX_CPU_ISA; the ISA of CPUs without AVX-512) has no bf16 matmul, and its f32
// GEMMs give an output other bits in another thread decomposition: a bf16 run still trains, its matmuls widened
// to f32 tiles, bit-identically at 1 and 3 threads, and close to the run on every ISA this CPU has.
TEST(Cli, Bf16TrainsOnAvx2OneDnnIdenticallyAtAnyThreadCount) {
  TempDir dir;
  const std::string model = "base_emb_dim=32 base_num_decoder_layers=2 base_num_query_heads=2 base_num_kv_heads=2 "
                            "head_dim=16 base_mlp_dim=64 per_device_batch_size=4 max_target_length=64 steps=3 "
                            "eval_interval=100 sample_length=0 dtype=bfloat16";
  auto train = [&](const std::string& env, const std::string& name) {
    Output o = testing_support::run_command(fmt::format("cd '{}' && env {} '{}' train {} base_output_directory={} run_name={} 2>&1",
                                                        dir.path.string(), env, REMAT_BINARY, model, dir.path.string(), name));
    EXPECT_EQ(o.status, 0) << o.text;
    return losses(dir.path / name);
  };
  const auto one = train("DNNL_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1", "avx2_1");
  const auto three = train("DNNL_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=3", "avx2_3");
  const auto native = train("OMP_NUM_THREADS=2", "native");
  ASSERT_EQ(one.size(), 3u);
  EXPECT_EQ(one, three);
  ASSERT_EQ(native.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(one[i].first, native[i].first, 0.02 * native[i].first) << "step " << i + 1;
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// enable_profiler prints what the traced step is made of: its kernel calls and FLOPs are the program's (counted
// statically from the compiled step, scan bodies times their length), and the rows by op kind add up to it.
TEST(Cli, ProfilerBreakdownAddsUpToTheProgram) {
  TempDir dir;
  const std::string keys = "base_emb_dim=32 base_num_decoder_layers=2 base_num_query_heads=2 base_num_kv_heads=2 "
                           "head_dim=16 base_mlp_dim=64 per_device_batch_size=4 max_target_length=64";
  Output o = remat_cli(fmt::format("train {} steps=2 enable_profiler=true sample_length=0 eval_interval=100 "
                                   "base_output_directory={} run_name=p", keys, dir.path.string()));
  ASSERT_EQ(o.status, 0) << o.text;
  const std::string gflop = captured(o.text, R"(profile of step 2 \(rank 0\): kernel time [0-9.]+ ms in [0-9]+ calls, ([0-9.e+-]+) GFLOP)");
  ASSERT_NE(gflop, "") << o.text;
  std::vector<std::string> overrides;
  std::istringstream split(keys);
  for (std::string kv; split >> kv;) overrides.push_back(kv);
  const cli::Config c = cli::load_config("", overrides);
  const compile::Compiled step = compile::compile({.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer});
  EXPECT_NEAR(std::stod(gflop), ir::flops(step.program) / 1e9, 1e-5 * ir::flops(step.program) / 1e9);
  // The op rows' calls add up to the total.
  const int64_t calls = std::stoll(captured(o.text, R"(ms in ([0-9]+) calls)"));
  int64_t sum = 0;
  const std::string table = o.text.substr(o.text.find("  by op"), o.text.find("  by scope") - o.text.find("  by op"));
  std::regex row(R"(\n  [a-z_]+ +[0-9.]+ +[0-9.]+% +([0-9]+) )");
  for (auto it = std::sregex_iterator(table.begin(), table.end(), row); it != std::sregex_iterator(); ++it)
    sum += std::stoll((*it)[1].str());
  EXPECT_EQ(sum, calls) << table;
  EXPECT_NE(o.text.find("in matmuls and attention"), std::string::npos);
  // The trace names each matmul call's operands, types the program's dot_generals have (found here by walking its
  // graph and bodies), and its rate.
  std::set<std::string> program_operands;
  const std::function<void(const ir::Graph&)> walk = [&](const ir::Graph& g) {
    for (const ir::Node& n : g.nodes) {
      if (n.body) walk(*n.body);
      if (n.op == ir::Op::dot_general)
        program_operands.insert(ir::type_str(g.type(n.inputs[0])) + " " + ir::type_str(g.type(n.inputs[1])));
    }
  };
  walk(step.program);
  std::ifstream file(dir.path / "p" / "trace.json");
  const nlohmann::json trace = nlohmann::json::parse(file);
  int64_t matmuls = 0;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.value("name", "") != "dot_general") continue;
    ++matmuls;
    EXPECT_TRUE(program_operands.contains(e.at("args").at("operands").get<std::string>())) << e.dump();
    EXPECT_GT(e.at("args").at("GFLOP/s").get<double>(), 0) << e.dump();
  }
  EXPECT_GT(matmuls, 0);
}

// What `remat ARGS` writes to stderr alone, in `folder`; the status is its exit status.
Output remat_errors(const std::string& args, const std::string& folder) {
  return testing_support::run_command(fmt::format("cd '{}' && '{}' {} 2>&1 >/dev/null", folder, REMAT_BINARY, args));
}

// The error a run ends with: exit 2 and one line on stderr, "error: " and the words expected.
void expect_one_line_error(const Output& o, const std::vector<std::string>& words) {
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_EQ(o.text.rfind("error: ", 0), 0u) << o.text;
  EXPECT_EQ(std::count(o.text.begin(), o.text.end(), '\n'), 1) << "one line: " << o.text;
  for (const std::string& w : words) EXPECT_NE(o.text.find(w), std::string::npos) << "names " << w << ": " << o.text;
}

// A short training run's keys (one step, no sample) writing under `out`.
std::string one_step(const fs::path& out) {
  return fmt::format("train {} steps=1 eval_steps=1 sample_length=0 base_output_directory='{}' run_name=r", kSmall,
                     out.string());
}

// File-system failures (tests may run as root, whom a read-only folder does not stop: the paths are under
// /proc, or below a regular file, or a folder where a file goes) end as one line naming the path and the reason.
TEST(CliErrors, AnUnwritableOutputIsOneLineNamingThePathAndTheReason) {
  TempDir dir;
  std::ofstream(dir.path / "file") << "a regular file\n";
  const std::string root = std::string(REMAT_TEST_DATA) + "/..";
  expect_one_line_error(remat_errors(one_step("/proc/remat_runs"), root),
                        {"cannot create folder '/proc/remat_runs/r'", "base_output_directory"});
  expect_one_line_error(remat_errors(one_step(dir.path / "file" / "runs"), root),
                        {fmt::format("cannot create folder '{}'", (dir.path / "file" / "runs" / "r").string()), "Not a directory"});
  // The run folder can be made, its checkpoints folder cannot (a file has its name).
  fs::create_directories(dir.path / "ck" / "r");
  std::ofstream(dir.path / "ck" / "r" / "checkpoints") << "";
  expect_one_line_error(remat_errors(one_step(dir.path / "ck") + " enable_checkpointing=true", root),
                        {fmt::format("cannot create folder '{}'", (dir.path / "ck" / "r" / "checkpoints" / "1").string())});
  // The trace's file is a folder.
  fs::create_directories(dir.path / "tr" / "r" / "trace.json");
  expect_one_line_error(remat_errors(one_step(dir.path / "tr") + " enable_profiler=true", root),
                        {fmt::format("cannot write file '{}'", (dir.path / "tr" / "r" / "trace.json").string()), "Is a directory"});
  // The metrics file is a folder.
  fs::create_directories(dir.path / "me" / "r" / "metrics.jsonl");
  expect_one_line_error(remat_errors(one_step(dir.path / "me"), root),
                        {fmt::format("cannot write metrics file '{}'", (dir.path / "me" / "r" / "metrics.jsonl").string())});
  // The plots of `remat plan`.
  expect_one_line_error(remat_errors("plan --timeline /proc/remat_timeline.svg", root),
                        {"cannot write file '/proc/remat_timeline.svg'"});
  expect_one_line_error(remat_errors("plan --frontier /proc/remat_frontier.svg", root),
                        {"cannot write file '/proc/remat_frontier.svg'"});
}

// A folder under checkpoints/ named by digits beyond int64 is not a step (std::stoll threw out_of_range
// past main): the run ignores it and leaves it.
TEST(CliErrors, AStepFolderBeyondInt64IsIgnored) {
  TempDir dir;
  const fs::path odd = dir.path / "r" / "checkpoints" / "99999999999999999999";
  fs::create_directories(odd);
  const Output o = remat_cli(one_step(dir.path) + " enable_checkpointing=true");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_TRUE(fs::exists(odd));
  EXPECT_TRUE(fs::exists(dir.path / "r" / "checkpoints" / "1" / "state.safetensors"));
}

// A metrics file that is not JSON, met when a run resumes (its rows after the checkpoint are dropped): one
// line naming the file and the line.
TEST(CliErrors, MalformedJsonIsOneLineNamingTheFileAndLine) {
  TempDir dir;
  const std::string root = std::string(REMAT_TEST_DATA) + "/..";
  ASSERT_EQ(remat_cli(one_step(dir.path) + " enable_checkpointing=true").status, 0);
  std::ofstream(dir.path / "r" / "metrics.jsonl", std::ios::app) << "{\"step\": 2, \"loss\": nan}\n";
  expect_one_line_error(remat_errors(one_step(dir.path) + " enable_checkpointing=true steps=2", root),
                        {fmt::format("metrics file '{}' line 2 is not a row remat wrote", (dir.path / "r" / "metrics.jsonl").string()),
                         "parse_error"});
}

// An allocation that fails (2^40 evaluation batches held for the run, a typo'd eval_steps): one line, no abort.
// Run in the release build only (Makefile: RELEASE_ONLY): ASan's operator new cannot throw std::bad_alloc, a
// failed allocation aborts the process even with allocator_may_return_null=1 (g++ 12's runtime).
TEST(CliErrors, AnAllocationThatFailsIsOneLine) {
  TempDir dir;
  const Output o = testing_support::run_command(fmt::format(
      "cd '{}' && '{}' {} eval_steps=1099511627776 2>&1 >/dev/null", dir.path.string(), REMAT_BINARY,
      one_step(dir.path)));
  expect_one_line_error(o, {"out of memory (an allocation failed)", "eval_steps"});
}

}  // namespace
}  // namespace remat
