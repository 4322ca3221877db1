#include "cli/commands.h"
#include "cli/config.h"

#include "base/workers.h"
#include "plan/report.h"
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace remat::cli {

namespace {

// The most microbatch-chunks whose stashed activations the plan holds at once: a microbatch holds from the
// first buffer its forward computes to the last its backward frees (the scopes the pipeline step gives each
// action, "pipeline/chunk1/microbatch3/..."). Messages — received and not yet computed on, or sent and not yet
// known received — are buffers in flight, not stashed activations: they do not count.
int64_t most_stashed(const plan::Plan& p, const ir::Graph& g) {
  std::set<ir::ValueId> sent;
  for (const ir::Node& n : g.nodes)
    if (n.op == ir::Op::send) sent.insert(p.root[static_cast<size_t>(n.inputs[0])]);
  std::map<std::pair<int, int>, std::pair<int, int>> held;  // (chunk, microbatch) -> first and last position
  for (const plan::Buffer& b : p.buffers) {
    if (b.space != plan::Space::device || b.node < 0 || sent.count(b.value)) continue;
    const ir::Node& n = g.nodes[static_cast<size_t>(b.node)];
    int chunk = 0, microbatch = 0;
    if (n.op == ir::Op::recv ||
        std::sscanf(n.scope.c_str(), "pipeline/chunk%d/microbatch%d", &chunk, &microbatch) != 2)
      continue;
    auto [it, fresh] = held.try_emplace({chunk, microbatch}, b.start, b.end);
    it->second = {std::min(it->second.first, b.start), std::max(it->second.second, b.end)};
  }
  std::map<int, int> change;  // position -> microbatches starting minus ending there
  for (const auto& [mb, span] : held) ++change[span.first], --change[span.second + 1];
  int64_t now = 0, most = 0;
  for (const auto& [position, d] : change) most = std::max(most, now += d);
  return most;
}

// `remat plan` under a pipeline: the schedule of every rank (chunk costs from the programs' FLOPs: a chunk's
// forward and backward, recomputes included), its bubble; then each rank's own program planned, from shapes
// alone: total, arguments, arena, and the most microbatches whose activations it stashes at once. `timeline` gets the schedule's
// SVG. Every rank must fit hbm_limit.
std::string pipeline_report(const Config& config, const trainer::RunPlan& planned, bool json,
                            const std::string& timeline, bool* fits) {
  const trainer::RunConfig& run = config.run;
  const parallel::Schedule& s = *planned.pipeline;
  const nn::ModelConfig model = trainer::device_model(run, planned);  // its shards, its part of the batch, its collectives
  const train::StepShape& shape = planned.shape;
  const std::vector<parallel::Costs> costs = train::stage_costs(model, s, shape.batch, shape.seq);
  const parallel::Simulation t = parallel::simulate(s, costs);
  if (!timeline.empty()) {
    train::write_text(timeline, parallel::svg(s, t));
  }
  const int64_t limit = config.hbm_limit.empty() ? 0 : plan::parse_bytes(config.hbm_limit, "hbm_limit");
  nlohmann::json ranks = nlohmann::json::array();
  std::string table = fmt::format("{:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  {:>9}  {:>8}  {}\n", "rank",
                                  "total", "parameters", "optimizer", "arena", "live peak", "sent", "recompute",
                                  "bubble", "stashed", "remat policy");
  std::string communication;
  bool every_rank_fits = true;
  // Each rank's program is compiled and planned on its own: all at once (in order when its IR is dumped), then
  // reported in rank order.
  struct Row {
    std::string table, communication;
    nlohmann::json json;
    bool fits = true;
  };
  std::vector<Row> rows(static_cast<size_t>(s.shape.stages));
  for_each_parallel(s.shape.stages, [&](int64_t r) {
    const compile::Compiled step = compile::compile({.model = model, .shape = shape, .optimizer = run.optimizer,
                                                     .allow_unmatched = run.remat_allow_unmatched, .pipeline = &s,
                                                     .stage = r, .fuse = run.fusion, .dump_ir_after = run.dump_ir_after});
    plan::ReportOptions o;
    o.title = fmt::format("pipeline rank {}", r);
    o.limit = limit;
    const plan::Report rep = plan::report(step.plan, step.program, step.signature, o);
    const int64_t stashed = most_stashed(step.plan, step.program);
    const size_t rank = static_cast<size_t>(r);
    auto str = [](int64_t b) { return plan::bytes_str(static_cast<double>(b)); };
    const double sent = ir::communication_of(rep.communication, ir::Op::send).all.sent;  // to the neighbouring stages
    const std::string policy = train::rank_remat_policy(model, s.shape, r);
    const double recompute = step.explanation.recompute_flops;
    Row& row = rows[rank];
    row.fits = rep.fits();
    row.table = fmt::format("{:>4} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  {:>8.1f}%  {:>8}  {}\n", r,
                            str(rep.total), str(rep.parameters), str(rep.optimizer_state), str(rep.temporaries),
                            str(rep.lower_bound), str(static_cast<int64_t>(sent)),
                            fmt::format("{:.1f} GF", recompute / 1e9), 100 * t.bubble(rank), stashed, policy);
    row.communication = fmt::format("rank {}:\n{}", r, plan::communication_text(rep.communication, "  "));
    row.json = rep.json();
    row.json["rank"] = r;
    row.json["bubble"] = t.bubble(rank);
    row.json["peak_in_flight"] = t.ranks[rank].peak_in_flight;
    row.json["most_stashed"] = stashed;
    row.json["remat_policy"] = policy;
    row.json["recompute_flops"] = recompute;
  }, run.dump_ir_after.empty() ? 0 : 1);
  for (const Row& row : rows) {
    every_rank_fits = every_rank_fits && row.fits;
    table += row.table;
    communication += row.communication;
    ranks.push_back(row.json);
  }
  if (fits) *fits = every_rank_fits;
  nlohmann::json stage_costs_json = nlohmann::json::array();  // each virtual stage's
  for (const parallel::Costs& c : costs) stage_costs_json.push_back({{"forward", c.forward}, {"backward", c.backward}, {"weight", c.weight}});
  if (json) {
    nlohmann::json out = {{"pipeline",
                           {{"schedule", parallel::schedule_name(s.kind)},
                            {"stages", s.shape.stages},
                            {"microbatches", s.shape.microbatches},
                            {"chunks", s.shape.chunks},
                            {"costs", stage_costs_json},
                            {"makespan", t.makespan},
                            {"ranks", ranks}}}};
    return out.dump(2) + "\n";
  }
  const double params = static_cast<double>(nn::param_count(run.model));
  return fmt::format("model {} ({:.2f}B parameters), {} stages x {} microbatches of {} x {} tokens{}, {}\n",
                     config.model, params / 1e9, s.shape.stages, s.shape.microbatches, shape.batch, shape.seq,
                     model.mesh.ranks() > 1 ? fmt::format(" per replica; {} ranks ({}) of each stage", model.mesh.ranks(), trainer::mesh_text(planned)) : "",
                     run.model.stage_remat_policies.empty()
                         ? "remat_policy " + run.model.remat_policy.written
                         : "pipeline_stage_remat_policies " + config.pipeline_stage_remat_policies) +
         parallel::grid(s, t) +
         "\nEach rank's plan (its own program: the stage's parameters and moments, the arena of its actions in order; "
         "recompute: FLOPs its backwards run again; stashed: the most microbatches whose activations it holds at once):\n" +
         table +
         "\nEach rank's communication per step (count, operand bytes, bytes it sends; what recomputation runs again):\n" +
         communication + (limit > 0 ? fmt::format("hbm_limit {} per device: {}\n", plan::bytes_str(static_cast<double>(limit)),
                                         every_rank_fits ? "every rank fits" : "some rank does not fit")
                            : "");
}
// The frontier of the placement space for this config's per-device step (hbm_limit does not bound it), its SVG to
// `path` and, with `table`, a table: every point's policy, peak and recompute; every preset, on the frontier or
// dominated.
void write_frontier(const Config& config, const std::string& path, bool table) {
  const trainer::RunConfig& run = config.run;
  const SearchInputs in = search_inputs(config);
  CHECK(!in.pipeline, "--frontier under pipeline parallelism (ici_pipeline_parallelism={}) is not supported: each "
        "rank has its own frontier; remat_policy=auto places each rank's names", run.ici_pipeline_parallelism);
  train::write_text(path, "");  // a path that cannot be written fails now, not after the search
  const search::Frontier f = search::frontier(in.request, in.limits, in.rates);  // limits.device is ignored
  train::write_text(path, f.svg(fmt::format("model {}, batch {} x {}: least recompute + transfer time per device peak",
                                            config.model, run.shape.batch, run.shape.seq)));
  if (!table) return;
  fmt::print("Pareto frontier of the placements ({} points, written to {}):\n  {:>11} {:>14} {:>11}  {}\n", f.points.size(), path,
             "peak", "recompute", "offloaded", "policy");
  for (const search::Candidate& c : f.points)
    fmt::print("  {:>11} {:>10.4g} GF {:>11}  {}\n", plan::bytes_str(static_cast<double>(c.peak)), c.recompute_flops / 1e9,
               plan::bytes_str(c.offloaded_bytes), c.policy);
  fmt::print("MaxText presets:\n");
  for (const search::Candidate& c : f.presets)
    fmt::print("  {:>11} {:>10.4g} GF {:>11}  {} ({})\n", plan::bytes_str(static_cast<double>(c.peak)), c.recompute_flops / 1e9,
               plan::bytes_str(c.offloaded_bytes), c.policy,
               !c.fits ? "over host_limit" : f.dominated(c) ? "dominated" : "on the frontier");
}

}  // namespace

compile::Compiled compile_step(const Config& config, const trainer::RunPlan& planned) {
  const trainer::RunConfig& run = config.run;
  const nn::ModelConfig model = trainer::device_model(run, planned);  // its shards, its part of the batch, its collectives
  return compile::compile({.model = model, .shape = run.shape, .optimizer = run.optimizer,
                           .allow_unmatched = run.remat_allow_unmatched, .fuse = run.fusion,
                           .dump_ir_after = run.dump_ir_after});
}

std::string plan_report(const Config& config, bool json, const std::string& timeline, bool* fits) {
  const trainer::RunConfig& run = config.run;
  const trainer::RunPlan planned = trainer::plan_run(run, 0);
  if (planned.pipeline) return pipeline_report(config, planned, json, timeline, fits);
  const int64_t devices = planned.replicas.batch_ranks(), fsdp = planned.replicas.size("fsdp"),
                tensor = planned.replicas.size("tensor");
  compile::Compiled step = compile_step(config, planned);
  const rematerialize::Explanation& e = step.explanation;
  plan::ReportOptions o;
  const double params = static_cast<double>(nn::param_count(run.model));
  const nn::PrecisionPolicy& mp = run.model.precision;
  o.title = fmt::format("model {} ({} parameters), batch {} x {} tokens{}{}{}, remat_policy {}{}", config.model,
                        params >= 1e9 ? fmt::format("{:.2f}B", params / 1e9) : fmt::format("{:.2f}M", params / 1e6), run.shape.batch, run.shape.seq,
                        run.shape.accumulation > 1 ? fmt::format(" x {} microbatches", run.shape.accumulation) : "",
                        devices == 1  ? ""
                        : fsdp == 1   ? fmt::format(" per device, {} data-parallel ranks", devices)
                        : fsdp == devices ? fmt::format(" per device, {} FSDP ranks", devices)
                                          : fmt::format(" per device, {} ranks ({} data-parallel x {} FSDP)", devices, devices / fsdp, fsdp),
                        tensor == 1 ? std::string()
                                    : fmt::format(", {} tensor-parallel ranks{}", tensor,
                                                  planned.sequence_parallel ? " (sequence-parallel)" : ""),
                        run.model.remat_policy.written,
                        mp.compute == mp.param ? std::string()
                                               : fmt::format(", {} weights, {} compute, mp_cast {}", dtype_name(mp.param),
                                                             dtype_name(mp.compute), config.mp_cast));
  o.limit = config.hbm_limit.empty() ? 0 : plan::parse_bytes(config.hbm_limit, "hbm_limit");
  o.forward_flops = e.forward_flops;
  o.recompute_flops = e.recompute_flops;
  o.backward_flops = e.step_flops - e.forward_flops - e.recompute_flops;
  plan::Report r = plan::report(step.plan, step.program, step.signature, o);
  if (fits) *fits = r.fits();
  if (!timeline.empty()) {
    train::write_text(timeline, r.svg());
  }
  return json ? r.json().dump(2) + "\n" : r.text();
}

int run_plan(const Config& given, bool json, const std::string& timeline, const std::string& frontier) {
  Config config = given;
  if (!frontier.empty()) write_frontier(config, frontier, !json);
  const std::optional<search::Result> chosen = resolve_auto(config, !json);
  if (chosen && config.run.model.remat_policy.kind == rematerialize::Policy::Kind::automatic) {  // nothing fits (on the first rank, which decides)
    fmt::print("{}", json ? nlohmann::json{{"auto", {{"fits", false}, {"smallest_peak", chosen->smallest.peak},
                                                     {"smallest_policy", chosen->smallest.policy}}}}.dump(2) + "\n"
                          : std::string());
    return 3;
  }
  bool fits = true;
  std::string text = plan_report(config, json, timeline, &fits);
  fmt::print("{}", text);
  std::fflush(stdout);  // the warnings (stderr) after the report
  print_setting_warnings(given, 0);
  return fits ? 0 : 3;
}

}  // namespace remat::cli
