// The subcommands of the `remat` CLI, one function each.
#pragma once

#include "search/search.h"

#include <cstdint>
#include <optional>
#include <string>

namespace remat::cli {

struct DemoOptions {
  int steps = 1500;             // SGD steps
  uint64_t seed = 0;            // data and init seed
  double learning_rate = 0.05;  // SGD-with-momentum step size
};

struct Config;

// remat_policy=auto: searches the cheapest placement of the checkpoint names whose per-device plan fits
// hbm_limit and host_limit (search::search, at this machine's measured rates), prints its report when `print`,
// and puts the chosen custom(...) into the config (every rank of an mpirun launch takes the first rank's).
// Nothing fits: the result has no `best` (its text names the smallest peak) and the policy stays `auto`.
// Other policies: nothing (nullopt).
std::optional<search::Result> resolve_auto(Config& config, bool print);
// What a policy search over this config's per-device step takes: the step (one device's shards and batch),
// hbm_limit and host_limit, and this machine's rates (host_bandwidth if given). Not under a pipeline (`what`
// names the caller in the error).
struct SearchInputs {
  compile::Request request;
  search::Limits limits;
  search::Rates rates;
};
SearchInputs search_inputs(const Config& config, const char* what);
// The same for commands that need a policy: nothing fitting is an error (a compile-time OOM's message).
void require_auto_fits(Config& config);

// `remat explain`: traces the configured training step, applies the remat policy and prints every
// residual with its decision (a table, or JSON with `json`). Lint errors fail; warnings are printed.
int run_explain(const Config& config, bool json);
std::string explain_report(const Config& config, bool json);

// `remat plan`: plans the configured training step from shapes alone (nothing allocated) and prints the
// memory report; with hbm_limit it fails like a compile-time OOM (exit status 3). `timeline`: an SVG path.
// `frontier`: an SVG path for the Pareto frontier of the placement space (search::frontier) with MaxText's
// presets marked; a table of it is printed too.
int run_plan(const Config& config, bool json, const std::string& timeline, const std::string& frontier = "");
std::string plan_report(const Config& config, bool json, const std::string& timeline, bool* fits);

// Trains an MLP (16 -> 64 -> 64 -> 1, tanh) on y = sin(x . a) + 0.5 cos(x . b), reporting train and
// held-out MSE. The whole step (forward, backward, momentum update) is one graph run by the executor.
int run_demo(const DemoOptions& options);

}  // namespace remat::cli
