// `remat plan --search-pipeline`: the pipeline configuration — schedule, stages, microbatches, chunks per rank
// and a remat policy per rank — of least simulated step time per sequence whose every rank fits hbm_limit (a
// replica's batch is per_device_batch_size x stages sequences, MaxText's: more stages, more sequences a step).
//
// Exact over the space it is given, by two facts about the simulator and the planner: (1) the makespan of a
// schedule is monotone in every action's duration (a max-plus system: each action starts at the latest of its
// predecessors' ends), so a configuration whose every stage takes the componentwise cheapest candidate's costs
// bounds all its policy choices from below, and a policy whose costs are no lower in any component than another
// fitting one's can be dropped; (2) a rank's program, and so its plan, depends on its own policy only (each
// rank plans alone), so fitting is decided rank by rank. Configurations whose bound is not below the best of
// their schedule so far are not planned; the rest plan each rank's undominated candidates, cheapest first, and
// simulate every combination of what fits.
#include "cli/commands.h"
#include "cli/config.h"

#include "base/workers.h"
#include "plan/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

namespace remat::cli {

namespace {

struct Where {  // one pipeline configuration
  parallel::ScheduleKind kind;
  int64_t stages, microbatches, chunks;
};

struct Found {
  Where where;
  std::vector<std::string> policies;  // per rank
  double makespan = 0;                // simulated, in FLOPs of the stages' layers
  double per_sequence = 0;            // makespan / the step's sequences: what the search minimizes
  std::vector<int64_t> totals;        // per rank: its plan's total bytes
  std::vector<double> bubbles;
};

// The component costs a split or unsplit schedule charges.
std::array<double, 3> charged(const parallel::Costs& c, bool split) {
  return split ? std::array<double, 3>{c.forward, c.backward - c.weight, c.weight}
               : std::array<double, 3>{c.forward, c.backward, 0};
}
bool no_cheaper(const std::array<double, 3>& a, const std::array<double, 3>& b) {  // a >= b in every component
  return a[0] >= b[0] && a[1] >= b[1] && a[2] >= b[2];
}

std::vector<Where> configurations(const Config& config, const std::vector<int64_t>& stages,
                                  const std::vector<int64_t>& microbatches) {
  const int64_t layers = config.run.model.num_decoder_layers;
  std::vector<Where> out;
  using K = parallel::ScheduleKind;
  for (K kind : {K::gpipe, K::one_f_one_b, K::interleaved_1f1b, K::zb_h1})
    for (int64_t p : stages)
      for (int64_t given : microbatches)
        for (int64_t v = 1, m = given == -1 ? p : given; p * v <= layers; ++v) {  // -1: p, as the key's default
          if ((kind == K::interleaved_1f1b) != (v > 1) || layers % (p * v) != 0) continue;
          try {
            parallel::check_pipeline(kind, {p, m, v}, layers, layers / (p * v));
            out.push_back({kind, p, m, v});
          } catch (const Error&) {  // not a shape this schedule runs
          }
        }
  return out;
}

class PipelineSearch {
 public:
  PipelineSearch(const Config& config, std::vector<std::string> policies) : config_(config), policies_(std::move(policies)) {
    limit_ = config.hbm_limit.empty() ? 0 : plan::parse_bytes(config.hbm_limit, "hbm_limit");
  }

