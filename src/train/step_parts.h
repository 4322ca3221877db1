// The pieces step programs share (step.cpp's one-device step, pipeline.cpp's per-rank step): the arguments a
// program declares, the means over microbatches and ranks, and the update. Internal to train/.
#pragma once

#include "train/grad_norm.h"
#include "train/step.h"

#include <span>
#include <string>
#include <vector>

namespace remat::train {

using ir::Tensor;

struct LossAndGrads {
  Tensor loss;
  std::vector<Tensor> grads;
  Tensor forward_loss;  // the loss before the means over microbatches and ranks (the program's Signature::loss)
};

struct StepInputs {
  std::vector<std::string> paths;  // the parameters' argument names (moments are opt_m/<path>, opt_v/<path>)
  std::vector<Tensor> params;
  std::vector<Tensor> m, v;        // with the optimizer
  Tensor step;                     // with the optimizer
  Tensor inputs, targets;
  Tensor loss_scale, loss_scale_count;  // with loss scaling
};

struct Declared {
  std::string name;  // the argument's name
  ir::Type type;
};

// Which arguments a program takes beside its parameters.
struct Arguments {
  bool optimizer = false;     // the parameters' moments and the step counter
  bool loss_scaling = false;  // the loss scale and its counter
  bool inputs = true, targets = true;  // the batch
};

// Declares the step's arguments as graph params, each with its role in `sig`: `params`, then those `with` asks for.
StepInputs declare(ir::Builder& b, ir::Signature& sig, const std::vector<Declared>& params, const StepShape& shape,
                   const Arguments& with);

// The means of loss and gradient sums over k microbatches on each rank of the model's mesh (step.cpp).
LossAndGrads mean_over(ir::Builder& b, const nn::ModelConfig& model, const std::vector<nn::ParamSpec>& specs,
                       LossAndGrads sums, int64_t k);

// The rest of the step from the mean loss and gradients of this rank's parameters (step.cpp).
void update(ir::Builder& b, ir::Signature& sig, const nn::ModelConfig& model, const OptimizerConfig& o,
            const StepInputs& in, LossAndGrads r, std::span<const GradPart> parts, int64_t stages);

}  // namespace remat::train
