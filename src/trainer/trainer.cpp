#include "trainer/trainer.h"

#include "exec/executable.h"
#include "exec/mesh.h"
#include "plan/report.h"
#include "train/checkpoint.h"
#include "trainer/trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace remat::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using train::Batcher;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

// This rank's coordinate along the pipeline (0 without one).
int64_t stage_of(const RunConfig& c, const exec::Mesh& mesh) {
  return c.ici_pipeline_parallelism > 1 ? mesh.axis("stage").rank : 0;
}

// A program of the run; under a pipeline, this rank's (`stage`).
compile::Compiled compile_program(const RunConfig& c, compile::Kind kind, train::StepShape shape, int64_t stage,
                                  bool check_finite = false) {
  std::optional<parallel::Schedule> schedule;
  if (c.ici_pipeline_parallelism > 1) schedule = pipeline_schedule(c);
  return compile::compile({.model = c.model, .shape = shape, .optimizer = c.optimizer, .kind = kind,
                           .allow_unmatched = c.remat_allow_unmatched, .check_finite = check_finite,
                           .pipeline = schedule ? &*schedule : nullptr, .stage = stage, .fuse = c.fusion,
                           .dump_ir_after = c.dump_ir_after});
}

// The argument of that name, or null where the program has none (under a pipeline only the first stage's
// rank takes inputs and only the last's takes targets).
exec::Array* arg_if(const ir::Signature& sig, std::vector<exec::Array>& args, std::string_view name) {
  for (size_t i = 0; i < sig.args.size(); ++i)
    if (sig.args[i].name == name) return &args[i];
  return nullptr;
}

// A compiled program with its executable. Its arguments are its own buffers, except the parameters when
// `step` is given: those are the step's (evaluation and sampling read its weights), and so are its arenas
// where they fit (the programs run one at a time).
struct Runner {
  ir::Signature signature;
  exec::Executable executable;
  std::vector<exec::Array>& args;

  // The step's runner takes the mesh; the others run on the step's.
  explicit Runner(compile::Compiled c, const Runner* step = nullptr, const exec::Mesh* mesh = nullptr)
      : signature(std::move(c.signature)),
        executable(std::move(c.program), std::move(c.plan), {.mesh = step ? step->executable.options().mesh : mesh},
                   step ? &step->executable : nullptr),
        args(executable.own_arguments(shared(signature, step))) {}
  exec::Array& arg(std::string_view name) { return args[static_cast<size_t>(signature.arg(name))]; }
  // What it allocated: its own arguments and the arenas it does not share.
  int64_t bytes() const { return executable.owned_bytes(); }

 private:
  static std::map<int, exec::Array> shared(const ir::Signature& s, const Runner* from) {
    std::map<int, exec::Array> out;
    for (size_t i = 0; from != nullptr && i < s.args.size(); ++i)
      if (s.args[i].role == ir::Role::parameter) out.emplace(static_cast<int>(i), from->args[static_cast<size_t>(from->signature.arg(s.args[i].name))]);
    return out;
  }
};

// Mean loss over a fixed set of validation batches (same batches every evaluation).
class Evaluator {
 public:
  Evaluator(const RunConfig& c, const train::Dataset& d, const Runner& step, int64_t batch, int64_t stage)
      : program_(compile_program(c, compile::Kind::loss, {batch, c.shape.seq, 1}, stage), &step) {
    Batcher batcher(d.validation, c.shape.seq, c.data_seed + 1, "validation");
    tokens_ = static_cast<size_t>(batch * c.shape.seq);
    batches_.assign(static_cast<size_t>(c.eval_steps), std::vector<int32_t>(2 * tokens_));
    for (std::vector<int32_t>& b : batches_) batcher.next(batch, b.data(), b.data() + tokens_);
  }
  double loss() {
    double sum = 0;
    exec::Array* inputs = arg_if(program_.signature, program_.args, "inputs");
    exec::Array* targets = arg_if(program_.signature, program_.args, "targets");
    const auto tokens = static_cast<std::ptrdiff_t>(tokens_);
    for (const std::vector<int32_t>& b : batches_) {
      if (inputs) std::copy(b.begin(), b.begin() + tokens, inputs->data<int32_t>());
      if (targets) std::copy(b.begin() + tokens, b.end(), targets->data<int32_t>());
      sum += program_.executable.run()[static_cast<size_t>(program_.signature.result("loss"))].get(0);
    }
    return sum / static_cast<double>(batches_.size());
  }
  const Runner& program() const { return program_; }

 private:
  Runner program_;
  size_t tokens_;
  std::vector<std::vector<int32_t>> batches_;  // inputs then targets, per batch
};

// Text for the terminal: newlines, tabs and printable ASCII as they are, a backslash doubled, any other
// byte as \xNN (a byte-level model samples control bytes too).
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n' || c == '\t' || (c >= 32 && c < 127)) out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

