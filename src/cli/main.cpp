// `remat`: the command-line entry point.
//   remat train [CONFIG.yml] [key=value ...]   trains the configured decoder (built-in configs/base.yml, CONFIG.yml over it)
//   remat explain [CONFIG.yml] [key=value ...] [--json]   every residual of the step and its remat decision
//   remat plan [CONFIG.yml] [key=value ...] [--json] [--timeline FILE.svg] [--frontier FILE.svg] [--layers-per-group]
//   remat plan [CONFIG.yml] [key=value ...] [--json] --compare KEY=V1,V2,... [--compare ...]   one row per combination
//   remat plan [CONFIG.yml] [key=value ...] [--json] --search-pipeline [--stages 2,4] [--microbatches 8,16] [--policies full,minimal]
//   remat convert to=remat hf_path=DIR output_path=FILE | to=hf load_parameters_path=CHECKPOINT output_path=DIR
//   remat plot RUN_DIR... [output_path=FILE.svg]   several runs' loss curves in one SVG
//   remat generate load_parameters_path=CHECKPOINT_OR_HF_DIR prompt=... max_new_tokens=N [temperature top_k top_p seed]
//   remat demo [--steps N]                     trains a small MLP on a synthetic regression task
//   remat tokenizer train [CONFIG.yml] dataset_path=FILES vocab_size=N tokenizer_path=OUT.model [tokenizer_algorithm=bpe|unigram]
//   remat data prepare [CONFIG.yml] dataset_type=text|jsonl dataset_path=... [tokenizer_type=... tokenizer_path=...] output_path=DIR
// train, explain and plan also take --dump-ir=PASS: every program they compile, printed after that pass.
#include "cli/commands.h"
#include "cli/config.h"

#include "base/check.h"
#include "compile/passes.h"
#include "exec/mesh.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <new>

namespace {

// Splits positional arguments into an optional leading config file and key=value overrides; `dump_ir`: the
// --dump-ir flag.
remat::cli::Config config_from(const std::vector<std::string>& args, const std::string& dump_ir) {
  std::string base;
  std::vector<std::string> overrides = args;
  if (!overrides.empty() && overrides[0].find('=') == std::string::npos) {
    base = overrides[0];
    overrides.erase(overrides.begin());
  }
  remat::compile::check_pass_name(dump_ir);
  remat::cli::Config config = remat::cli::load_config(base, overrides);
  config.run.dump_ir_after = dump_ir;
  return config;
}

int train_command(const std::vector<std::string>& args, const std::string& dump_ir, bool search_layers_per_group) {
  remat::cli::Config config = config_from(args, dump_ir);
  config.search_layers_per_group = search_layers_per_group;
  remat::cli::print_setting_warnings(config, remat::exec::Mesh::launched_ranks());
  remat::cli::require_auto_fits(config);
  remat::trainer::RunResult r = remat::trainer::run(config.run);
  fmt::print("final: train loss {:.4f}, validation loss {}\n", r.train_loss, remat::trainer::validation_loss_str(r));
  return 0;
}

}  // namespace

// The subcommands, their arguments and flags (filled in by CLI11 as it parses).
struct Commands {
  std::string dump_ir;  // --dump-ir=PASS on train, explain and plan
  std::vector<std::string> train_args, explain_args, plan_args, convert_args, generate_args, plot_args,
      tokenizer_args, prepare_args;
  bool search_layers_per_group = false, explain_json = false, plan_json = false, search_pipeline = false;
  std::string pipeline_stages, pipeline_microbatches, pipeline_policies;  // --stages, --microbatches, --policies
  std::string timeline, frontier;
  std::vector<std::string> compare;
  remat::cli::DemoOptions demo;
  CLI::App *train_cmd = nullptr, *explain_cmd = nullptr, *plan_cmd = nullptr, *convert_cmd = nullptr,
           *generate_cmd = nullptr, *plot_cmd = nullptr, *tokenizer_cmd = nullptr, *tokenizer_train_cmd = nullptr,
           *data_cmd = nullptr, *prepare_cmd = nullptr, *demo_cmd = nullptr;
};

