#include "cli/commands.h"
#include "cli/config.h"

#include "exec/mesh.h"
#include "plan/report.h"
#include "search/search.h"

#include <fmt/format.h>

#include <cstdlib>

namespace remat::cli {

SearchInputs search_inputs(const Config& config, const char* what) {
  const trainer::RunConfig& run = config.run;
  const trainer::RunPlan run_plan = trainer::plan_run(run, 0);
  CHECK(!run_plan.pipeline,
        "{} under pipeline parallelism (ici_pipeline_parallelism={}) is not supported: each rank would need its own "
        "placement; search one stage's layers without the pipeline and paste the custom(...) it prints",
        what, run.ici_pipeline_parallelism);
  const nn::ModelConfig model = trainer::device_model(run, run_plan);  // one device's
  auto rate = [](const std::string& text, const char* key) {
    return text.empty() ? 0.0 : static_cast<double>(plan::parse_bytes(text, key));
  };
  return {.request = {.model = model, .shape = run.shape, .optimizer = run.optimizer, .fuse = run.fusion},
          .limits = {.device = config.hbm_limit.empty() ? 0 : plan::parse_bytes(config.hbm_limit, "hbm_limit"),
                     .host = config.host_limit.empty() ? 0 : plan::parse_bytes(config.host_limit, "host_limit")},
          .rates = search::measure(run.model.precision.compute, rate(config.host_bandwidth, "host_bandwidth"),
                                   rate(config.ici_bandwidth, "ici_bandwidth"))};
}

std::optional<search::Result> resolve_auto(Config& config, bool print) {
  nn::ModelConfig& model = config.run.model;
  CHECK(!config.search_layers_per_group || model.remat_policy.kind == rematerialize::Policy::Kind::automatic,
        "--layers-per-group searches the group size with remat_policy=auto (remat_policy is '{}'): set "
        "remat_policy=auto, or give layers_per_group=N instead of the flag", model.remat_policy.written);
  if (model.remat_policy.kind != rematerialize::Policy::Kind::automatic) return std::nullopt;
  const SearchInputs in = search_inputs(config, "remat_policy=auto");
  const search::Result r = config.search_layers_per_group ? search::search_group_sizes(in.request, in.limits, in.rates)
                                                          : search::search(in.request, in.limits, in.rates);
  // Every rank of a launch takes the first rank's answer (the measured rates differ a little between processes).
  const std::string chosen = exec::Mesh::first_rank_text(r.best ? r.best->policy : std::string());
  const std::string group = exec::Mesh::first_rank_text(r.best ? r.best->group_policy : std::string());
  const std::string size = exec::Mesh::first_rank_text(
      r.best && r.layers_per_group ? std::to_string(*r.layers_per_group) : std::string());
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (print && (rank == nullptr || std::string(rank) == "0")) fmt::print("{}", r.text());
  if (!size.empty()) model.layers_per_group = std::stoll(size);  // the printed group size (first: the policies'
                                                                 // spelling does not depend on it)
  if (!chosen.empty()) model.remat_policy = nn::parse_remat_policy(chosen, model);  // the printed placement
  if (!group.empty()) model.group_remat_policy = nn::parse_remat_policy(group, model);  // and group policy
  return r;
}

void require_auto_fits(Config& config) {
  const std::optional<search::Result> r = resolve_auto(config, true);
  // The first rank's answer decides (a rank whose own search differs follows it).
  CHECK(!r || config.run.model.remat_policy.kind != rematerialize::Policy::Kind::automatic, "{}set a larger hbm_limit, shard more (ici_fsdp_parallelism), or lower per_device_batch_size or "
        "max_target_length", r ? r->text() : "");
}

}  // namespace remat::cli
