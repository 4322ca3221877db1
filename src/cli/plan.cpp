#include "cli/commands.h"
#include "cli/config.h"

#include "plan/report.h"

#include <fmt/format.h>

#include <fstream>

namespace remat::cli {

std::string plan_report(const Config& config, bool json, const std::string& timeline, bool* fits) {
  const trainer::RunConfig& run = config.run;
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