// Declares every subcommand on `app`, bound to `c` (which must outlive the parse).
void declare(CLI::App& app, Commands& c) {
  // --dump-ir=PASS on train, explain and plan: every program they compile is printed after that pass.
  std::string pass_names;
  for (const remat::compile::Pass& p : remat::compile::passes()) pass_names += fmt::format(" {}", p.name);
  auto add_dump_ir = [&](CLI::App* command) {
    command->add_option("--dump-ir", c.dump_ir, "print the IR of every program compiled after this pass, one of:" + pass_names);
  };
  c.train_cmd = app.add_subcommand("train", "train the configured decoder: remat train [CONFIG.yml] [key=value ...]");
  c.train_cmd->add_option("args", c.train_args, "an optional base config file, then key=value overrides");
  add_dump_ir(c.train_cmd);
  // remat_policy=auto: the group size (layers_per_group) searched with the two policies.
  const char* group_size_help = "with remat_policy=auto: search the group size too (every layers_per_group that "
                                "divides the layers, and no groups), printed with the policies";
  c.train_cmd->add_flag("--layers-per-group", c.search_layers_per_group, group_size_help);
  c.explain_cmd =
      app.add_subcommand("explain", "every residual of the training step and its remat decision: remat explain [CONFIG.yml] [key=value ...]");
  c.explain_cmd->add_option("args", c.explain_args, "an optional base config file, then key=value overrides");
  c.explain_cmd->add_flag("--json", c.explain_json, "machine-readable output");
  add_dump_ir(c.explain_cmd);
  c.plan_cmd = app.add_subcommand(
      "plan", "the memory plan of the training step, from shapes alone: remat plan [CONFIG.yml] [key=value ...]");
  c.plan_cmd->add_option("args", c.plan_args, "an optional base config file, then key=value overrides");
  c.plan_cmd->add_flag("--json", c.plan_json, "machine-readable output");
  c.plan_cmd->add_flag("--layers-per-group", c.search_layers_per_group, group_size_help);
  add_dump_ir(c.plan_cmd);
  c.plan_cmd->add_flag("--search-pipeline", c.search_pipeline,
                       "the pipeline (schedule, stages, microbatches, chunks, a policy per rank) of least simulated "
                       "step time whose every rank fits hbm_limit");
  c.plan_cmd->add_option("--stages", c.pipeline_stages, "with --search-pipeline: stage counts to try, e.g. 2,4,8");
  c.plan_cmd->add_option("--microbatches", c.pipeline_microbatches, "with --search-pipeline: microbatch counts, e.g. 8,16");
  c.plan_cmd->add_option("--policies", c.pipeline_policies,
                         "with --search-pipeline: each rank's candidate remat policies, e.g. full,minimal,none");
  c.plan_cmd->add_option("--timeline", c.timeline, "write an SVG of live bytes over the schedule to this file");
  c.plan_cmd->add_option("--frontier", c.frontier,
                       "write an SVG of the Pareto frontier of remat placements (peak vs recompute cost), MaxText presets marked");
  c.plan_cmd->add_option("--compare", c.compare,
                       "KEY=V1,V2,...: plan the config once per value instead (repeat for more keys: every combination), "
                       "one row each: total, peak, saved and offloaded bytes, recompute, estimated step time")
      ->allow_extra_args(false);  // one value per --compare: what follows it is the command line's again
  c.convert_cmd = app.add_subcommand(
      "convert", "Hugging Face Llama in and out: remat convert to=remat hf_path=DIR output_path=FILE, or "
                 "to=hf load_parameters_path=CHECKPOINT output_path=DIR [key=value ...]");
  c.convert_cmd->add_option("args", c.convert_args, "to=, hf_path= or load_parameters_path=, output_path=, config keys");
  c.generate_cmd = app.add_subcommand(
      "generate", "text with a KV cache: remat generate load_parameters_path=CHECKPOINT_OR_HF_DIR prompt=... "
                  "max_new_tokens=N [temperature=T top_k=K top_p=P seed=S] [key=value ...]");
  c.generate_cmd->add_option("args", c.generate_args, "load_parameters_path=, prompt=, max_new_tokens=, sampling and config keys");
  c.plot_cmd = app.add_subcommand(
      "plot", "several runs' loss, learning rate and tokens/s in one SVG: remat plot RUN_DIR... [output_path=FILE.svg]");
  c.plot_cmd->add_option("args", c.plot_args, "run folders (base_output_directory/run_name), then output_path=");
  c.tokenizer_cmd = app.add_subcommand("tokenizer", "tokenizers: remat tokenizer train ...");
  c.tokenizer_cmd->require_subcommand(1);
  c.tokenizer_train_cmd = c.tokenizer_cmd->add_subcommand(
      "train", "train a SentencePiece tokenizer: dataset_path=FILES vocab_size=N tokenizer_path=OUT.model [tokenizer_algorithm=bpe|unigram]");
  c.tokenizer_train_cmd->add_option("args", c.tokenizer_args, "an optional base config file, then key=value overrides");
  c.data_cmd = app.add_subcommand("data", "datasets: remat data prepare ...");
  c.data_cmd->require_subcommand(1);
  c.prepare_cmd = c.data_cmd->add_subcommand(
      "prepare", "tokenize a corpus into token shards: dataset_type=text|jsonl dataset_path=... tokenizer_type=... "
                 "tokenizer_path=... output_path=DIR");
  c.prepare_cmd->add_option("args", c.prepare_args, "an optional base config file, then key=value overrides");
  c.demo_cmd = app.add_subcommand("demo", "train a small MLP on a synthetic regression task");
  c.demo_cmd->add_option("--steps", c.demo.steps, "training steps")->check(CLI::PositiveNumber);
  c.demo_cmd->add_option("--seed", c.demo.seed, "random seed");
  c.demo_cmd->add_option("--lr", c.demo.learning_rate, "learning rate")->check(CLI::PositiveNumber);
}