// Generates `length` bytes after the prompt: one forward pass over the last `seq` bytes per new byte.
std::string sample(const RunConfig& c, Runner& logits_program) {
  const int64_t seq = c.shape.seq;
  std::string text = c.sample_prompt.empty() ? "\n" : c.sample_prompt;
  std::mt19937_64 rng(c.data_seed + 7);
  std::vector<int32_t> none(static_cast<size_t>(seq));  // a pipeline rank without the embedding: not read
  exec::Array* inputs = arg_if(logits_program.signature, logits_program.args, "inputs");
  int32_t* window = inputs ? inputs->data<int32_t>() : none.data();
  const size_t logits_result = static_cast<size_t>(logits_program.signature.result("logits"));
  std::vector<double> w(static_cast<size_t>(c.model.vocab_size));
  for (int64_t n = 0; n < c.sample_length; ++n) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(text.size()) - seq);
    int64_t len = static_cast<int64_t>(text.size()) - start;
    for (int64_t t = 0; t < seq; ++t)  // causal: bytes after the prompt's end do not affect its logits
      window[t] = t < len ? static_cast<unsigned char>(text[static_cast<size_t>(start + t)]) : 0;
    const exec::Array& logits = logits_program.executable.run()[logits_result];
    const float* row = logits.data<float>() + (len - 1) * c.model.vocab_size;
    int next = 0;
    if (c.sample_temperature <= 0) {
      next = static_cast<int>(std::max_element(row, row + c.model.vocab_size) - row);
    } else {
      float top = *std::max_element(row, row + c.model.vocab_size);
      for (size_t v = 0; v < w.size(); ++v) w[v] = std::exp((row[v] - top) / c.sample_temperature);
      next = std::discrete_distribution<int>(w.begin(), w.end())(rng);
    }
    text += static_cast<char>(next);
  }
  return text;
}

namespace fs = std::filesystem;

// What a checkpoint holds besides the step's state tensors.
struct Progress {
  int64_t step = 0;     // updates done
  int64_t skipped = 0;  // steps skipped by loss scaling
};

// The checkpoints this run may delete: its history up to the one it resumed from, and those it wrote since.
// A newer one it did not write (a corrupt one it passed over, a step of another period) stays.
struct Owned {
  int64_t resumed = 0;
  std::set<int64_t> written;
  bool operator()(int64_t step) const { return step <= resumed || written.count(step) > 0; }
};

const std::string kWritableOutput = "set base_output_directory (and run_name) to a folder this process can write";

// A checkpoint's tensors: every argument of the step that carries state from one step to the next.
bool saved(ir::Role role) {
  return role == ir::Role::parameter || role == ir::Role::optimizer_state || role == ir::Role::loss_scale;
}

fs::path checkpoints_of(const RunConfig& c) { return fs::path(c.run_dir) / "checkpoints"; }

