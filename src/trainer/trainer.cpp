#include "trainer/trainer.h"

#include "exec/executable.h"
#include "exec/mesh.h"
#include "plan/report.h"
#include "train/checkpoint_manager.h"
#include "train/hf.h"
#include "trainer/curves.h"
#include "trainer/generate.h"
#include "trainer/programs.h"
#include "trainer/trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace remat::trainer {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using train::Batcher;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The clock's reading in seconds, for the trace's timestamps.
double wall_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

std::string duration_str(double s) {
  int total = static_cast<int>(std::lround(s));
  return total >= 60 ? fmt::format("{}m{:02d}s", total / 60, total % 60) : fmt::format("{}s", total);
}

// A line of /proc/self/status in bytes: VmRSS (resident now) or VmHWM (the peak); 0 where there is none.
int64_t resident_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(line.find(':') + 1)) * 1024;  // "VmHWM:  1234 kB"
  return 0;
}

// Whether something done every `period` steps is due after update `done` (it is after the last as well).
bool due(int64_t done, int64_t period, int64_t steps) { return done % period == 0 || done == steps; }

// The mesh of the run's ranks: the pipeline's stages (the outer axis), then the replicas' data, fsdp and tensor.
std::vector<std::pair<std::string, int>> mesh_axes(const RunPlan& run_plan) {
  std::vector<std::pair<std::string, int>> axes;
  if (run_plan.pipeline) axes.emplace_back("stage", static_cast<int>(run_plan.pipeline->shape.stages));
  for (const auto& [name, size] : run_plan.replicas.axes) axes.emplace_back(name, static_cast<int>(size));
  return axes;
}

// The config as the run uses it: one device's mesh and step shape.
RunConfig planned(RunConfig c, const RunPlan& run_plan) {
  c.model = device_model(c, run_plan);
  c.shape = run_plan.shape;
  return c;
}

// Rank 0 alone speaks and writes files (metrics, checkpoints); the others' errors still reach stderr.
bool speaks(const exec::Mesh& mesh) {
  if (mesh.rank() != 0)
    CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "rank {}: cannot silence its output", mesh.rank());
  return mesh.rank() == 0;
}

// CHECKs the loop's keys and that the tokenizer fits the model, then loads the data and says what it is.
train::Dataset load_data(const RunConfig& c, const train::Tokenizer& tokenizer) {
  CHECK(c.steps > 0, "config key 'steps' must be positive, got {}", c.steps);
  CHECK(c.eval_interval > 0 && c.eval_steps > 0 && c.log_period > 0,
        "eval_interval ({}), eval_steps ({}) and log_period ({}) must be positive", c.eval_interval, c.eval_steps,
        c.log_period);
  CHECK(c.checkpoint_period > 0 && c.max_checkpoints >= 0,
        "checkpoint_period ({}) must be positive and max_num_checkpoints_to_keep ({}) at least 0", c.checkpoint_period,
        c.max_checkpoints);
  CHECK(c.tokenizer.type != "byte" || c.model.vocab_size >= tokenizer.vocab_size(),
        "vocab_size is {} but the byte-level tokenizer has {} tokens: set vocab_size={} (or tokenizer_type=sentencepiece)",
        c.model.vocab_size, tokenizer.vocab_size(), tokenizer.vocab_size());
  CHECK(c.tokenizer.type == "byte" || tokenizer.vocab_size() == c.model.vocab_size,
        "vocab_size is {} but the tokenizer '{}' has {} tokens: set vocab_size={}", c.model.vocab_size, c.tokenizer.path,
        tokenizer.vocab_size(), tokenizer.vocab_size());
  train::Dataset data = train::load_dataset(c.data, tokenizer, c.model.vocab_size);
  fmt::print("data: {}; tokenizer {}; {} train / {} validation tokens\n", data.description, tokenizer.description(),
             data.train.size(), data.validation.size());
  return data;
}