// --search-pipeline's lists: "2,4" -> {2, 4}; errors name the flag.
remat::cli::PipelineSearchOptions search_options(const Commands& c) {
  remat::cli::PipelineSearchOptions o;
  auto counts = [](const std::string& text, const char* flag) {
    std::vector<int64_t> out;
    if (text.empty()) return out;
    for (const std::string& v : remat::cli::split_values(text)) {
      size_t used = 0;
      int64_t n = 0;
      try {
        n = std::stoll(v, &used);
      } catch (const std::exception&) {
      }
      CHECK(used == v.size() && n >= 1, "{} '{}': '{}' is not a positive count; give a list like 2,4,8", flag, text, v);
      out.push_back(n);
    }
    return out;
  };
  o.stages = counts(c.pipeline_stages, "--stages");
  o.microbatches = counts(c.pipeline_microbatches, "--microbatches");
  if (!c.pipeline_policies.empty()) o.policies = remat::cli::split_values(c.pipeline_policies);
  return o;
}

// Runs the subcommand that was parsed.
int run(const Commands& c) {
  if (c.train_cmd->parsed()) return train_command(c.train_args, c.dump_ir, c.search_layers_per_group);
  if (c.plan_cmd->parsed() && !c.compare.empty()) {
    CHECK(c.timeline.empty() && c.frontier.empty(), "remat plan --compare prints a table of plans and takes no --timeline or "
          "--frontier: run `remat plan` with the row's overrides for those");
    return remat::cli::run_compare(config_from(c.plan_args, c.dump_ir), c.compare, c.plan_json);
  }
  if (c.plan_cmd->parsed() && c.search_pipeline)
    return remat::cli::run_search_pipeline(config_from(c.plan_args, c.dump_ir), search_options(c), c.plan_json);
  CHECK(c.pipeline_stages.empty() && c.pipeline_microbatches.empty() && c.pipeline_policies.empty(),
        "--stages, --microbatches and --policies go with --search-pipeline: add it, or drop them");
  if (c.plan_cmd->parsed()) {
    remat::cli::Config config = config_from(c.plan_args, c.dump_ir);
    config.search_layers_per_group = c.search_layers_per_group;
    return remat::cli::run_plan(config, c.plan_json, c.timeline, c.frontier);
  }
  if (c.explain_cmd->parsed()) return remat::cli::run_explain(config_from(c.explain_args, c.dump_ir), c.explain_json);
  if (c.convert_cmd->parsed()) return remat::cli::run_convert(c.convert_args);
  if (c.plot_cmd->parsed()) return remat::cli::run_plot(c.plot_args);
  if (c.generate_cmd->parsed()) return remat::cli::run_generate(c.generate_args);
  if (c.tokenizer_train_cmd->parsed()) return remat::cli::run_tokenizer_train(config_from(c.tokenizer_args, ""));
  if (c.prepare_cmd->parsed()) return remat::cli::run_data_prepare(config_from(c.prepare_args, ""));
  if (c.demo_cmd->parsed()) return remat::cli::run_demo(c.demo);
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"remat: transformer training with activation memory under exact control"};
  app.require_subcommand(1);
  Commands c;
  declare(app, c);
  CLI11_PARSE(app, argc, argv);
  // Every error a user can cause ends here as one line and exit 2: remat's own (CHECK), and the kinds that
  // the places naming their path do not catch (a file-system call, a JSON text, memory).
  std::string error;
  try {
    return run(c);
  } catch (const remat::Error& e) {
    error = e.what();
  } catch (const std::filesystem::filesystem_error& e) {  // names the call, the reason and the path(s)
    error = fmt::format("{} (check base_output_directory and the paths given)", e.what());
  } catch (const nlohmann::json::exception& e) {
    error = fmt::format("malformed JSON: {}", e.what());
  } catch (const std::bad_alloc&) {
    error = "out of memory (an allocation failed): check the sizes the config asks for (per_device_batch_size, "
            "max_target_length, eval_steps, ...); `remat plan` with the same keys shows the bytes the step needs";
  }
  fmt::print(stderr, "error: {}\n", error);
  std::fflush(stderr);
  remat::exec::Mesh::abort_launch(2);  // under mpirun: the other ranks would wait for this one forever
  return 2;
}