  void consider(const Where& w) {
    ++configurations_;
    Config c = with_overrides(config_, {fmt::format("pipeline_schedule={}", parallel::schedule_name(w.kind)),
                                        fmt::format("ici_pipeline_parallelism={}", w.stages),
                                        fmt::format("num_pipeline_microbatches={}", w.microbatches),
                                        fmt::format("num_pipeline_repeats={}", w.chunks),
                                        "num_layers_per_pipeline_stage=-1", "pipeline_stage_remat_policies="});
    trainer::RunPlan planned;
    try {
      planned = trainer::plan_run(c.run, 0);
    } catch (const Error&) {  // the batch does not cut into these microbatches, the mesh into these stages
      return;
    }
    const parallel::Schedule& s = *planned.pipeline;
    considered_.insert(parallel::schedule_name(s.kind));
    const nn::ModelConfig base = trainer::device_model(c.run, planned);
    const bool split = parallel::splits_backward(s.kind);
    std::vector<nn::ModelConfig> models;
    std::vector<std::array<double, 3>> costs;  // per policy: one chunk's (every chunk's: the layers only)
    for (const std::string& text : policies_) {
      nn::ModelConfig m = base;
      m.remat_policy = nn::parse_remat_policy(text, m);
      m.stage_remat_policies.clear();
      costs.push_back(charged(train::stage_costs(m, s, planned.shape.batch, planned.shape.seq).front(), split));
      models.push_back(std::move(m));
    }
    // The bound: every stage at the cheapest of each component.
    std::array<double, 3> least = costs.front();
    for (const auto& k : costs)
      for (size_t i = 0; i < 3; ++i) least[i] = std::min(least[i], k[i]);
    auto as_costs = [](const std::array<double, 3>& k) { return parallel::Costs{k[0], k[1] + k[2], k[2]}; };
    const std::string schedule = parallel::schedule_name(s.kind);
    auto it = best_.find(schedule);
    const double sequences = static_cast<double>(s.shape.microbatches * planned.shape.batch);
    if (it != best_.end() && parallel::simulate(s, as_costs(least)).makespan / sequences >= it->second.per_sequence)
      return;
    // Each rank's undominated candidates that fit, cheapest first.
    std::vector<size_t> order(policies_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return costs[a] < costs[b]; });
    std::vector<std::vector<std::pair<size_t, int64_t>>> fitting(static_cast<size_t>(s.shape.stages));  // (policy, total)
    std::vector<int> planned_per_rank(fitting.size(), 0);
    for_each_parallel(s.shape.stages, [&](int64_t r) {
      auto& mine = fitting[static_cast<size_t>(r)];
      for (size_t i : order) {
        if (std::any_of(mine.begin(), mine.end(), [&](const auto& f) { return no_cheaper(costs[i], costs[f.first]); }))
          continue;
        const int64_t total = rank_total(c, models[i], planned, r);
        ++planned_per_rank[static_cast<size_t>(r)];
        if (limit_ <= 0 || total <= limit_) mine.emplace_back(i, total);
      }
    });
    for (int n : planned_per_rank) planned_ += n;
    for (const auto& f : fitting)
      if (f.empty()) return;  // a rank fits under no candidate
    // Every combination of the ranks' candidates, simulated.
    std::vector<size_t> pick(fitting.size(), 0);
    for (;;) {
      std::vector<parallel::Costs> stage_costs(static_cast<size_t>(s.shape.virtual_stages()));
      for (size_t k = 0; k < stage_costs.size(); ++k)
        stage_costs[k] = as_costs(costs[fitting[k % fitting.size()][pick[k % fitting.size()]].first]);
      const parallel::Simulation t = parallel::simulate(s, stage_costs);
      it = best_.find(schedule);
      if (it == best_.end() || t.makespan / sequences < it->second.per_sequence) {
        Found f{w, {}, t.makespan, t.makespan / sequences, {}, {}};
        for (size_t r = 0; r < fitting.size(); ++r) {
          f.policies.push_back(policies_[fitting[r][pick[r]].first]);
          f.totals.push_back(fitting[r][pick[r]].second);
          f.bubbles.push_back(t.bubble(r));
        }
        best_[schedule] = std::move(f);
      }
      size_t r = 0;
      while (r < pick.size() && ++pick[r] == fitting[r].size()) pick[r++] = 0;
      if (r == pick.size()) break;
    }
  }

  nlohmann::json json() const;
  std::string text() const;
  const Found* best() const {
    const Found* b = nullptr;
    for (const auto& [name, f] : best_)
      if (!b || f.per_sequence < b->per_sequence) b = &f;
    return b;
  }

 private:
  // Rank r's plan total under `model` (a uniform policy): its program depends on its own policy only.
  int64_t rank_total(const Config& c, const nn::ModelConfig& model, const trainer::RunPlan& planned, int64_t r) const {
    const trainer::RunConfig& run = c.run;
    const compile::Compiled step = compile::compile({.model = model, .shape = planned.shape, .optimizer = run.optimizer,
                                                     .allow_unmatched = run.remat_allow_unmatched,
                                                     .pipeline = &*planned.pipeline, .stage = r, .fuse = run.fusion});
    return plan::report(step.plan, step.program, step.signature, {}).total;
  }

