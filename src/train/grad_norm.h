// The global gradient norm of a training step (train/step.cpp's clipping): the same bits however the
// parameters are split over FSDP shards and pipeline stages. Internal to train/.
#pragma once

#include "ir/ir.h"
#include "nn/model.h"

#include <optional>
#include <span>

namespace remat::train {

// A gradient and where its parameter lies in the whole model: index `param` of nn::param_specs, and for a stacked
// layer parameter the layer of its first row (a pipeline stage holds a block of the layers).
struct GradPart {
  ir::Tensor grad;
  size_t param;
  int64_t first_layer = 0;
};

// The sum of every gradient's squares, the same bits however the parameters are split — FSDP shards along
// embed, pipeline stages along layers: each parameter's squares summed over every dimension but those two
// (each of those sums reads the same elements in the same order either way), the FSDP shards' partial sums
// gathered, a stage's rows put in their place among zeros and the places summed over the `stage` axis (one
// rank holds each row, and adding zero to a sum of squares is exact), then summed; parameter by parameter in
// the model's order. A tensor-parallel block's sums are summed over `tensor` (in rank order: the same bits on
// every rank, not those of one device). `parts` are this rank's gradients, divided by `loss_scale` where given
// (as they are read).
ir::Tensor squared_norm(ir::Builder& b, const nn::ModelConfig& model, std::span<const GradPart> parts, int64_t stages,
                          std::optional<ir::Tensor> loss_scale);

}  // namespace remat::train
