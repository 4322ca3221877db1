#include "train/trainer.h"

#include "exec/executable.h"
#include "plan/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace remat::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string duration_str(double s) {
  int total = static_cast<int>(std::lround(s));
  return total >= 60 ? fmt::format("{}m{:02d}s", total / 60, total % 60) : fmt::format("{}s", total);
}

struct Tokens {
  exec::Array inputs, targets;
};

Tokens make_tokens(int64_t k, int64_t b, int64_t t) {
  ir::Type type{DType::i32, {k, b, t}};
  return {exec::Array(type), exec::Array(type)};
}

// Mean loss over a fixed set of validation batches (same batches every evaluation).
class Evaluator {
 public:
  Evaluator(const RunConfig& c, const Dataset& d) : config_(c) {
    graph_ = nn::loss_graph(c.model, c.shape.batch, c.shape.seq);
    Batcher batcher(d.validation, c.shape.seq, c.data_seed + 1, "validation");
    for (int64_t i = 0; i < c.eval_steps; ++i) {
      Tokens t = make_tokens(1, c.shape.batch, c.shape.seq);
      batcher.next(c.shape.batch, t.inputs.data<int32_t>(), t.targets.data<int32_t>());
      batches_.push_back(std::move(t));
    }
  }
  double loss(const std::vector<exec::Array>& params) const {
    double sum = 0;
    ir::Type mb{DType::i32, {config_.shape.batch, config_.shape.seq}};
    for (const Tokens& t : batches_) {
      std::vector<exec::Array> args = params;
      args.push_back(t.inputs.view(mb));
      args.push_back(t.targets.view(mb));
      sum += exec::run(graph_, args)[0].get(0);
    }
    return sum / static_cast<double>(batches_.size());
  }

 private:
  const RunConfig& config_;
  ir::Graph graph_;
  std::vector<Tokens> batches_;
};

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += (c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? static_cast<char>(c) : '?';
  return out;
}

// Generates `length` bytes after the prompt: one forward pass over the last `seq` bytes per new byte.
std::string sample(const RunConfig& c, const std::vector<exec::Array>& params) {
  const int64_t seq = c.shape.seq;
  ir::Graph g = nn::logits_graph(c.model, 1, seq);
  std::string text = c.sample_prompt.empty() ? "\n" : c.sample_prompt;
  std::mt19937_64 rng(c.data_seed + 7);
  exec::Array window(ir::Type{DType::i32, {1, seq}});
  for (int64_t n = 0; n < c.sample_length; ++n) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(text.size()) - seq);
    int64_t len = static_cast<int64_t>(text.size()) - start;
    for (int64_t t = 0; t < seq; ++t)  // causal: bytes after the prompt's end do not affect its logits
      window.data<int32_t>()[t] = t < len ? static_cast<unsigned char>(text[static_cast<size_t>(start + t)]) : 0;
    std::vector<exec::Array> args = params;
    args.push_back(window);
    exec::Array logits = exec::run(g, args)[0];
    const float* row = logits.data<float>() + (len - 1) * c.model.vocab_size;
    int next = 0;
    if (c.sample_temperature <= 0) {
      next = static_cast<int>(std::max_element(row, row + c.model.vocab_size) - row);
    } else {
      std::vector<double> w(static_cast<size_t>(c.model.vocab_size));
      float top = *std::max_element(row, row + c.model.vocab_size);
      for (size_t v = 0; v < w.size(); ++v) w[v] = std::exp((row[v] - top) / c.sample_temperature);
      next = std::discrete_distribution<int>(w.begin(), w.end())(rng);
    }
    text += static_cast<char>(next);
  }
  return text;
}

}  // namespace

namespace {
// A line of /proc/self/status in bytes: VmRSS (resident now) or VmHWM (the peak); 0 where there is none.
int64_t resident_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(line.find(':') + 1)) * 1024;  // "VmHWM:  1234 kB"
  return 0;
}
}  // namespace

