// The subcommands of the `remat` CLI, one function each.
#pragma once

#include "search/search.h"
#include "train/checkpoint.h"
#include "trainer/trainer.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

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
// Under a pipeline each rank's placement is searched (search::search_ranks) and the config gets them as
// pipeline_stage_remat_policies, one per rank. Nothing fits: the result (under a pipeline, the first rank's that
// does not fit) has no `best` (its text names the smallest peak) and the policy stays `auto`.
// Other policies: nothing (nullopt).
std::optional<search::Result> resolve_auto(Config& config, bool print);
// What a policy search over this config's per-device step takes: the step (one device's shards and batch; under
// a pipeline, one microbatch's, with the schedule), hbm_limit and host_limit, and this machine's rates
// (host_bandwidth if given).
struct SearchInputs {
  compile::Request request;  // request.pipeline points into `pipeline`
  search::Limits limits;
  search::Rates rates;
  std::shared_ptr<const parallel::Schedule> pipeline;
};
SearchInputs search_inputs(const Config& config);
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
// One device's training step as `remat plan` compiles and plans it (its shards, its part of the batch, its
// collectives); `planned`: trainer::plan_run's for the config, not under a pipeline.
compile::Compiled compile_step(const Config& config, const trainer::RunPlan& planned);

// `remat plan --search-pipeline`: over every schedule (gpipe, 1f1b, interleaved_1f1b with every chunk count
// that divides the layers, zb_h1), the stage counts and microbatch counts given (default: the config's) and a
// policy per rank from `policies` (default: the config's remat_policy, full, minimal), the configuration of
// least simulated step time (the layers' FLOPs, recompute included, through the schedule) whose every rank's
// plan fits hbm_limit; printed as a config line with each rank's total and bubble, and the best of each other
// schedule (JSON with `json`). Exact over that space (src/cli/search_pipeline.cpp says why); exit 3 when
// nothing fits.
struct PipelineSearchOptions {
  std::vector<int64_t> stages, microbatches;
  std::vector<std::string> policies;
};
int run_search_pipeline(const Config& config, const PipelineSearchOptions& options, bool json);

// `remat plan --compare KEY=V1,V2,...` (one argument per key): plans every combination of the values, each the
// config loaded again with its KEY=V overrides after the command line's (every key's checks apply), and prints one
// row per combination: plan total, live peak and its schedule step, saved and offloaded bytes, recompute FLOPs and
// an estimated step time (at this machine's rates, as remat_policy=auto measures them); or JSON with `json`. Errors
// name the --compare argument or the combination; pipelines and remat_policy=auto are refused.
int run_compare(const Config& config, const std::vector<std::string>& compare, bool json);

// Remat settings of `config` that do nothing or raise the plan total, each planned against the same config without
// it: layers_per_group > 0 against 0, num_vocab_tiling > 1 against 1, a remat_policy other than full and none against
// full, and an offloading name-list policy against the same names saved on device. "Does nothing": the same step
// program op for op (ir::print) and the same plan (plan::trace). "Raises" (not for remat_policy, whose saving costs
// memory by design): a larger plan total. `ranks`: launched processes (0 for `remat plan`). None under a pipeline or
// remat_policy=auto.
std::vector<std::string> setting_warnings(const Config& config, int64_t ranks);
// Prints them to stderr as "warning: ..." lines, on the first rank of a launch only.
void print_setting_warnings(const Config& config, int64_t ranks);

// `remat convert to=remat hf_path=DIR output_path=FILE` and `to=hf load_parameters_path=CHECKPOINT
// output_path=DIR` (train/hf.h); the other arguments are an optional CONFIG.yml and config keys.
int run_convert(const std::vector<std::string>& args);
// A remat parameter file (`path`, or a checkpoint's step folder: its first file) read whole, and the config keys
// among `wanted` it was saved with, as key=value arguments (none where it has no saved config).
struct SavedParameters {
  std::filesystem::path file;
  train::SafeTensors tensors;
  std::vector<std::string> keys;
};
SavedParameters read_saved_parameters(const std::filesystem::path& path, std::span<const std::string> wanted);

// `remat generate load_parameters_path=CHECKPOINT_OR_HF_DIR prompt=... max_new_tokens=N [temperature= top_k=
// top_p= seed=] [CONFIG.yml] [key=value ...]` (docs/generate.md): prints both programs' plans, the text, and the
// prefill's and the decode's tokens/s.
int run_generate(const std::vector<std::string>& args);

// `remat plot RUN_DIR... [output_path=FILE.svg]` (default plot.svg): the runs' curves overlaid (trainer/curves.h).
int run_plot(const std::vector<std::string>& args);

// `remat tokenizer train`: a SentencePiece model (tokenizer_algorithm, vocab_size pieces) trained on the
// config's corpus (dataset_type, dataset_path, train_data_columns), written to tokenizer_path.
int run_tokenizer_train(const Config& config);
// `remat data prepare`: the config's corpus tokenized (tokenizer_type, tokenizer_path) into token shards under
// output_path, for dataset_type=tokens.
int run_data_prepare(const Config& config);

// Trains an MLP (16 -> 64 -> 64 -> 1, tanh) on y = sin(x . a) + 0.5 cos(x . b), reporting train and
// held-out MSE. The whole step (forward, backward, momentum update) is one graph run by the executor.
int run_demo(const DemoOptions& options);

}  // namespace remat::cli
