#include "cli/commands.h"
#include "cli/config.h"

#include <fmt/format.h>

namespace remat::cli {

std::string explain_report(const Config& config, bool json) {
  const trainer::RunConfig& run = config.run;
  compile::Compiled grads = compile::compile({.model = run.model, .shape = run.shape, .optimizer = run.optimizer,
                                              .kind = compile::Kind::grads,
                                              .allow_unmatched = run.remat_allow_unmatched});
  const std::vector<std::string>& warnings = grads.warnings;
  const rematerialize::Explanation& e = grads.explanation;
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
