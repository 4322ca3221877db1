#include "cli/commands.h"
#include "cli/config.h"

#include <fmt/format.h>

namespace remat::cli {

std::string explain_report(const Config& config, bool json) {
  const train::RunConfig& run = config.run;
  ir::Graph forward = nn::loss_graph(run.model, run.shape.batch, run.shape.seq);
  std::vector<std::string> warnings = rematerialize::lint(forward, {.allow_unmatched = run.remat_allow_unmatched, .names = nn::vocabulary(run.model)});
  rematerialize::Decider decider(nn::vocabulary(run.model));
  ir::Graph step = train::grads_graph(run.model, run.shape, &decider);
  rematerialize::Explanation e = rematerialize::explain(decider.records(), forward, step);
  if (json) {
    nlohmann::json out = e.json();
    out["model"] = config.model;
    out["remat_policy"] = run.model.remat_policy;
    out["warnings"] = warnings;
    return out.dump(2) + "\n";
  }
  std::string text;
  for (const std::string& w : warnings) text += fmt::format("warning: {}\n", w);
  text += fmt::format("model {}: {} layers{}, batch {} x {} tokens, remat_policy {}\n", config.model,
             run.model.num_decoder_layers,
             !run.model.scan_layers           ? " (unrolled)"
             : run.model.layers_per_group > 0 ? fmt::format(" (scan of {} groups of {})",
                                                            run.model.num_decoder_layers / run.model.layers_per_group,
                                                            run.model.layers_per_group)
                                              : " (scanned)",
             run.shape.batch, run.shape.seq, run.model.remat_policy);
  if (e.residuals.empty()) text += "no remat regions (remat_policy none): the backward keeps every residual\n";
  return text + e.text();
}

int run_explain(const Config& config, bool json) {
  fmt::print("{}", explain_report(config, json));
  return 0;
}

}  // namespace remat::cli
