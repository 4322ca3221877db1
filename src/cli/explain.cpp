#include "cli/commands.h"
#include "cli/config.h"

#include "plan/report.h"

#include <fmt/format.h>

#include <optional>

namespace remat::cli {

std::string explain_report(const Config& config, bool json) {
  const trainer::RunConfig& run = config.run;
  // Under a pipeline: stage 0's program (its first microbatch of each chunk); the layers of every stage decide
  // alike, per layer as without a pipeline.
  const trainer::RunPlan run_plan = trainer::plan_run(run, 0);
  const std::optional<parallel::Schedule>& pipeline = run_plan.pipeline;
  // One device's model (its tensor shards, its collectives), as `remat plan` compiles it.
  const nn::ModelConfig model = trainer::device_model(run, run_plan);
  compile::Compiled grads = compile::compile(
      {.model = model, .shape = run_plan.shape,
       .optimizer = run.optimizer, .kind = pipeline ? compile::Kind::train_step : compile::Kind::grads,
       .allow_unmatched = run.remat_allow_unmatched, .pipeline = pipeline ? &*pipeline : nullptr,
       .fuse = run.fusion, .dump_ir_after = run.dump_ir_after});
  const std::vector<std::string>& warnings = grads.warnings;
  // The policy of the program explained: under pipeline_stage_remat_policies, rank 0's chunks'.
  const std::string policy = pipeline ? train::rank_remat_policy(model, pipeline->shape, 0) : run.model.remat_policy.written;
  const rematerialize::Explanation& e = grads.explanation;
  const ir::CommunicationTable communication = ir::communication(grads.program);
  if (json) {
    nlohmann::json out = e.json();
    out["communication"] = plan::communication_json(communication);
    out["model"] = config.model;
    out["remat_policy"] = policy;
    out["warnings"] = warnings;
    return out.dump(2) + "\n";
  }
  std::string text;
  for (const std::string& w : warnings) text += fmt::format("warning: {}\n", w);
  if (pipeline)
    text += fmt::format("pipeline stage 0 of {} ({} schedule): its layers' regions for the first microbatch of each "
                        "chunk (runs/step: per microbatch)\n",
                        pipeline->shape.stages, parallel::schedule_name(pipeline->kind));
  if (pipeline && !run.model.stage_remat_policies.empty())
    text += fmt::format("pipeline_stage_remat_policies {}: rank 0's layers shown; `remat plan` plans every rank\n",
                        config.pipeline_stage_remat_policies);
  text += fmt::format("model {}: {} layers{}, batch {} x {} tokens, remat_policy {}\n", config.model,
             run.model.num_decoder_layers,
             !run.model.scan_layers           ? " (unrolled)"
             : run.model.layers_per_group > 0 ? fmt::format(" (scan of {} groups of {})",
                                                            run.model.num_decoder_layers / run.model.layers_per_group,
                                                            run.model.layers_per_group)
                                              : " (scanned)",
             pipeline ? trainer::pipeline_step_shape(run, *pipeline).batch : run.shape.batch, run.shape.seq, policy);
  if (e.residuals.empty()) text += "no remat regions (remat_policy none): the backward keeps every residual\n";
  text += e.text();
  if (!communication.empty())
    text += "communication of this program per step (one device: count, operand bytes, bytes it sends; what "
            "recomputation runs again):\n" +
            plan::communication_text(communication, "  ");
  return text;
}

int run_explain(const Config& given, bool json) {
  Config config = given;
  if (json) {
    const std::optional<search::Result> r = resolve_auto(config, false);
    CHECK(!r || config.run.model.remat_policy.kind != rematerialize::Policy::Kind::automatic, "{}", r ? r->text() : "");
  } else {
    require_auto_fits(config);
  }
  fmt::print("{}", explain_report(config, json));
  return 0;
}

}  // namespace remat::cli
