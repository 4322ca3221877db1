// FSDP's gathered weights are weight-derived however their layer is checkpointed: the backward gathers them
// again, never keeping them. With remat_policy=none (no remat region: the layer scan itself decides) and with
// everything_saveable, no value anywhere in the step holds a whole layer kernel for every layer — the stack
// of gathered weights that would undo FSDP's 1/N memory.
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <functional>

namespace remat {
namespace {

// Whether `g` or a body holds a value of type `t`.
bool holds(const ir::Graph& g, const ir::Type& t) {
  for (const ir::Node& n : g.nodes) {
    for (ir::ValueId v : n.outputs)
      if (g.type(v) == t) return true;
    if (n.body && holds(*n.body, t)) return true;
  }
  return false;
}

TEST(FsdpResiduals, GatheredWeightsAreNeverStackedForTheBackward) {
  for (const char* policy : {"none", "everything_saveable"}) {
    nn::ModelConfig c = testing_support::small_model(4, true, policy);
    c.mesh = {{{"data", 1}, {"fsdp", 2}}};
    const ir::Graph g = train::grads_program(c, {2, 8, 1}).graph;
    const ir::Type stacked_whole{DType::f32, {c.num_decoder_layers, c.emb_dim, c.mlp_dim}};  // wi_0 of every layer
    const ir::Type shard{DType::f32, {c.num_decoder_layers, c.emb_dim / 2, c.mlp_dim}};
    EXPECT_TRUE(holds(g, shard)) << policy << ": the sharded parameter";
    EXPECT_FALSE(holds(g, stacked_whole)) << policy << ": gathered wi_0 kernels stacked over the layers";
  }
}

}  // namespace
}  // namespace remat