// Where this rank's checkpoint file is and what it keeps.
train::CheckpointOptions checkpoint_options(const RunConfig& c, const RunPlan& run_plan, const exec::Mesh& mesh,
                                            int64_t stage) {
  const int64_t shards = c.model.mesh.size("fsdp"), tensors = c.model.mesh.size("tensor");
  return {.layout = {.run_dir = c.run_dir,
                     .stages = run_plan.pipeline ? run_plan.pipeline->shape.stages : 1,
                     .shards = shards,
                     .tensors = tensors},
          .stage = stage,
          .shard = shards == 1 ? 0 : mesh.axis("fsdp").rank,
          .tensor = tensors == 1 ? 0 : mesh.axis("tensor").rank,
          .writer = mesh.axis("data").rank == 0,
          .keep = c.max_checkpoints,
          .config_values = c.config_values,
          .min_loss_scale = c.optimizer.loss_scale.min_scale};
}

// One update's results.
struct Update {
  double loss = 0, grad_norm = 0, lr = 0;
  bool skipped = false;  // loss scaling backed off: the update was not applied
};

// enable_profiler: the step it traces (the ranks start it together) and that step's profile.
struct Profiler {
  Profiler(const RunConfig& c, int64_t resumed)
      : traced(c.enable_profiler ? std::min(c.skip_first_n_steps_for_profiler, c.steps - 1) : -1) {
    if (traced >= 0 && traced < resumed)
      fmt::print("warning: enable_profiler traces step {}, before the step this run resumed from ({}): no trace; set "
                 "skip_first_n_steps_for_profiler to {} or more\n", traced + 1, resumed, resumed);
    profile.record = true;
  }
  const int64_t traced;  // -1: none
  exec::Profile profile;
};

// What a run sets up before its first step, in this order: the plan and the mesh, the data, the compiled
// programs (said as they come), the checkpoints.
struct Session {
  explicit Session(const RunConfig& config);

  // The state the run starts from: initial (or loaded) parameters, zero moments, the initial loss scale, then,
  // when checkpointing, the latest complete checkpoint (with the sampler's position). Returns its progress.
  train::Progress start_state(Batcher& sampler);
  // Runs update `s` (traced when the profiler says so); a non-finite loss or gradient norm is reported.
  Update update(int64_t s, Profiler& profiler);
  // metrics.jsonl's row of an update.
  nlohmann::json row(const Update& u, const train::Progress& at);
  // The validation loss into `result`: per token, and per byte where the data's bytes per token are known.
  void evaluate(RunResult& result) {
    result.validation_loss = evaluator.loss();
    const double bytes = data.validation_bytes_per_token;
    result.validation_loss_per_byte = bytes > 0 ? result.validation_loss / bytes : 0;
  }
  // After the last update: the time, sampling, and the process's memory against the plans'.
  void finish(double seconds, const std::string& metrics_path, RunResult& result);

  const RunPlan run_plan;
  const RunConfig c;     // with the plan's mesh and step shape
  const exec::Mesh mesh;
  const int64_t stage;   // this rank's coordinate along the pipeline (0 without one)
  const bool lead;       // rank 0
  const train::Tokenizer tokenizer;
  const train::Dataset data;
  const int64_t baseline_rss;  // binary, libraries and data, before any compile
  Batcher batcher;
  std::vector<train::ActionSpan> actions;  // the step's, for the trace
  Runner step;
  Evaluator evaluator;
  RunSample generator;
  train::CheckpointManager checkpoints;

 private:
  // A program of the run (`r` says its kind, shape and form); under a pipeline, this rank's stage's.
  compile::Compiled compile(compile::Request r) const { return compile::compile(request(std::move(r))); }
  // `r` with the run's settings: the model, optimizer, fusion, pipeline stage.
  compile::Request request(compile::Request r) const;
  // The training step, said: warnings, the policy's summary, the plan.
  compile::Compiled compile_step();
  void say_shapes() const;
  void prepare_step(Batcher& sampler, int64_t s);
  const std::vector<exec::Array>& traced_step(int64_t s, Profiler& profiler);
  [[noreturn]] void report_divergence(int64_t done, double loss, double norm);
  void write_trace(const RankTrace& mine, int64_t done) const;
};

