// The training loop behind `remat train`: data, the step graph, progress, evaluation, metrics (JSONL)
// and a generated sample at the end.
#pragma once

#include "train/data.h"
#include "train/step.h"

#include <string>

namespace remat::train {

struct RunConfig {
  nn::ModelConfig model;
  StepShape shape;
  OptimizerConfig optimizer;
  int64_t steps = 600;                 // optimizer updates
  uint64_t init_seed = 0;              // parameter initialisation
  uint64_t data_seed = 0;              // batch sampling
  std::string dataset_path;            // "" = the default corpus
  double validation_fraction = 0.1;    // tail of each file held out
  int64_t eval_interval = 100;         // validation every this many steps (and at the end)
  int64_t eval_steps = 8;              // validation batches per evaluation
  int64_t log_period = 25;             // progress line every this many steps
  std::string run_dir;                 // metrics.jsonl goes here
  std::string sample_prompt = "The ";  // generation at the end
  int64_t sample_length = 200;         // bytes to generate
  double sample_temperature = 0.0;     // 0 = greedy
  bool remat_allow_unmatched = false;  // policy names matching no checkpoint name: warn instead of fail
};

struct RunResult {
  double train_loss = 0;       // last step's loss
  double validation_loss = 0;  // final evaluation
};

RunResult run(const RunConfig& config);

}  // namespace remat::train
