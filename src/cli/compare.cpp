// `remat plan --compare` and the warnings of remat settings that do nothing or raise the plan total. Both plan
// variants of the user's config (the same command line with more overrides: cli::with_overrides) as `remat plan`
// plans it, and put them side by side.
#include "cli/commands.h"
#include "cli/config.h"

#include "base/check.h"
#include "ir/text.h"
#include "plan/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

namespace remat::cli {

namespace {

// A config's per-device step, compiled and planned as `remat plan` plans it.
struct Planned {
  compile::Compiled step;
  plan::Report report;
};

// `ranks`: launched processes (0 for `remat plan`). Not under a pipeline (`what` names the caller in the error).
Planned plan_config(const Config& config, int64_t ranks, const char* what) {
  const trainer::RunPlan run_plan = trainer::plan_run(config.run, ranks);
  CHECK(!run_plan.pipeline,
        "{} under pipeline parallelism (ici_pipeline_parallelism={}) is not supported: each rank plans its own "
        "program; compare one stage's layers without the pipeline (num_layers_per_pipeline_stage layers)",
        what, config.run.ici_pipeline_parallelism);
  compile::Compiled step = compile_step(config, run_plan);
  plan::Report report = plan::report(step.plan, step.program, step.signature, {});
  return {std::move(step), std::move(report)};
}

std::string str(double bytes) { return plan::bytes_str(bytes); }

// ---- --compare ----

// "KEY=V1,V2,..." -> KEY and its values. A comma inside (), [] or quotes separates nothing: policy texts have them.
std::pair<std::string, std::vector<std::string>> parse_compare(const std::string& arg) {
  const size_t eq = arg.find('=');
  CHECK(eq != std::string::npos && eq > 0, "--compare '{}' is not KEY=V1,V2,... (e.g. --compare remat_policy=full,minimal)",
        arg);
  const std::vector<std::string> values = split_values(arg.substr(eq + 1));
  for (const std::string& v : values)
    CHECK(!v.empty(), "--compare '{}' has an empty value: write KEY=V1,V2,... with a value between every two commas", arg);
  return {arg.substr(0, eq), values};
}

// Every combination of one value per key, the first key varying slowest: each one "key=value" per key.
std::vector<std::vector<std::string>> variants(const std::vector<std::string>& args) {
  std::vector<std::vector<std::string>> out(1);
  std::set<std::string> keys;
  for (const std::string& arg : args) {
    const auto [key, values] = parse_compare(arg);
    CHECK(keys.insert(key).second, "--compare names '{}' twice: give all its values in one --compare {}=V1,V2,...", key, key);
    std::vector<std::vector<std::string>> longer;
    for (const std::vector<std::string>& v : out)
      for (const std::string& value : values) {
        longer.push_back(v);
        longer.back().push_back(key + "=" + value);
      }
    out = longer;
  }
  return out;
}

// How a row's step time is estimated, from this machine's rates (as remat_policy=auto measures them).
double step_seconds(const rematerialize::Explanation& e, const search::Rates& r) {
  return e.step_gemm_flops / r.gemm_flops + (e.step_flops - e.step_gemm_flops) / r.other_flops +
         2 * e.offloaded_bytes() / r.host_bandwidth;
}

// Each combination of the --compare arguments' values and its config, every one loaded (and so checked) before
// any is planned.
std::vector<std::pair<std::vector<std::string>, Config>> load_variants(const Config& config,
                                                                      const std::vector<std::string>& compare) {
  std::vector<std::pair<std::vector<std::string>, Config>> rows;
  for (const std::vector<std::string>& v : variants(compare)) {
    try {
      rows.emplace_back(v, with_overrides(config, v));
    } catch (const Error& e) {
      CHECK(false, "--compare variant {}: {}", fmt::join(v, " "), e.what());
    }
    CHECK(rows.back().second.run.model.remat_policy.kind != rematerialize::Policy::Kind::automatic,
          "--compare variant {}: remat_policy=auto is not compared (it is a search, not one plan); run `remat plan "
          "remat_policy=auto` and compare the custom(...) it prints",
          fmt::join(v, " "));
  }
  return rows;
}

// ---- warnings ----

// A remat setting of a config and the same config without it.
struct Setting {
  std::string name, without;  // "layers_per_group=4", "layers_per_group=0"
  bool saves_memory;          // what it is for: a higher total than without it is worth a warning
  Config config;              // without it
};

// The policy with every offloaded name saved on device instead, where the policy is a name list (or
// offload_dot_with_no_batch_dims); other offloading policies (regex, combinators) are not checked.
std::optional<rematerialize::Policy> on_device(const rematerialize::Policy& p) {
  using Kind = rematerialize::Policy::Kind;
  if (p.kind == Kind::offload_dot_with_no_batch_dims) return rematerialize::policy_of(Kind::dots_with_no_batch_dims_saveable);
  if ((p.kind != Kind::custom && p.kind != Kind::save_and_offload_only_these_names) || p.offload_names.empty())
    return std::nullopt;
  std::vector<std::string> saved = p.save_names;  // spelled as the layer spells them: parsed as written
  saved.insert(saved.end(), p.offload_names.begin(), p.offload_names.end());
  return rematerialize::policy_of(Kind::save_and_offload_only_these_names, std::move(saved));
}

std::vector<Setting> remat_settings(const Config& c) {
  const nn::ModelConfig& m = c.run.model;
  std::vector<Setting> out;
  auto without = [&](const std::string& name, const std::string& override, bool saves_memory) {
    out.push_back({name, override, saves_memory, with_overrides(c, {override})});
  };
  if (m.layers_per_group > 0) without(fmt::format("layers_per_group={}", m.layers_per_group), "layers_per_group=0", true);
  if (m.layers_per_group > 0 && m.group_remat_policy.kind != rematerialize::Policy::Kind::nothing_saveable)
    without(fmt::format("group_remat_policy={}", m.group_remat_policy.written), "group_remat_policy=nothing_saveable",
            false);  // keeping more across groups costs memory by design: only "does nothing" is news
  if (m.num_vocab_tiling > 1) without(fmt::format("num_vocab_tiling={}", m.num_vocab_tiling), "num_vocab_tiling=1", true);
  using Kind = rematerialize::Policy::Kind;
  const std::string policy = fmt::format("remat_policy={}", m.remat_policy.written);
  if (m.remat_policy.kind != Kind::none && m.remat_policy.kind != Kind::nothing_saveable)
    without(policy, "remat_policy=full", false);  // saving more costs memory by design: only "does nothing" is news
  if (const std::optional<rematerialize::Policy> device = on_device(m.remat_policy)) {
    out.push_back({"offloading in " + policy, "the same names saved on device", true, c});
    out.back().config.run.model.remat_policy = *device;
  }
  return out;
}

// The same program op for op and the same plan: every buffer's size, offset and live range.
bool identical(const Planned& a, const Planned& b) {
  return plan::trace(a.step.plan, a.step.program) == plan::trace(b.step.plan, b.step.program) &&
         ir::print(a.step.program) == ir::print(b.step.program);
}

}  // namespace

std::vector<std::string> setting_warnings(const Config& config, int64_t ranks) {
  if (config.run.ici_pipeline_parallelism > 1 || config.run.model.remat_policy.kind == rematerialize::Policy::Kind::automatic)
    return {};
  const std::vector<Setting> settings = remat_settings(config);
  if (settings.empty()) return {};
  const char* what = "remat's setting check";
  const Planned with = plan_config(config, ranks, what);
  const double total = static_cast<double>(with.report.total);
  std::vector<std::string> out;
  for (const Setting& s : settings) {
    const Planned without = plan_config(s.config, ranks, what);
    const double other = static_cast<double>(without.report.total);
    if (identical(with, without))
      out.push_back(fmt::format("{} does nothing: the plan is identical to {} (total {})", s.name, s.without, str(total)));
    else if (s.saves_memory && total > other)
      out.push_back(fmt::format("{} raises the plan total: {} vs {} without it ({})", s.name, str(total), str(other), s.without));
  }
  return out;
}

void print_setting_warnings(const Config& config, int64_t ranks) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");  // under mpirun: the first rank speaks for all
  if (rank != nullptr && std::string(rank) != "0") return;
  for (const std::string& w : setting_warnings(config, ranks)) fmt::print(stderr, "warning: {}\n", w);
}