RunResult run(const RunConfig& c) {
  CHECK(c.steps > 0, "config key 'steps' must be positive, got {}", c.steps);
  CHECK(c.eval_interval > 0 && c.eval_steps > 0 && c.log_period > 0,
        "eval_interval ({}), eval_steps ({}) and log_period ({}) must be positive", c.eval_interval, c.eval_steps,
        c.log_period);
  Dataset data = load_dataset(c.dataset_path, c.validation_fraction);
  fmt::print("data: {}; {} train / {} validation bytes\n", data.description, data.train.size(), data.validation.size());
  const int64_t baseline_rss = resident_bytes("VmRSS");  // binary, libraries and data, before any compile
  Batcher batcher(data.train, c.shape.seq, c.data_seed, "train");
  Evaluator evaluator(c, data);

  const int64_t k = c.shape.accumulation, B = c.shape.batch, T = c.shape.seq;
  ir::Graph forward = nn::loss_graph(c.model, B, T);
  for (const std::string& w : rematerialize::lint(forward, {.allow_unmatched = c.remat_allow_unmatched, .names = nn::vocabulary(c.model)}))
    fmt::print("warning: {}\n", w);
  rematerialize::Decider decider(nn::vocabulary(c.model));
  ir::Graph traced = step_graph(c.model, c.shape, c.optimizer, &decider);
  fmt::print("remat: policy {}; {}\n", c.model.remat_policy,
             rematerialize::explain(decider.records(), forward, traced).step_summary());
  ir::inline_remat_regions(traced);
  plan::Plan memory = plan::build(traced, {.donate = step_donation(c.model)});
  fmt::print("plan: arena {} device (lower bound {}), {} host; parameters, moments updated in place\n",
             plan::bytes_str(static_cast<double>(memory.arena[0])), plan::bytes_str(static_cast<double>(memory.lower_bound[0])),
             plan::bytes_str(static_cast<double>(memory.arena[1])));
  for (const auto& [result, param] : step_donation(c.model))
    ASSERT(memory.donated_param[static_cast<size_t>(result)] == param);  // the loop relies on in-place updates
  exec::Executable step(std::move(traced), std::move(memory));
  std::vector<exec::Array> params = nn::init_params(c.model, c.init_seed);
  std::vector<exec::Array> m, v;
  for (const exec::Array& p : params) m.push_back(exec::Array::zeros(p.type()));
  for (const exec::Array& p : params) v.push_back(exec::Array::zeros(p.type()));
  fmt::print("model: {:.3f}M parameters; {} layers (scan_layers={}), d={}, heads={}/{} kv, mlp={}\n",
             static_cast<double>(nn::param_count(c.model)) / 1e6, c.model.num_decoder_layers, c.model.scan_layers,
             c.model.emb_dim, c.model.num_heads, c.model.num_kv_heads, c.model.mlp_dim);
  fmt::print("train: {} steps x {} microbatch(es) x {} sequences x {} tokens = {} tokens/step\n", c.steps, k, B, T,
             k * B * T);

  std::filesystem::create_directories(c.run_dir);
  std::string metrics_path = (std::filesystem::path(c.run_dir) / "metrics.jsonl").string();
  std::ofstream metrics(metrics_path);
  CHECK(metrics.good(), "cannot write metrics file '{}' (config keys base_output_directory, run_name)", metrics_path);

  RunResult result;
  Tokens tokens = make_tokens(k, B, T);
  exec::Array step_index(ir::Type{DType::i32, {}});
  const LossScaleConfig& ls = c.optimizer.loss_scale;
  exec::Array loss_scale = exec::Array::zeros({DType::f32, {}}), loss_scale_count = exec::Array::zeros({DType::i32, {}});
  loss_scale.set(0, ls.initial);
  int64_t skipped = 0;
  const auto start = Clock::now();
  auto window_start = start;
  int64_t window_steps = 0;
  for (int64_t s = 0; s < c.steps; ++s) {
    batcher.next(k * B, tokens.inputs.data<int32_t>(), tokens.targets.data<int32_t>());
    step_index.data<int32_t>()[0] = static_cast<int32_t>(s);
    std::vector<exec::Array> args = params;
    args.insert(args.end(), m.begin(), m.end());
    args.insert(args.end(), v.begin(), v.end());
    args.push_back(step_index);
    if (ls.enabled) {
      args.push_back(loss_scale);
      args.push_back(loss_scale_count);
    }
    args.push_back(tokens.inputs);
    args.push_back(tokens.targets);
    // params, m and v are donated: the step writes their new values into these same buffers.
    const std::vector<exec::Array>& out = step.run(args);
    const double loss = out[0].get(0), norm = out[1].get(0), lr = out[2].get(0);
    if (ls.enabled) {  // the scale state comes back after params', m', v'
      const size_t base = 3 + 3 * m.size();
      loss_scale.set(0, out[base].get(0));
      loss_scale_count.set(0, out[base + 1].get(0));
      if (out[base + 2].get(0) == 0) ++skipped;
    }
    CHECK(std::isfinite(loss), "training diverged at step {}: loss is {}; lower learning_rate", s + 1, loss);
    result.train_loss = loss;
    ++window_steps;
    const int64_t done = s + 1;
    nlohmann::json row = {{"step", done}, {"loss", loss}, {"grad_norm", norm}, {"lr", lr}};
    if (ls.enabled) row["loss_scale"] = loss_scale.get(0), row["skipped_steps"] = skipped;
    if (done % c.log_period == 0 || done == c.steps) {
      const double window = seconds_since(window_start), elapsed = seconds_since(start);
      const double ms = 1e3 * window / static_cast<double>(window_steps);
      const double tok_s = static_cast<double>(window_steps * k * B * T) / window;
      fmt::print("step {:>5}/{} | loss {:.4f} | lr {:.2e} | {:>7.0f} tok/s | {:6.1f} ms/step | ETA {}\n", done,
                 c.steps, loss, lr, tok_s, ms, duration_str(elapsed / static_cast<double>(done) * static_cast<double>(c.steps - done)));
      std::fflush(stdout);
      row["tokens_per_s"] = tok_s;
      window_start = Clock::now();
      window_steps = 0;
    }
    if (done % c.eval_interval == 0 || done == c.steps) {
      result.validation_loss = evaluator.loss(params);
      fmt::print("eval  {:>5}/{} | validation loss {:.4f} nats/byte\n", done, c.steps, result.validation_loss);
      row["validation_loss"] = result.validation_loss;
      window_start = Clock::now();  // keep evaluation time out of tokens/s
    }
    metrics << row.dump() << "\n";
    metrics.flush();
  }
  fmt::print("done in {}; metrics in {}; measured peak {} device (planned {})\n", duration_str(seconds_since(start)),
             metrics_path, plan::bytes_str(static_cast<double>(step.measured_peak(plan::Space::device))),
             plan::bytes_str(static_cast<double>(step.plan().lower_bound[0])));
  // What the plan does not cover yet shows here: evaluation and sampling run unplanned, kernels keep scratch.
  const int64_t planned = plan::argument_bytes(step.graph()) + step.plan().arena[0] + step.plan().arena[1];
  fmt::print("process: peak RSS {} = baseline {} (before compiling) + {}; the step's plan: {} (arguments and arenas)\n",
             plan::bytes_str(static_cast<double>(resident_bytes("VmHWM"))), plan::bytes_str(static_cast<double>(baseline_rss)),
             plan::bytes_str(static_cast<double>(resident_bytes("VmHWM") - baseline_rss)),
             plan::bytes_str(static_cast<double>(planned)));
  fmt::print("sample ({}, prompt \"{}\"):\n{}\n", c.sample_temperature > 0 ? fmt::format("temperature {}", c.sample_temperature) : "greedy",
             printable(c.sample_prompt), printable(sample(c, params)));
  return result;
}

}  // namespace remat::train