  Config config_;
  std::vector<std::string> policies_;
  int64_t limit_ = 0;
  int configurations_ = 0, planned_ = 0;
  std::map<std::string, Found> best_;  // per schedule
  std::set<std::string> considered_;   // schedules with a configuration of the space
};

std::string config_line(const Found& f) {
  return fmt::format("pipeline_schedule={} ici_pipeline_parallelism={} num_pipeline_microbatches={} "
                     "num_pipeline_repeats={} pipeline_stage_remat_policies={}",
                     parallel::schedule_name(f.where.kind), f.where.stages, f.where.microbatches, f.where.chunks,
                     fmt::join(f.policies, ","));
}

nlohmann::json PipelineSearch::json() const {
  auto of = [](const Found& f) {
    return nlohmann::json{{"schedule", parallel::schedule_name(f.where.kind)}, {"stages", f.where.stages},
                          {"microbatches", f.where.microbatches}, {"chunks", f.where.chunks},
                          {"policies", f.policies}, {"makespan", f.makespan}, {"per_sequence", f.per_sequence},
                          {"totals", f.totals},
                          {"bubbles", f.bubbles}, {"config", config_line(f)}};
  };
  nlohmann::json schedules = nlohmann::json::object();
  for (const auto& [name, f] : best_) schedules[name] = of(f);
  const Found* b = best();
  return {{"search_pipeline",
           {{"best", b ? of(*b) : nlohmann::json()}, {"schedules", schedules}, {"configurations", configurations_},
            {"planned", planned_}}}};
}

std::string PipelineSearch::text() const {
  auto str = [](int64_t b) { return plan::bytes_str(static_cast<double>(b)); };
  auto line = [&](const Found& f) {
    std::vector<std::string> peaks, bubbles;
    for (int64_t t : f.totals) peaks.push_back(str(t));
    for (double x : f.bubbles) bubbles.push_back(fmt::format("{:.1f}%", 100 * x));
    return fmt::format("  {}\n    simulated step {:.4g} GFLOP of layers on the slowest path, {:.4g} per sequence; "
                       "per rank: {}; bubble {}\n", config_line(f), f.makespan / 1e9, f.per_sequence / 1e9,
                       fmt::join(peaks, ", "), fmt::join(bubbles, ", "));
  };
  std::string out = fmt::format("--search-pipeline{}: {} configurations, {} rank plans\n",
                                limit_ > 0 ? " under hbm_limit " + str(limit_) : "", configurations_, planned_);
  const Found* b = best();
  if (!b) return out + "  nothing fits: no configuration fits every rank under any candidate policy\n";
  out += "best:\n" + line(*b) + "best of each other schedule:\n";
  for (const auto& [name, f] : best_)
    if (&f != b) out += line(f);
  for (const std::string& name : considered_)
    if (!best_.count(name)) out += fmt::format("  pipeline_schedule={}: nothing fits\n", name);
  return out;
}

}  // namespace

int run_search_pipeline(const Config& config, const PipelineSearchOptions& o, bool json) {
  CHECK(config.run.model.remat_policy.kind != rematerialize::Policy::Kind::automatic,
        "--search-pipeline takes its candidate policies from --policies; remat_policy=auto is not one: drop it");
  std::vector<int64_t> stages = o.stages, microbatches = o.microbatches;
  if (stages.empty()) stages = {config.run.ici_pipeline_parallelism};
  if (microbatches.empty()) microbatches = {config.run.num_pipeline_microbatches};
  std::vector<std::string> policies = o.policies;
  if (policies.empty())
    for (const std::string& p : {config.run.model.remat_policy.written, std::string("full"), std::string("minimal")})
      if (std::find(policies.begin(), policies.end(), p) == policies.end()) policies.push_back(p);
  PipelineSearch search(config, policies);
  for (const Where& w : configurations(config, stages, microbatches)) search.consider(w);
  fmt::print("{}", json ? search.json().dump(2) + "\n" : search.text());
  return search.best() ? 0 : 3;
}

}  // namespace remat::cli