Session::Session(const RunConfig& config)
    : run_plan(plan_run(config, exec::Mesh::launched_ranks())),
      c(planned(config, run_plan)),
      mesh(mesh_axes(run_plan)),
      stage(run_plan.pipeline ? mesh.axis("stage").rank : 0),
      lead(speaks(mesh)),
      tokenizer(c.tokenizer),
      data(load_data(c, tokenizer)),
      baseline_rss(resident_bytes("VmRSS")),
      batcher(data.train, c.shape.seq, c.data_seed, "train", c.data.packing),
      step(compile_step(), nullptr, &mesh),
      evaluator(c, data, step, compile({.shape = {c.shape.batch, c.shape.seq, 1}, .kind = compile::Kind::loss}),
                c.shape.batch),  // evaluation runs microbatches
      generator(c, tokenizer, step, request({})),
      checkpoints(checkpoint_options(c, run_plan, mesh, stage), mesh) {
  say_shapes();
}

compile::Request Session::request(compile::Request r) const {
  r.model = c.model;
  r.optimizer = c.optimizer;
  r.allow_unmatched = c.remat_allow_unmatched;
  r.pipeline = run_plan.pipeline ? &*run_plan.pipeline : nullptr;
  r.stage = stage;
  r.fuse = c.fusion;
  r.dump_ir_after = c.dump_ir_after;
  return r;
}

compile::Compiled Session::compile_step() {
  compile::Compiled compiled = compile({.shape = c.shape, .kind = compile::Kind::train_step});
  for (const std::string& w : compiled.warnings) fmt::print("warning: {}\n", w);
  fmt::print("remat: policy {}; {}{}\n", c.model.remat_policy.written, compiled.explanation.step_summary(),
             run_plan.pipeline ? " (this stage's FLOPs; the bytes saved per microbatch)" : "");
  fmt::print("plan: arena {} device (lower bound {}), {} host; parameters, moments updated in place\n",
             plan::bytes_str(static_cast<double>(compiled.plan.arena[0])),
             plan::bytes_str(static_cast<double>(compiled.plan.lower_bound[0])),
             plan::bytes_str(static_cast<double>(compiled.plan.arena[1])));
  actions = compiled.actions;
  return compiled;
}

void Session::say_shapes() const {
  const int64_t k = c.shape.accumulation, B = c.shape.batch, T = c.shape.seq;
  fmt::print("model: {:.3f}M parameters; {} layers (scan_layers={}), d={}, heads={}/{} kv, mlp={}\n",
             static_cast<double>(nn::param_count(c.model)) / 1e6, c.model.num_decoder_layers, c.model.scan_layers,
             c.model.emb_dim, c.model.num_heads, c.model.num_kv_heads, c.model.mlp_dim);
  const int64_t dp = c.model.mesh.batch_ranks(), fsdp = c.model.mesh.size("fsdp");
  fmt::print("train: {} steps x {}{} microbatch(es) x {} sequences x {} tokens = {} tokens/step\n", c.steps,
             dp == 1      ? ""
             : fsdp == 1 ? fmt::format("{} data-parallel ranks x ", dp)
                         : fmt::format("{} ranks ({} data-parallel x {} FSDP) x ", dp, dp / fsdp, fsdp),
             k, B, T, dp * k * B * T);
  if (run_plan.pipeline)
    fmt::print("pipeline: {} stages ({} chunk(s) each), {} schedule, {} microbatches; this is stage {}\n",
               run_plan.pipeline->shape.stages, run_plan.pipeline->shape.chunks, parallel::schedule_name(run_plan.pipeline->kind),
               run_plan.pipeline->shape.microbatches, stage);
  if (!c.load_parameters_path.empty()) fmt::print("parameters from {}\n", c.load_parameters_path);
}