// The step folders under checkpoints/, newest first.
std::vector<int64_t> checkpoint_steps(const RunConfig& c) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(checkpoints_of(c), ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = -1;  // a name of digits beyond int64 is no step folder either
    const auto [end, bad] = std::from_chars(name.data(), name.data() + name.size(), step);
    if (e.is_directory(ec) && !name.empty() && bad == std::errc() && end == name.data() + name.size() && step >= 0)
      steps.push_back(step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// The state files of a checkpoint of this run's mesh: one per pipeline stage and FSDP shard ("state.safetensors"
// for one of each; "state.stage1-of-4.fsdp0-of-2.safetensors"), in the order of the ranks holding them. The
// data-parallel replicas of a file's state hold the same bits.
std::vector<std::string> checkpoint_files(const RunConfig& c) {
  const int64_t stages = c.ici_pipeline_parallelism, fsdp = c.model.mesh.size("fsdp");
  std::vector<std::string> files;
  for (int64_t s = 0; s < stages; ++s)
    for (int64_t f = 0; f < fsdp; ++f)
      files.push_back(fmt::format("state{}{}.safetensors", stages == 1 ? "" : fmt::format(".stage{}-of-{}", s, stages),
                                  fsdp == 1 ? "" : fmt::format(".fsdp{}-of-{}", f, fsdp)));
  return files;
}

// This rank's checkpoint file in a step folder.
std::string state_file(const RunConfig& c, const exec::Mesh& ranks) {
  const int64_t fsdp = c.model.mesh.size("fsdp");
  return checkpoint_files(c)[static_cast<size_t>(stage_of(c, ranks) * fsdp + (fsdp == 1 ? 0 : ranks.axis("fsdp").rank))];
}

// The state files in a step folder, whatever mesh wrote them.
std::vector<std::string> state_files(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("state", 0) == 0 && name.ends_with(".safetensors")) files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Whether a state file is one of a checkpoint of this run's mesh.
bool of_mesh(const std::string& file, const RunConfig& c) {
  const std::vector<std::string> mine = checkpoint_files(c);
  return std::find(mine.begin(), mine.end(), file) != mine.end();
}

// Whether a step folder holds every file of a checkpoint of this mesh.
bool complete(const fs::path& dir, const RunConfig& c) {
  for (const std::string& f : checkpoint_files(c))
    if (std::error_code ec; !fs::is_regular_file(dir / f, ec)) return false;
  return true;
}

// Every rank calls it: the first rank of each shard's replicas writes the shard's file; once all are written,
// rank 0 deletes the checkpoints beyond the newest max_num_checkpoints_to_keep complete ones.
void save_checkpoint(const RunConfig& c, const exec::Mesh& ranks, Runner& step, const Batcher& batcher,
                     const Progress& p, Owned& owned) {
  const fs::path dir = checkpoints_of(c) / std::to_string(p.step);
  owned.written.insert(p.step);
  if (ranks.axis("data").rank == 0) {
    std::error_code ec;
    if (!fs::exists(dir, ec)) {  // the new folder's entry reaches the disk before the file in it is trusted
      train::make_folder(dir, kWritableOutput);
      train::sync_folder(checkpoints_of(c));
    }
    std::vector<train::NamedArray> tensors;
    for (size_t i = 0; i < step.signature.args.size(); ++i)
      if (saved(step.signature.args[i].role)) tensors.push_back({step.signature.args[i].name, step.args[i]});
    train::write_safetensors(dir / state_file(c, ranks), tensors,
                             {{"step", std::to_string(p.step)},
                              {"skipped_steps", std::to_string(p.skipped)},
                              {"train_sampler", batcher.state()},
                              {"config", nlohmann::json(c.config_values).dump()}});
  }
  ranks.all(true);  // every shard written
  if (ranks.rank() != 0) return;
  CHECK(complete(dir, c),
        "checkpoint {} lacks shard files after every rank wrote its own: the ranks do not share base_output_directory "
        "({}); FSDP and pipeline checkpoints need a filesystem all ranks share",
        dir.string(), c.run_dir);
  // Keep the newest complete ones; a folder without all its files is a write that never finished.
  int64_t kept = 0;
  for (int64_t s : checkpoint_steps(c)) {
    const fs::path d = checkpoints_of(c) / std::to_string(s);
    if (complete(d, c) && (c.max_checkpoints <= 0 || kept < c.max_checkpoints)) {
      ++kept;
    } else if (s < p.step && owned(s)) {
      std::error_code ec;
      fs::remove_all(d, ec);
      CHECK(!ec, "cannot delete old checkpoint '{}' (max_num_checkpoints_to_keep {}): {}", d.string(), c.max_checkpoints,
            ec.message());
    }
  }
}

// Copies the saved tensors into the step's arguments of the same names; a missing tensor or one of another
// shape is refused, naming the config keys whose values differ from the checkpoint's.
void restore(const RunConfig& c, Runner& step, const train::SafeTensors& s, const fs::path& file, bool parameters_only) {
  std::vector<std::string> differing;
  if (auto it = s.metadata.find("config"); it != s.metadata.end()) {
    std::map<std::string, std::string> saved_config;
    try {
      saved_config = nlohmann::json::parse(it->second).get<std::map<std::string, std::string>>();
    } catch (const nlohmann::json::exception& e) {
      CHECK(false, "checkpoint '{}': its metadata 'config' is not a JSON object of strings ({}): not a file remat wrote",
            file.string(), e.what());
    }
    for (const auto& [k, v] : c.config_values)
      if (auto j = saved_config.find(k); j != saved_config.end() && j->second != v)
        differing.push_back(fmt::format("{}: {} (checkpoint) vs {} (now)", k, j->second, v));
  }
  for (size_t i = 0; i < step.signature.args.size(); ++i) {
    const ir::Slot& a = step.signature.args[i];
    if (!saved(a.role) || (parameters_only && a.role != ir::Role::parameter)) continue;
    auto t = s.tensors.find(a.name);
    CHECK(t != s.tensors.end() && t->second.type() == step.args[i].type(),
          "checkpoint '{}' does not fit this model: {} is {} there and {} here; differing config keys: {}", file.string(),
          a.name, t == s.tensors.end() ? "missing" : ir::type_str(t->second.type()), ir::type_str(step.args[i].type()),
          differing.empty() ? "none" : fmt::format("{}", fmt::join(differing, "; ")));
    std::memcpy(step.args[i].bytes(), t->second.bytes(), static_cast<size_t>(t->second.type().bytes()));
    // A scale saved when loss_scale_min could be below 1 is raised to the floor: the step's finiteness check and
    // unscaling assume a scale >= 1 (train/step.h).
    if (a.role == ir::Role::loss_scale && a.name == "loss_scale")
      step.args[i].set(0, std::max(step.args[i].get(0), c.optimizer.loss_scale.min_scale));
  }
}

// Continues from the run's latest complete checkpoint: a torn, truncated or corrupt one is reported and
// the previous one used. Returns the progress it holds (step 0 when there is none). Refuses when every
// complete checkpoint is unreadable: starting again from step 0 would overwrite them under the same name.
Progress resume(const RunConfig& c, const exec::Mesh& ranks, Runner& step, Batcher& batcher) {
  std::vector<std::string> unreadable;  // this rank's
  for (int64_t s : checkpoint_steps(c)) {
    const fs::path dir = checkpoints_of(c) / std::to_string(s), file = dir / state_file(c, ranks);
    // Decided from the folder's listing, the same on every rank: files of this mesh, even some missing (a
    // write that never finished), are this run's; only files of another mesh are refused.
    const std::vector<std::string> files = state_files(dir);
    CHECK(files.empty() || std::any_of(files.begin(), files.end(),
                                       [&](const std::string& f) { return of_mesh(f, c); }),
          "checkpoint {} was written by another mesh ({}), this run's rank {} needs {}: resume with the "
          "ici/dcn_fsdp_parallelism and pipeline keys it was saved with (a checkpoint is not resharded), or start a new "
          "run_name",
          dir.string(), fmt::join(files, ", "), ranks.rank(), file.filename().string());
    train::SafeTensors saved_state;
    bool ok = complete(dir, c);  // else never finished
    if (ok) {
      try {
        saved_state = train::read_safetensors(file);
      } catch (const Error& e) {
        fmt::print("warning: {}; trying the previous checkpoint\n", e.what());
        unreadable.push_back(file.string());
        ok = false;
      }
    }
    if (!ranks.all(ok)) continue;  // every rank resumes from the same step, or none does
    restore(c, step, saved_state, file, false);
    // A file another safetensors writer left here may lack remat's metadata.
    const auto field = [&](const std::string& key) {
      const auto it = saved_state.metadata.find(key);
      CHECK(it != saved_state.metadata.end(), "checkpoint '{}' has no metadata '{}': not a checkpoint remat wrote",
            file.string(), key);
      return it->second;
    };
    const auto count = [&](const std::string& key) {
      const std::string text = field(key);
      int64_t n = -1;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      CHECK(ec == std::errc() && end == text.data() + text.size() && n >= 0,
            "checkpoint '{}': metadata '{}' is '{}', not a count: not a checkpoint remat wrote", file.string(), key, text);
      return n;
    };
    batcher.restore(field("train_sampler"));
    Progress p{count("step"), count("skipped_steps")};
    fmt::print("resumed from {} (step {})\n", file.string(), p.step);
    return p;
  }
  CHECK(ranks.all(unreadable.empty()),
        "every checkpoint of run '{}' is unreadable{}: {}; remat does not start the run again from step 0 over them. "
        "Choose another run_name, or delete them (or the folder {}) to start this run afresh",
        c.run_dir, ranks.size() > 1 ? fmt::format(" (rank {})", ranks.rank()) : "",
        unreadable.empty() ? std::string("another rank's files") : fmt::format("{}", fmt::join(unreadable, ", ")),
        checkpoints_of(c).string());
  return {};
}

// The state a run starts from: initial (or loaded) parameters, zero moments, the initial loss scale, then,
// when checkpointing, the latest complete checkpoint (with the sampler's position). Returns its progress.
Progress start_state(const RunConfig& c, const exec::Mesh& ranks, Runner& step, Batcher& batcher) {
  for (exec::Array& a : step.args) std::memset(a.bytes(), 0, static_cast<size_t>(a.type().bytes()));
  std::vector<exec::Array> params;  // views of the step's parameter buffers, in the model's order
  for (size_t i = 0; i < step.signature.args.size(); ++i)
    if (step.signature.args[i].role == ir::Role::parameter) params.push_back(step.args[i]);
  const int64_t shard = ranks.axis("fsdp").rank;
  if (c.ici_pipeline_parallelism > 1)
    nn::init_stage_params(c.model, c.init_seed, train::pipeline_parts(c.model, pipeline_schedule(c).shape, stage_of(c, ranks)),
                          params, shard);
  else
    nn::init_params(c.model, c.init_seed, params, shard);
  if (c.optimizer.loss_scale.enabled) step.arg("loss_scale").set(0, c.optimizer.loss_scale.initial);
  if (!c.load_parameters_path.empty()) {  // saved parameters, a fresh optimizer
    fs::path file = c.load_parameters_path;
    if (std::error_code ec; fs::is_directory(file, ec)) file /= state_file(c, ranks);
    restore(c, step, train::read_safetensors(file), file, true);
  }
  return c.enable_checkpointing ? resume(c, ranks, step, batcher) : Progress{};
}

// Sets the step's arguments for update `s`: its batch (this data-parallel rank's part of the sampler's next
// draw) and the step counter.
void prepare_step(const RunConfig& c, const exec::Mesh& mesh, Runner& step, Batcher& batcher, int64_t s) {
  // The replicas are the data and fsdp ranks (the stages of one replica take the same part); under a pipeline
  // the ranks without the first stage or the last draw their part of the batch as well, into a scratch.
  const nn::Mesh& replicas = c.model.mesh;
  const int64_t part = replicas.ranks() == 1 ? 0 : mesh.axis(replicas.group()).rank;
  const size_t tokens = static_cast<size_t>(c.shape.accumulation * c.shape.batch * c.shape.seq);
  std::vector<int32_t> scratch;
  exec::Array* inputs = arg_if(step.signature, step.args, "inputs");
  exec::Array* targets = arg_if(step.signature, step.args, "targets");
  if (!inputs || !targets) scratch.resize(tokens);
  batcher.next(c.shape.accumulation * c.shape.batch, inputs ? inputs->data<int32_t>() : scratch.data(),
               targets ? targets->data<int32_t>() : scratch.data(), part, replicas.ranks());
  step.arg("step").set(0, static_cast<double>(s));
}

// Runs update `s`. Every updated value (parameters, moments, loss-scale state) is donated: the step writes
// it into its argument's buffer, where the next step reads it.
const std::vector<exec::Array>& run_step(const RunConfig& c, const exec::Mesh& mesh, Runner& step, Batcher& batcher,
                                         int64_t s) {
  prepare_step(c, mesh, step, batcher, s);
  return step.executable.run();
}

// Update `done` gave a non-finite loss or gradient norm. The run is deterministic, so the state before it
// is rebuilt (from the last checkpoint, or the start) and that update runs again in the debugging form (a
// finite check after every op): the first check that fails names the op. Always throws.
[[noreturn]] void report_divergence(const RunConfig& c, const exec::Mesh& mesh, const train::Dataset& data, Runner& step,
                                    int64_t done, double loss, double norm) {
  const std::string what = fmt::format("training diverged at step {}: loss {}, gradient norm {}", done, loss, norm);
  fmt::print("{}; running it again with a finite check after every op\n", what);
  Batcher replay(data.train, c.shape.seq, c.data_seed, "train");
  const Progress from = start_state(c, mesh, step, replay);
  for (int64_t s = from.step; s + 1 < done; ++s) run_step(c, mesh, step, replay, s);
  prepare_step(c, mesh, step, replay, done - 1);
  // Under MPI each rank checks its own ops (its shards): the message says which rank found what.
  const std::string where = mesh.size() > 1 ? fmt::format(" on rank {}", mesh.rank()) : "";
  std::string first = fmt::format("no op gave a non-finite value{} when the step ran again", where);
  try {
    compile::Compiled checked = compile_program(c, compile::Kind::train_step, c.shape, stage_of(c, mesh), true);
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
void write_trace(const RunConfig& c, const exec::Mesh& mesh, const RankTrace& mine, int64_t done) {
  const fs::path dir = c.run_dir, part = dir / fmt::format("trace.rank{}.json", mesh.rank());
  train::make_folder(dir, kWritableOutput);
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
             c.ici_pipeline_parallelism > 1 ? " (the pipeline's bubble)" : "", fmt::join(idle, " "));
}

// metrics.jsonl keeps the rows of the steps before `step` (a resumed run writes the rest again).
void truncate_metrics(const std::string& path, int64_t step) {
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

}  // namespace

nn::Mesh mesh_of(const RunConfig& c, int64_t ranks) {
  struct Key {
    const char* name;
    int64_t value;
  };
  std::array<Key, 4> keys = {{{"ici_data_parallelism", c.ici_data_parallelism},
                              {"dcn_data_parallelism", c.dcn_data_parallelism},
                              {"ici_fsdp_parallelism", c.ici_fsdp_parallelism},
                              {"dcn_fsdp_parallelism", c.dcn_fsdp_parallelism}}};
  int64_t given = 1;
  Key* fill = nullptr;
  for (Key& k : keys) {
    CHECK(k.value == -1 || k.value >= 1, "config key '{}' must be >= 1 or -1 (fill with the ranks left), got {}", k.name,
          k.value);
    if (k.value >= 1) {
      given *= k.value;
      continue;
    }
    CHECK(fill == nullptr, "config keys '{}' and '{}' are both -1: at most one parallelism key may fill with the ranks left",
          fill ? fill->name : "", k.name);
    fill = &k;
  }
  const auto shown = [&] {
    std::vector<std::string> s;
    for (const Key& k : keys)
      if (k.value > 1) s.push_back(fmt::format("{}={}", k.name, k.value));
    return s.empty() ? std::string("one device") : fmt::format("{}", fmt::join(s, " "));
  };
  if (fill != nullptr) {
    CHECK(ranks == 0 || ranks % given == 0,
          "{} needs a multiple of {} ranks, but {} {} launched: start `mpirun -np {} remat train ...`", shown(), given,
          ranks, ranks == 1 ? "process was" : "processes were", given);
    fill->value = ranks == 0 ? 1 : ranks / given;
  }
  return {{{"data", keys[0].value * keys[1].value}, {"fsdp", keys[2].value * keys[3].value}}};
}

parallel::Schedule pipeline_schedule(const RunConfig& c) {
  const parallel::ScheduleKind kind = parallel::parse_schedule(c.pipeline_schedule);
  const int64_t p = c.ici_pipeline_parallelism, per = c.num_layers_per_pipeline_stage, L = c.model.num_decoder_layers;
  CHECK(p >= 1 && per >= 1, "ici_pipeline_parallelism ({}) and num_layers_per_pipeline_stage ({}) must be >= 1", p, per);
  const parallel::PipelineShape shape{
      p, c.num_pipeline_microbatches == -1 ? p : c.num_pipeline_microbatches,
      c.num_pipeline_repeats == -1 ? std::max<int64_t>(1, L / (p * per)) : c.num_pipeline_repeats};
  parallel::check_pipeline(kind, shape, L, per);
  const int64_t group = c.model.layers_per_group;
  CHECK(group == 0 || per % group == 0,
        "layers_per_group={} does not divide num_layers_per_pipeline_stage={}: a stage's layers run as whole groups; "
        "make the groups divide a stage's layers", group, per);
  return parallel::make_schedule(kind, shape);
}

train::StepShape pipeline_step_shape(const RunConfig& c, const parallel::Schedule& schedule) {
  const int64_t stages = schedule.shape.stages, m = schedule.shape.microbatches, replica_batch = c.shape.batch * stages;
  CHECK(c.shape.accumulation == 1,
        "gradient_accumulation_steps={} with a pipeline: the pipeline's microbatches accumulate the gradients; set "
        "num_pipeline_microbatches instead (now {}) and gradient_accumulation_steps=1",
        c.shape.accumulation, m);
  CHECK(replica_batch % m == 0,
        "per_device_batch_size={} x ici_pipeline_parallelism={} = {} sequences per pipeline do not split into "
        "num_pipeline_microbatches={} equal microbatches: make the product a multiple of {}",
        c.shape.batch, stages, replica_batch, m, m);
  return {replica_batch / m, c.shape.seq, m};
}

RunResult run(const RunConfig& config) {
  RunConfig c = config;
  // A pipeline's stages are the outer mesh axis; the data and fsdp axes (the replicas) fill the ranks left.
  const int64_t stages = c.ici_pipeline_parallelism, launched = exec::Mesh::launched_ranks();
  std::optional<parallel::Schedule> schedule;
  if (stages > 1) {
    schedule = pipeline_schedule(c);
    CHECK(launched % stages == 0,
          "ici_pipeline_parallelism={} needs a multiple of {} ranks, but {} {} launched: start `mpirun -np {} remat "
          "train ...`", stages, stages, launched, launched == 1 ? "process was" : "processes were", stages);
  }
  c.model.mesh = mesh_of(config, launched / stages);
  std::vector<std::pair<std::string, int>> axes;
  if (stages > 1) axes.emplace_back("stage", static_cast<int>(stages));
  for (const auto& [name, size] : c.model.mesh.axes) axes.emplace_back(name, static_cast<int>(size));
  const exec::Mesh mesh(axes);
  const int64_t stage = stage_of(c, mesh);
  // MaxText's batch: per_device_batch_size on every device, stages included; a replica's batch (its stages'
  // share) is cut into the pipeline's microbatches.
  if (schedule) c.shape = pipeline_step_shape(c, *schedule);
  const int64_t eval_batch = c.shape.batch;  // evaluation runs microbatches
  // Rank 0 alone speaks and writes files (metrics, checkpoints); the others' errors still reach stderr.
  const bool lead = mesh.rank() == 0;
  if (!lead) CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "rank {}: cannot silence its output", mesh.rank());
  CHECK(c.steps > 0, "config key 'steps' must be positive, got {}", c.steps);
  CHECK(c.eval_interval > 0 && c.eval_steps > 0 && c.log_period > 0,
        "eval_interval ({}), eval_steps ({}) and log_period ({}) must be positive", c.eval_interval, c.eval_steps,
        c.log_period);
  CHECK(c.checkpoint_period > 0 && c.max_checkpoints >= 0,
        "checkpoint_period ({}) must be positive and max_num_checkpoints_to_keep ({}) at least 0", c.checkpoint_period,
        c.max_checkpoints);
  train::Dataset data = train::load_dataset(c.dataset_path, c.validation_fraction);
  fmt::print("data: {}; {} train / {} validation bytes\n", data.description, data.train.size(), data.validation.size());
  const int64_t baseline_rss = resident_bytes("VmRSS");  // binary, libraries and data, before any compile
  Batcher batcher(data.train, c.shape.seq, c.data_seed, "train");

  const int64_t k = c.shape.accumulation, B = c.shape.batch, T = c.shape.seq;
  compile::Compiled compiled = compile_program(c, compile::Kind::train_step, c.shape, stage);
  for (const std::string& w : compiled.warnings) fmt::print("warning: {}\n", w);
  fmt::print("remat: policy {}; {}{}\n", c.model.remat_policy.written, compiled.explanation.step_summary(),
             schedule ? " (this stage's FLOPs; the bytes saved per microbatch)" : "");
  fmt::print("plan: arena {} device (lower bound {}), {} host; parameters, moments updated in place\n",
             plan::bytes_str(static_cast<double>(compiled.plan.arena[0])),
             plan::bytes_str(static_cast<double>(compiled.plan.lower_bound[0])),
             plan::bytes_str(static_cast<double>(compiled.plan.arena[1])));
  const std::vector<train::ActionSpan> actions = compiled.actions;  // for the trace
  Runner step(std::move(compiled), nullptr, &mesh);
  const ir::Signature& sig = step.signature;
  Evaluator evaluator(c, data, step, eval_batch, stage);
  Runner generator(compile_program(c, compile::Kind::logits, {1, T, 1}, stage), &step);
  fmt::print("model: {:.3f}M parameters; {} layers (scan_layers={}), d={}, heads={}/{} kv, mlp={}\n",
             static_cast<double>(nn::param_count(c.model)) / 1e6, c.model.num_decoder_layers, c.model.scan_layers,
             c.model.emb_dim, c.model.num_heads, c.model.num_kv_heads, c.model.mlp_dim);
  const int64_t dp = c.model.mesh.ranks(), fsdp = c.model.mesh.size("fsdp");
  fmt::print("train: {} steps x {}{} microbatch(es) x {} sequences x {} tokens = {} tokens/step\n", c.steps,
             dp == 1      ? ""
             : fsdp == 1 ? fmt::format("{} data-parallel ranks x ", dp)
                         : fmt::format("{} ranks ({} data-parallel x {} FSDP) x ", dp, dp / fsdp, fsdp),
             k, B, T, dp * k * B * T);
  if (schedule)
    fmt::print("pipeline: {} stages ({} chunk(s) each), {} schedule, {} microbatches; this is stage {}\n", stages,
               schedule->shape.chunks, parallel::schedule_name(schedule->kind),
               schedule->shape.microbatches, stage);

  RunResult result;
  const train::LossScaleConfig& ls = c.optimizer.loss_scale;
  if (!c.load_parameters_path.empty()) fmt::print("parameters from {}\n", c.load_parameters_path);
  const Progress resumed = start_state(c, mesh, step, batcher);
  Owned owned{.resumed = resumed.step, .written = {}};

  std::string metrics_path = (fs::path(c.run_dir) / "metrics.jsonl").string();
  std::ofstream metrics;
  if (lead) {
    train::make_folder(c.run_dir, kWritableOutput);
    if (resumed.step > 0) truncate_metrics(metrics_path, resumed.step);
    metrics.open(metrics_path, resumed.step > 0 ? std::ios::app : std::ios::trunc);
  }
  CHECK(!lead || metrics.good(), "cannot write metrics file '{}': {}; {}", metrics_path, std::strerror(errno), kWritableOutput);
  auto result_of = [&](const char* name) { return static_cast<size_t>(sig.result(name)); };
  const size_t loss_at = result_of("loss"), norm_at = result_of("grad_norm"), lr_at = result_of("lr");
  int64_t skipped = resumed.skipped;
  const auto start = Clock::now();
  auto window_start = start;
  int64_t window_steps = 0;
  const int64_t traced = c.enable_profiler ? std::min(c.skip_first_n_steps_for_profiler, c.steps - 1) : -1;
  if (traced >= 0 && traced < resumed.step)
    fmt::print("warning: enable_profiler traces step {}, before the step this run resumed from ({}): no trace; set "
               "skip_first_n_steps_for_profiler to {} or more\n", traced + 1, resumed.step, resumed.step);
  exec::Profile profile;  // the traced step's
  profile.record = true;
  for (int64_t s = resumed.step; s < c.steps; ++s) {
    double traced_from = 0;
    if (s == traced) {  // the ranks start it together
      prepare_step(c, mesh, step, batcher, s);
      mesh.all(true);
      traced_from = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
      step.executable.set_profile(&profile);
    }
    const std::vector<exec::Array>& out = s == traced ? step.executable.run() : run_step(c, mesh, step, batcher, s);
    if (s == traced) {
      step.executable.set_profile(nullptr);
      const double until = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
      write_trace(c, mesh, rank_trace(profile, actions, mesh.rank(), traced_from, until), s + 1);
      if (mesh.rank() == 0) fmt::print("profile of step {} (rank 0): {}", s + 1, profile.breakdown());
    }
    const double loss = out[loss_at].get(0), norm = out[norm_at].get(0), lr = out[lr_at].get(0);
    const bool skip = ls.enabled && out[result_of("finite")].get(0) == 0;  // loss scaling: backed off
    skipped += skip;
    if (!std::isfinite(loss) || (!skip && !std::isfinite(norm))) report_divergence(c, mesh, data, step, s + 1, loss, norm);
    result.train_loss = loss;
    ++window_steps;
    const int64_t done = s + 1;
    nlohmann::json row = {{"step", done}, {"loss", loss}, {"grad_norm", norm}, {"lr", lr}};
    if (ls.enabled) row["loss_scale"] = step.arg("loss_scale").get(0), row["skipped_steps"] = skipped;
    if (done % c.log_period == 0 || done == c.steps) {
      const double window = seconds_since(window_start), elapsed = seconds_since(start);
      const double ms = 1e3 * window / static_cast<double>(window_steps);
      const double tok_s = static_cast<double>(window_steps * dp * k * B * T) / window;
      fmt::print("step {:>5}/{} | loss {:.4f} | lr {:.2e} | {:>7.0f} tok/s | {:6.1f} ms/step | ETA {}\n", done,
                 c.steps, loss, lr, tok_s, ms,
                 duration_str(elapsed / static_cast<double>(done - resumed.step) * static_cast<double>(c.steps - done)));
      std::fflush(stdout);
      row["tokens_per_s"] = tok_s;
      window_start = Clock::now();
      window_steps = 0;
    }
    if (done % c.eval_interval == 0 || done == c.steps) {
      result.validation_loss = evaluator.loss();
      fmt::print("eval  {:>5}/{} | validation loss {:.4f} nats/byte\n", done, c.steps, result.validation_loss);
      row["validation_loss"] = result.validation_loss;
      window_start = Clock::now();  // keep evaluation time out of tokens/s
    }
    if (lead) {
      metrics << row.dump() << "\n";
      metrics.flush();
    }
    if (c.enable_checkpointing && (done % c.checkpoint_period == 0 || done == c.steps))
      save_checkpoint(c, mesh, step, batcher, {done, skipped}, owned);
  }
  if (resumed.step >= c.steps) {  // a finished run, resumed: nothing to train
    result.validation_loss = evaluator.loss();
    fmt::print("the run was complete at step {}; validation loss {:.4f} nats/byte\n", resumed.step, result.validation_loss);
  }
  fmt::print("done in {}; metrics in {}; measured peak {} device (planned {})\n", duration_str(seconds_since(start)),
             metrics_path, plan::bytes_str(static_cast<double>(step.executable.measured_peak(plan::Space::device))),
             plan::bytes_str(static_cast<double>(step.executable.plan().lower_bound[0])));
  // Under FSDP sampling gathers the weights and under a pipeline it passes the stages, so every rank samples (the
  // same bytes); otherwise rank 0 alone.
  const std::string text = lead || fsdp > 1 || schedule ? sample(c, generator) : "";
  const int64_t planned = step.bytes() + evaluator.program().bytes() + generator.bytes();
  const int64_t peak = resident_bytes("VmHWM");
  // Everything the process holds beyond its baseline should be planned: the "unplanned" rest is what the
  // plans do not know about (heap of the compiler, thread stacks, library code and caches).
  auto str = [](int64_t bytes) { return plan::bytes_str(static_cast<double>(bytes)); };
  const bool shared = evaluator.program().executable.shares_arenas() && generator.executable.shares_arenas();
  fmt::print("process: peak RSS {} = baseline {} (before compiling) + planned {} (step {}, evaluation {}, sampling {}: "
             "arguments and arenas{}) + unplanned {}\n",
             str(peak), str(baseline_rss), str(planned), str(step.bytes()), str(evaluator.program().bytes()),
             str(generator.bytes()), shared ? ", evaluation and sampling in the step's arenas" : "",
             peak - baseline_rss - planned < 0 ? fmt::format("-{}", str(planned + baseline_rss - peak))
                                               : str(peak - baseline_rss - planned));
  result.peak_rss = peak;
  result.baseline_rss = baseline_rss;
  result.planned_bytes = planned;
  fmt::print("sample ({}, prompt \"{}\"):\n{}\n", c.sample_temperature > 0 ? fmt::format("temperature {}", c.sample_temperature) : "greedy",
             printable(c.sample_prompt), printable(text));
  return result;
}

}  // namespace remat::trainer
