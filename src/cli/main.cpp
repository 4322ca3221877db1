// `remat`: the command-line entry point. Subcommands:
//   remat demo [--steps N] [--seed S]   trains a small MLP on a synthetic regression task through the engine
#include "cli/commands.h"

#include "base/check.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

int main(int argc, char** argv) {
  CLI::App app{"remat: transformer training with activation memory under exact control"};
  app.require_subcommand(1);
  remat::cli::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand("demo", "train a small MLP on a synthetic regression task");
  demo_cmd->add_option("--steps", demo.steps, "training steps")->check(CLI::PositiveNumber);
  demo_cmd->add_option("--seed", demo.seed, "random seed");
  demo_cmd->add_option("--lr", demo.learning_rate, "learning rate")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    if (demo_cmd->parsed()) return remat::cli::run_demo(demo);
  } catch (const remat::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 0;
}