train::Progress Session::start_state(Batcher& sampler) {
  for (exec::Array& a : step.args) std::memset(a.bytes(), 0, static_cast<size_t>(a.type().bytes()));
  std::vector<exec::Array> params;  // views of the step's parameter buffers, in the model's order
  for (size_t i = 0; i < step.signature.args.size(); ++i)
    if (step.signature.args[i].role == ir::Role::parameter) params.push_back(step.args[i]);
  const nn::ShardIndex shard{mesh.axis("fsdp").rank, mesh.axis("tensor").rank};
  if (run_plan.pipeline)
    nn::init_stage_params(c.model, c.init_seed, train::pipeline_parts(c.model, run_plan.pipeline->shape, stage), params,
                          shard);
  else
    nn::init_params(c.model, c.init_seed, params, shard);
  if (c.optimizer.loss_scale.enabled) step.arg("loss_scale").set(0, c.optimizer.loss_scale.initial);
  if (train::hf::is_folder(c.load_parameters_path)) {  // a Hugging Face folder: whole parameters, a fresh optimizer
    CHECK(!run_plan.pipeline && c.model.mesh.size("fsdp") == 1 && c.model.mesh.size("tensor") == 1,
          "load_parameters_path '{}' is a Hugging Face folder: it loads without pipeline stages, FSDP or tensor "
          "parallelism (ici_pipeline_parallelism=1, ici/dcn_fsdp_parallelism=1, ici/dcn_tensor[_sequence]_parallelism=1); "
          "convert it first (remat convert to=remat) and load the file on one process",
          c.load_parameters_path);
    checkpoints.restore(step.state(), train::hf::read_parameters(c.load_parameters_path, c.model), c.load_parameters_path,
                        train::Restore::parameters);
  } else if (!c.load_parameters_path.empty()) {
    checkpoints.load_parameters(step.state(), c.load_parameters_path);  // a fresh optimizer
  }
  return c.enable_checkpointing ? checkpoints.resume(step.state(), sampler) : train::Progress{};
}

// Sets the step's arguments for update `s`: its batch (this data-parallel rank's part of the sampler's next
// draw) and the step counter. Every updated value (parameters, moments, loss-scale state) is donated: the step
// writes it into its argument's buffer, where the next step reads it.
void Session::prepare_step(Batcher& sampler, int64_t s) {
  // The replicas are the data and fsdp ranks (the stages of one replica take the same part); under a pipeline
  // the ranks without the first stage or the last draw their part of the batch as well, into a scratch.
  const nn::Mesh& replicas = c.model.mesh;
  const int64_t part = replicas.batch_ranks() == 1 ? 0 : mesh.axis(replicas.batch_group()).rank;
  const size_t tokens = static_cast<size_t>(c.shape.accumulation * c.shape.batch * c.shape.seq);
  std::vector<int32_t> scratch;
  exec::Array* inputs = arg_if(step.signature, step.args, "inputs");
  exec::Array* targets = arg_if(step.signature, step.args, "targets");
  if (!inputs || !targets) scratch.resize(tokens);
  sampler.next(c.shape.accumulation * c.shape.batch, inputs ? inputs->data<int32_t>() : scratch.data(),
               targets ? targets->data<int32_t>() : scratch.data(), part, replicas.batch_ranks());
  step.arg("step").set(0, static_cast<double>(s));
}

// Update `s` with a profile: every rank writes its trace, rank 0 says the profile.
const std::vector<exec::Array>& Session::traced_step(int64_t s, Profiler& profiler) {
  prepare_step(batcher, s);
  mesh.all(true);  // the ranks start it together
  const double from = wall_seconds();
  step.executable.set_profile(&profiler.profile);
  const std::vector<exec::Array>& out = step.executable.run();
  step.executable.set_profile(nullptr);
  const double seconds = wall_seconds() - from;
  write_trace(rank_trace(profiler.profile, actions, mesh.rank(), from, from + seconds), s + 1);
  if (mesh.rank() == 0) {
    fmt::print("profile of step {} (rank 0): {}", s + 1, profiler.profile.breakdown());
    const exec::MatmulFloor floor = exec::matmul_floor(profiler.profile);
    if (floor.seconds > 0)
      fmt::print("matmul floor of step {}: {:.1f} ms ({:.6g} GFLOP of matmuls and attention at oneDNN's rate on their {} "
               "shapes run alone); the step took {:.1f} ms, {:.2f}x its floor\n",
               s + 1, 1e3 * floor.seconds, floor.flops / 1e9, floor.shapes, 1e3 * seconds, seconds / floor.seconds);
  }
  return out;
}