int run_compare(const Config& config, const std::vector<std::string>& compare, bool json) {
  const std::vector<std::pair<std::vector<std::string>, Config>> rows = load_variants(config, compare);
  // Measured once per compute dtype, so that rows differ by what they plan rather than by timing noise.
  std::map<DType, search::Rates> measured;
  nlohmann::json json_rows = nlohmann::json::array();
  size_t width = std::string("variant").size();
  for (const auto& [values, variant] : rows) width = std::max(width, fmt::format("{}", fmt::join(values, " ")).size());
  std::string table = fmt::format("{:<{}}  {:>11} {:>11} {:>9} {:>11} {:>11} {:>12} {:>11}\n", "variant", width, "total",
                                  "live peak", "peak step", "saved", "offloaded", "recompute GF", "est. step s");
  for (const auto& [values, variant] : rows) {
    const Planned p = plan_config(variant, 0, "remat plan --compare");
    const rematerialize::Explanation& e = p.step.explanation;
    const DType compute = variant.run.model.precision.compute;
    if (!measured.count(compute)) measured[compute] = search::measure(compute);
    search::Rates r = measured[compute];
    if (!variant.host_bandwidth.empty())
      r.host_bandwidth = static_cast<double>(plan::parse_bytes(variant.host_bandwidth, "host_bandwidth"));
    const double seconds = step_seconds(e, r);
    const std::string name = fmt::format("{}", fmt::join(values, " "));
    table += fmt::format("{:<{}}  {:>11} {:>11} {:>9} {:>11} {:>11} {:>12.5g} {:>11.4g}\n", name, width,
                         str(static_cast<double>(p.report.total)), str(static_cast<double>(p.report.lower_bound)),
                         p.report.peak_step, str(e.saved_bytes()), str(e.offloaded_bytes()), e.recompute_flops / 1e9, seconds);
    json_rows.push_back({{"variant", values},
                         {"total", p.report.total},
                         {"lower_bound", p.report.lower_bound},
                         {"peak_step", p.report.peak_step},
                         {"saved_bytes", e.saved_bytes()},
                         {"offloaded_bytes", e.offloaded_bytes()},
                         {"recompute_flops", e.recompute_flops},
                         {"step_flops", e.step_flops},
                         {"step_gemm_flops", e.step_gemm_flops},
                         {"estimated_step_seconds", seconds},
                         {"rates", {{"gemm_flops", r.gemm_flops}, {"other_flops", r.other_flops}, {"host_bandwidth", r.host_bandwidth}}}});
  }
  const std::string how =
      "est. step s = contraction FLOPs of the step / the GEMM rate + its other FLOPs / the elementwise rate + 2 x offloaded "
      "bytes / host_bandwidth, at this machine's CPU rates as remat_policy=auto measures them";
  if (json) {
    fmt::print("{}\n", nlohmann::json{{"compare", {{"rows", json_rows}, {"estimate", how}}}}.dump(2));
    return 0;
  }
  fmt::print("{}", table);
  for (const auto& [compute, r] : measured)
    fmt::print("{} rates: GEMM {:.3g} GFLOP/s, elementwise {:.3g} GFLOP/s, host copies {}/s (host_bandwidth, where set, "
               "replaces it)\n", dtype_name(compute), r.gemm_flops / 1e9, r.other_flops / 1e9, str(r.host_bandwidth));
  fmt::print("{}\n", how);
  return 0;
}

}  // namespace remat::cli
