#include "cli/commands.h"
#include "cli/config.h"

#include "exec/mesh.h"
#include "plan/report.h"
#include "search/search.h"

#include <fmt/format.h>

#include <cstdlib>

namespace remat::cli {

SearchInputs search_inputs(const Config& config) {
  const trainer::RunConfig& run = config.run;
  const trainer::RunPlan run_plan = trainer::plan_run(run, 0);
  const nn::ModelConfig model = trainer::device_model(run, run_plan);  // one device's
  auto rate = [](const std::string& text, const char* key) {
    return text.empty() ? 0.0 : static_cast<double>(plan::parse_bytes(text, key));
  };
  SearchInputs in{.request = {.model = model, .shape = run.shape, .optimizer = run.optimizer, .fuse = run.fusion},
                  .limits = {.device = config.hbm_limit.empty() ? 0 : plan::parse_bytes(config.hbm_limit, "hbm_limit"),
                             .host = config.host_limit.empty() ? 0 : plan::parse_bytes(config.host_limit, "host_limit")},
                  .rates = search::measure(run.model.precision.compute, rate(config.host_bandwidth, "host_bandwidth"),
                                           rate(config.ici_bandwidth, "ici_bandwidth")),
                  .pipeline = nullptr};
  if (run_plan.pipeline) {  // each rank's program, one microbatch's shape
    in.pipeline = std::make_shared<const parallel::Schedule>(*run_plan.pipeline);
    in.request.pipeline = in.pipeline.get();
    in.request.shape = run_plan.shape;
  }
  return in;
}

namespace {

// Every rank of a launch takes the first rank's answer (the measured rates differ a little between processes):
// exec::Mesh::first_rank_text.
using exec::Mesh;

void print_on_first_rank(const std::string& text) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank == nullptr || std::string(rank) == "0") fmt::print("{}", text);
}

// Under a pipeline: each rank's placement, as pipeline_stage_remat_policies (remat_policy: rank 0's).
std::optional<search::Result> resolve_auto_per_rank(Config& config, const SearchInputs& in, bool print) {
  nn::ModelConfig& model = config.run.model;
  CHECK(!config.search_layers_per_group, "--layers-per-group under a pipeline is not supported: give "
        "layers_per_group, and remat_policy=auto places each rank's names");
  const std::vector<search::Result> ranks = search::search_ranks(in.request, in.limits, in.rates);
  std::string text, chosen;
  const search::Result* missing = nullptr;
  for (size_t r = 0; r < ranks.size(); ++r) {
    text += fmt::format("pipeline rank {}: {}", r, ranks[r].text());
    if (!ranks[r].best && !missing) missing = &ranks[r];
    chosen += fmt::format("{}{}", r == 0 ? "" : ", ", ranks[r].best ? ranks[r].best->policy : "");
  }
  if (!missing) text += fmt::format("pipeline_stage_remat_policies: {}\n", chosen);
  if (print) print_on_first_rank(text);
  chosen = Mesh::first_rank_text(missing ? std::string() : chosen);
  if (chosen.empty()) return missing ? *missing : ranks.front();
  config.pipeline_stage_remat_policies = chosen;
  model.stage_remat_policies.clear();
  for (const std::string& policy : split_values(chosen))
    model.stage_remat_policies.push_back(nn::parse_remat_policy(policy, model));
  model.remat_policy = model.stage_remat_policies.front();
  return ranks.front();
}

}  // namespace

std::optional<search::Result> resolve_auto(Config& config, bool print) {
  nn::ModelConfig& model = config.run.model;
  CHECK(!config.search_layers_per_group || model.remat_policy.kind == rematerialize::Policy::Kind::automatic,
        "--layers-per-group searches the group size with remat_policy=auto (remat_policy is '{}'): set "
        "remat_policy=auto, or give layers_per_group=N instead of the flag", model.remat_policy.written);
  if (model.remat_policy.kind != rematerialize::Policy::Kind::automatic) return std::nullopt;
  const SearchInputs in = search_inputs(config);
  if (in.pipeline) return resolve_auto_per_rank(config, in, print);
  const search::Result r = config.search_layers_per_group ? search::search_group_sizes(in.request, in.limits, in.rates)
                                                          : search::search(in.request, in.limits, in.rates);
  const std::string chosen = Mesh::first_rank_text(r.best ? r.best->policy : std::string());
  const std::string group = Mesh::first_rank_text(r.best ? r.best->group_policy : std::string());
  const std::string size = Mesh::first_rank_text(r.best && r.layers_per_group ? std::to_string(*r.layers_per_group) : std::string());
  if (print) print_on_first_rank(r.text());
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