Update Session::update(int64_t s, Profiler& profiler) {
  if (s != profiler.traced) prepare_step(batcher, s);
  const std::vector<exec::Array>& out = s == profiler.traced ? traced_step(s, profiler) : step.executable.run();
  const auto result = [&](const char* name) { return out[static_cast<size_t>(step.signature.result(name))].get(0); };
  const Update u{.loss = result("loss"), .grad_norm = result("grad_norm"), .lr = result("lr"),
                 .skipped = c.optimizer.loss_scale.enabled && result("finite") == 0};
  if (!std::isfinite(u.loss) || (!u.skipped && !std::isfinite(u.grad_norm))) report_divergence(s + 1, u.loss, u.grad_norm);
  return u;
}

nlohmann::json Session::row(const Update& u, const train::Progress& at) {
  nlohmann::json row = {{"step", at.step}, {"loss", u.loss}, {"grad_norm", u.grad_norm}, {"lr", u.lr}};
  if (c.optimizer.loss_scale.enabled) row["loss_scale"] = step.arg("loss_scale").get(0), row["skipped_steps"] = at.skipped;
  return row;
}

// Update `done` gave a non-finite loss or gradient norm. The run is deterministic, so the state before it
// is rebuilt (from the last checkpoint, or the start) and that update runs again in the debugging form (a
// finite check after every op): the first check that fails names the op. Always throws.
void Session::report_divergence(int64_t done, double loss, double norm) {
  const std::string what = fmt::format("training diverged at step {}: loss {}, gradient norm {}", done, loss, norm);
  fmt::print("{}; running it again with a finite check after every op\n", what);
  Batcher replay(data.train, c.shape.seq, c.data_seed, "train", c.data.packing);
  const train::Progress from = start_state(replay);
  for (int64_t s = from.step; s + 1 < done; ++s) {
    prepare_step(replay, s);
    step.executable.run();
  }
  prepare_step(replay, done - 1);
  // Under MPI each rank checks its own ops (its shards): the message says which rank found what.
  const std::string where = mesh.size() > 1 ? fmt::format(" on rank {}", mesh.rank()) : "";
  std::string first = fmt::format("no op gave a non-finite value{} when the step ran again", where);
  try {
    compile::Compiled checked = compile({.shape = c.shape, .kind = compile::Kind::train_step, .check_finite = true});
    exec::Executable debug(std::move(checked.program), std::move(checked.plan), {.mesh = &mesh});
    debug.run(step.args);
  } catch (const Error& e) {
    first = fmt::format("the first non-finite value{}: {}", where, e.what());
  }
  CHECK(false, "{}; {}.{} Lower learning_rate (now {})", what, first,
        c.enable_checkpointing ? fmt::format(" The last checkpoint (step {}) is kept.", from.step) : "",
        c.optimizer.learning_rate);
  __builtin_unreachable();
}
// Writes this rank's trace of step `done`; rank 0 merges every rank's into trace.json (a shared filesystem, as
// for checkpoints) and prints where it is and each rank's bubble.
void Session::write_trace(const RankTrace& mine, int64_t done) const {
  const fs::path dir = c.run_dir, part = dir / fmt::format("trace.rank{}.json", mesh.rank());
  train::make_folder(dir, train::kWritableOutput);
  train::write_text(part, to_json(mine).dump());
  mesh.all(true);  // every part written
  if (mesh.rank() != 0) return;
  std::vector<RankTrace> ranks;
  for (int r = 0; r < mesh.size(); ++r) {
    const fs::path f = dir / fmt::format("trace.rank{}.json", r);
    std::ifstream in(f);
    CHECK(in.good(), "trace part {} is missing: the ranks do not share base_output_directory ({})", f.string(), c.run_dir);
    ranks.push_back(rank_trace_from(nlohmann::json::parse(in)));
    std::error_code ec;
    fs::remove(f, ec);
    CHECK(!ec, "cannot delete trace part '{}': {}", f.string(), ec.message());
  }
  std::vector<std::string> idle;
  for (double b : bubbles(ranks)) idle.push_back(fmt::format("{:.1f}%", 100 * b));
  const fs::path trace = dir / "trace.json";
  train::write_text(trace, chrome_trace(ranks).dump());
  fmt::print("trace of step {}: {} (chrome://tracing or ui.perfetto.dev); idle per rank{}: {}\n", done, trace.string(),
             run_plan.pipeline ? " (the pipeline's bubble)" : "", fmt::join(idle, " "));
}

