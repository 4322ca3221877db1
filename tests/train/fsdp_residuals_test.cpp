// FSDP's gathered weights are weight-derived however their layer is checkpointed: the backward gathers them
// again, never keeping them. With remat_policy=none (no remat region: the layer scan itself decides) and with
// everything_saveable, unfused and fused (qkv_proj, mlpwi), with f32, bf16 and f16 compute, no value anywhere in
// the step holds a whole layer kernel for every layer — the stack of gathered weights that would undo FSDP's
// 1/N memory — while each layer's gathered kernel, whole, is there in the compute dtype.
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <functional>
#include <map>

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

// One layer's kernels, whole, from the config's sizes (MaxText's layouts, checkpoint_names.h).
std::map<std::string, ir::Shape> layer_kernels(const nn::ModelConfig& c) {
  const int64_t D = c.emb_dim, H = c.num_heads, KV = c.num_kv_heads, Dh = c.head_dim, F = c.mlp_dim;
  std::map<std::string, ir::Shape> k = {{"out", {H, Dh, D}}, {"wo", {F, D}}};
  if (c.fused_qkv) k["qkv_proj"] = {D, H + 2 * KV, Dh};
  else k["query"] = {D, H, Dh}, k["key"] = {D, KV, Dh}, k["value"] = {D, KV, Dh};
  if (c.fused_mlp) k["wi"] = {D, 2, F};
  else k["wi_0"] = {D, F}, k["wi_1"] = {D, F};
  return k;
}

TEST(FsdpResiduals, GatheredWeightsAreNeverStackedForTheBackward) {
  for (const char* policy : {"none", "everything_saveable"})
    for (bool fused : {false, true})
      for (DType compute : {DType::f32, DType::bf16, DType::f16}) {
        nn::ModelConfig c = testing_support::small_model(4, true, policy);
        c.fused_qkv = c.fused_mlp = fused;
        c.precision = nn::parse_precision(fmt::format("p=f32,c={}", dtype_name(compute)));
        c.mesh = {{{"data", 1}, {"fsdp", 2}}};
        const ir::Graph g = train::grads_program(c, {2, 8, 1}).graph;
        for (const auto& [name, whole] : layer_kernels(c)) {
          const std::string what = fmt::format("{}, fused {}, compute {}: {}", policy, fused, dtype_name(compute), name);
          ir::Shape stacked = whole;
          stacked.insert(stacked.begin(), c.num_decoder_layers);
          EXPECT_TRUE(holds(g, {compute, whole})) << what << ": a layer's gathered kernel";
          for (DType d : {DType::f32, DType::bf16, DType::f16})
            EXPECT_FALSE(holds(g, {d, stacked})) << what << ": gathered kernels stacked over the layers in " << dtype_name(d);
        }
      }
}

}  // namespace
}  // namespace remat
