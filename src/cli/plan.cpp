#include "cli/commands.h"
#include "cli/config.h"

#include "plan/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace remat::cli {

namespace {
// `remat plan` under a pipeline: the schedule of every rank from shapes alone (equal-cost layers: a chunk's
// forward takes 1/v, its backward 2/v), its microbatches in flight and bubble; `timeline` gets the schedule's
// SVG. Per-rank memory plans of the stage programs are not built yet (nor checked against hbm_limit).
std::string pipeline_report(const Config& config, bool json, const std::string& timeline) {
  const parallel::Schedule s = trainer::pipeline_schedule(config.run);
  const double v = static_cast<double>(s.shape.chunks);
  const parallel::Simulation t = parallel::simulate(s, {1 / v, 2 / v});
  if (!timeline.empty()) {
    std::ofstream out(timeline);
    CHECK(out.good(), "cannot write the schedule's timeline to '{}'", timeline);
    out << parallel::svg(s, t);
  }
  if (!json)
    return parallel::grid(s, t) + "per-rank memory plans of the pipeline stages are not built yet (the schedule is)\n";
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < t.ranks.size(); ++r)
    ranks.push_back({{"rank", r}, {"peak_in_flight", t.ranks[r].peak_in_flight}, {"bubble", t.bubble(r)}});
  nlohmann::json out = {{"pipeline",
                         {{"schedule", parallel::schedule_name(s.kind)},
                          {"stages", s.shape.stages},
                          {"microbatches", s.shape.microbatches},
                          {"chunks", s.shape.chunks},
                          {"ranks", ranks}}}};
  return out.dump(2) + "\n";
}
}  // namespace

std::string plan_report(const Config& config, bool json, const std::string& timeline, bool* fits) {
  const trainer::RunConfig& run = config.run;
  if (run.ici_pipeline_parallelism > 1) return pipeline_report(config, json, timeline);
  nn::ModelConfig model = run.model;  // one device's: its shards, its part of the batch, its collectives
  model.mesh = trainer::mesh_of(run, 0);
  const int64_t devices = model.mesh.ranks(), fsdp = model.mesh.size("fsdp");
  compile::Compiled step = compile::compile({.model = model, .shape = run.shape, .optimizer = run.optimizer,
                                             .allow_unmatched = run.remat_allow_unmatched});
  const rematerialize::Explanation& e = step.explanation;
  plan::ReportOptions o;
  const double params = static_cast<double>(nn::param_count(run.model));
  const nn::PrecisionPolicy& mp = run.model.precision;
  o.title = fmt::format("model {} ({} parameters), batch {} x {} tokens{}{}, remat_policy {}{}", config.model,
                        params >= 1e9 ? fmt::format("{:.2f}B", params / 1e9) : fmt::format("{:.2f}M", params / 1e6), run.shape.batch, run.shape.seq,
                        run.shape.accumulation > 1 ? fmt::format(" x {} microbatches", run.shape.accumulation) : "",
                        devices == 1  ? ""
                        : fsdp == 1   ? fmt::format(" per device, {} data-parallel ranks", devices)
                        : fsdp == devices ? fmt::format(" per device, {} FSDP ranks", devices)
                                          : fmt::format(" per device, {} ranks ({} data-parallel x {} FSDP)", devices, devices / fsdp, fsdp),
                        run.model.remat_policy,
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
    std::ofstream out(timeline);
    CHECK(out.good(), "cannot write the timeline to '{}'", timeline);
    out << r.svg();
  }
  return json ? r.json().dump(2) + "\n" : r.text();
}

int run_plan(const Config& config, bool json, const std::string& timeline) {
  bool fits = true;
  std::string text = plan_report(config, json, timeline, &fits);
  fmt::print("{}", text);
  return fits ? 0 : 3;
}

}  // namespace remat::cli