// The loop's output: a progress line every log_period steps (tokens/s over the steps since the last, evaluation
// time left out) and evaluation lines on the terminal; metrics.jsonl, a row per update, on rank 0.
class Log {
 public:
  Log(const Session& s, int64_t resumed)
      : c_(s.c), lead_(s.lead), resumed_(resumed), path_((fs::path(s.c.run_dir) / "metrics.jsonl").string()) {
    if (lead_) {
      train::make_folder(c_.run_dir, train::kWritableOutput);
      if (resumed > 0) truncate_metrics(path_, resumed);
      metrics_.open(path_, resumed > 0 ? std::ios::app : std::ios::trunc);
    }
    CHECK(!lead_ || metrics_.good(), "cannot write metrics file '{}': {}; {}", path_, std::strerror(errno),
          train::kWritableOutput);
  }
  // After update `done`: the progress line when due (its tokens/s into `row`).
  void updated(nlohmann::json& row, int64_t done, const Update& u) {
    ++window_steps_;
    if (!due(done, c_.log_period, c_.steps)) return;
    const double window = seconds_since(window_start_), elapsed = seconds();
    const double ms = 1e3 * window / static_cast<double>(window_steps_);
    const int64_t tokens = c_.model.mesh.batch_ranks() * c_.shape.accumulation * c_.shape.batch * c_.shape.seq;
    const double tok_s = static_cast<double>(window_steps_ * tokens) / window;
    fmt::print("step {:>5}/{} | loss {:.4f} | lr {:.2e} | {:>7.0f} tok/s | {:6.1f} ms/step | ETA {}\n", done,
               c_.steps, u.loss, u.lr, tok_s, ms,
               duration_str(elapsed / static_cast<double>(done - resumed_) * static_cast<double>(c_.steps - done)));
    std::fflush(stdout);
    row["tokens_per_s"] = tok_s;
    window_start_ = Clock::now();
    window_steps_ = 0;
  }
  void evaluated(nlohmann::json& row, int64_t done, const RunResult& r) {
    fmt::print("eval  {:>5}/{} | validation loss {}\n", done, c_.steps, validation_loss_str(r));
    row["validation_loss"] = r.validation_loss;
    if (r.validation_loss_per_byte > 0) row["validation_loss_per_byte"] = r.validation_loss_per_byte;
    window_start_ = Clock::now();  // keep evaluation time out of tokens/s
  }
  void write(const nlohmann::json& row) {
    if (!lead_) return;
    metrics_ << row.dump() << "\n";
    metrics_.flush();
    if (row.contains("validation_loss")) write_curves(c_.run_dir);  // curves.svg, updated at each evaluation
  }
  double seconds() const { return seconds_since(start_); }
  const std::string& path() const { return path_; }

 private:
  // metrics.jsonl keeps the rows of the steps before `step` (a resumed run writes the rest again).
  static void truncate_metrics(const std::string& path, int64_t step);

  const RunConfig& c_;
  const bool lead_;
  const int64_t resumed_;
  const std::string path_;
  std::ofstream metrics_;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point window_start_ = start_;
  int64_t window_steps_ = 0;
};

void Log::truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  std::string kept;
  int64_t at = 0;
  for (std::string line; std::getline(in, line);) {
    ++at;
    if (line.empty()) continue;
    int64_t row_step = 0;
    try {
      row_step = nlohmann::json::parse(line).at("step").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      CHECK(false, "metrics file '{}' line {} is not a row remat wrote ({}): repair or delete the file to resume", path,
            at, e.what());
    }
    if (row_step <= step) kept += line + "\n";
  }
  in.close();
  train::write_text(path, kept);
}

void Session::finish(double seconds, const std::string& metrics_path, RunResult& result) {
  fmt::print("done in {}; metrics in {}; measured peak {} device (planned {})\n", duration_str(seconds), metrics_path,
             plan::bytes_str(static_cast<double>(step.executable.measured_peak(plan::Space::device))),
             plan::bytes_str(static_cast<double>(step.executable.plan().lower_bound[0])));
  // Under FSDP sampling gathers the weights, under tensor parallelism the logits, and under a pipeline it passes
  // the stages, so every rank samples (the same bytes); otherwise rank 0 alone.
  const bool together = c.model.mesh.size("fsdp") > 1 || c.model.mesh.size("tensor") > 1 || run_plan.pipeline;
  const std::string text = lead || together ? generator.text() : "";
  const int64_t planned = step.bytes() + evaluator.program().bytes() + generator.bytes();
  const int64_t peak = resident_bytes("VmHWM");
  // Everything the process holds beyond its baseline should be planned: the "unplanned" rest is what the
  // plans do not know about (heap of the compiler, thread stacks, library code and caches).
  auto str = [](int64_t bytes) { return plan::bytes_str(static_cast<double>(bytes)); };
  const bool shared = evaluator.program().executable.shares_arenas() && generator.shares_arenas();
  fmt::print("process: peak RSS {} = baseline {} (before compiling) + planned {} (step {}, evaluation {}, sampling {}: "
             "arguments and arenas{}) + unplanned {}\n",
             str(peak), str(baseline_rss), str(planned), str(step.bytes()), str(evaluator.program().bytes()),
             str(generator.bytes()), shared ? ", evaluation and sampling in the step's arenas" : "",
             peak - baseline_rss - planned < 0 ? fmt::format("-{}", str(planned + baseline_rss - peak))
                                               : str(peak - baseline_rss - planned));
  result.peak_rss = peak;
  result.baseline_rss = baseline_rss;
  result.planned_bytes = planned;
  fmt::print("sample ({}, prompt \"{}\"):\n{}\n",
             c.sample_temperature > 0 ? fmt::format("temperature {}", c.sample_temperature) : "greedy",
             printable(c.sample_prompt), printable(text));
}

}  // namespace

std::string validation_loss_str(const RunResult& r) {
  return fmt::format("{:.4f} nats/token{}", r.validation_loss,
                     r.validation_loss_per_byte > 0 ? fmt::format(", {:.4f} nats/byte", r.validation_loss_per_byte) : "");
}

RunResult run(const RunConfig& config) {
  Session s(config);
  const train::Progress resumed = s.start_state(s.batcher);
  Log log(s, resumed.step);
  Profiler profiler(s.c, resumed.step);
  RunResult result;
  for (train::Progress at = resumed; at.step < s.c.steps;) {
    const Update u = s.update(at.step, profiler);
    at = {.step = at.step + 1, .skipped = at.skipped + u.skipped};
    result.train_loss = u.loss;
    nlohmann::json row = s.row(u, at);
    log.updated(row, at.step, u);
    if (due(at.step, s.c.eval_interval, s.c.steps)) {
      s.evaluate(result);
      log.evaluated(row, at.step, result);
    }
    log.write(row);
    if (s.c.enable_checkpointing && due(at.step, s.c.checkpoint_period, s.c.steps))
      s.checkpoints.save(s.step.state(), at, s.batcher);
  }
  if (resumed.step >= s.c.steps) {  // a finished run, resumed: nothing to train
    s.evaluate(result);
    fmt::print("the run was complete at step {}; validation loss {}\n", resumed.step, validation_loss_str(result));
  }
  s.finish(log.seconds(), log.path(), result);
  return result;
}

}  // namespace remat::trainer
