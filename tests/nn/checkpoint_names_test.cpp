// Checkpoint names: each appears exactly once per layer, on the tensor checkpoint_names.h describes.
// The golden file tests/nn/golden/decoder_1layer.check holds CHECK lines against the printed 1-layer
// model (unrolled, without a remat region, so the layer is inline). Set REMAT_PRINT_GOLDEN=1 to print it.
#include "nn/nn.h"
#include "support/filecheck.h"
#include "support/models.h"

#include <gtest/gtest.h>

#include <iostream>
#include <map>

namespace remat {
namespace {

// The layer inline, not inside a remat region.
nn::ModelConfig one_layer(bool scan) { return testing_support::micro_model(1, scan, "none"); }

void count_names(const ir::Graph& g, std::map<std::string, int>& counts, int multiplier) {
  for (const ir::Node& n : g.nodes) {
    if (n.op == ir::Op::name) counts[n.attrs.str("name")] += multiplier;
    if (n.op == ir::Op::scan) count_names(*n.body, counts, multiplier * static_cast<int>(n.attrs.integer("length")));
    if (n.op == ir::Op::remat) count_names(*n.body, counts, multiplier);
  }
}

// Every name the layer carries appears once per layer, and no other: both namings, every fusion.
TEST(CheckpointNames, EachNameOncePerLayerInEveryVocabulary) {
  using nn::names::Naming;
  for (nn::names::Vocabulary v : {nn::names::Vocabulary{Naming::maxtext, false, false}, {Naming::axlearn, false, false},
                                  {Naming::maxtext, true, false}, {Naming::maxtext, false, true}, {Naming::maxtext, true, true}})
    for (bool scan : {false, true}) {
      nn::ModelConfig c = one_layer(scan);
      c.num_decoder_layers = 3;
      c.checkpoint_naming = v.naming;
      c.fused_qkv = v.fused_qkv;
      c.fused_mlp = v.fused_mlp;
      c.remat_policy = nn::parse_remat_policy("minimal", c);
      std::map<std::string, int> counts;
      count_names(nn::loss_graph(c, 1, 4), counts, 1);
      size_t carried = 0;
      for (const nn::names::Name& name : nn::names::kAll) {
        if (!nn::names::carries(name, v)) continue;
        ++carried;
        const std::string n(nn::names::spelled(name, v.naming));
        EXPECT_EQ(counts[n], 3) << n << " scan=" << scan;
      }
      EXPECT_EQ(counts.size(), carried) << "no other names";
      // maxtext: 9 names, less 2 under fused_qkv (3 -> qkv_proj), less 1 under fused_mlp; axlearn: 11.
      EXPECT_EQ(carried, v.naming == Naming::axlearn ? 11u : 9u - 2 * v.fused_qkv - v.fused_mlp);
    }
}

// Under axlearn naming the same tensors carry AXLearn's names (the residual adds gain two), and the
// traced graph is otherwise the same: names are identities.
TEST(CheckpointNames, AxlearnNamesTheSameTensors) {
  nn::ModelConfig m = one_layer(false), a = one_layer(false);
  a.checkpoint_naming = nn::names::Naming::axlearn;
  std::string maxtext = ir::print(nn::loss_graph(m, 1, 4)), axlearn = ir::print(nn::loss_graph(a, 1, 4));
  EXPECT_EQ(testing_support::filecheck(R"(
// CHECK: name({{.*}}) {name="TransformerLayer.input"}
// CHECK: name({{.*}}) {name="GroupedQueryAttention.q_proj"} scope="decoder/layers/self_attention/query"
// CHECK: name({{.*}}) {name="GroupedQueryAttention.k_proj"} scope="decoder/layers/self_attention/key"
// CHECK: name({{.*}}) {name="GroupedQueryAttention.v_proj"} scope="decoder/layers/self_attention/value"
// CHECK: name({{.*}}) {name="GroupedQueryAttention.context"} scope="decoder/layers/self_attention/attention"
// CHECK: [[O:%[0-9]+]]: f32[1,4,16] = name({{.*}}) {name="GroupedQueryAttention.o_proj"}
// CHECK-NEXT: [[R:%[0-9]+]]: f32[1,4,16] = add({{%[0-9]+}}, [[O]]) scope="decoder/layers"
// CHECK-NEXT: name([[R]]) {name="TransformerAttentionLayer.residual_add"}
// CHECK: name({{.*}}) {name="TransformerFeedForwardLayer.linear1_0"} scope="decoder/layers/mlp/wi_0"
// CHECK: name({{.*}}) {name="TransformerFeedForwardLayer.linear1_1"} scope="decoder/layers/mlp/wi_1"
// CHECK: [[WO:%[0-9]+]]: f32[1,4,16] = name({{.*}}) {name="TransformerFeedForwardLayer.linear2"}
// CHECK-NEXT: [[Y:%[0-9]+]]: f32[1,4,16] = add({{%[0-9]+}}, [[WO]]) scope="decoder/layers"
// CHECK-NEXT: name([[Y]]) {name="TransformerFeedForwardLayer.mlp_residual"}
)", axlearn), "");
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = 0; (at = s.find(what, at)) != std::string::npos; ++at) ++n;
    return n;
  };
  EXPECT_EQ(count(axlearn, "= name("), count(maxtext, "= name(") + 2);
  EXPECT_EQ(count(axlearn, "\n"), count(maxtext, "\n") + 2);
}

TEST(CheckpointNames, GoldenOneLayerModel) {
  std::string out = ir::print(nn::loss_graph(one_layer(false), 1, 4));
  if (std::getenv("REMAT_PRINT_GOLDEN")) std::cout << out;
  std::string golden = testing_support::read_file(std::string(REMAT_TEST_DATA) + "/nn/golden/decoder_1layer.check");
  EXPECT_EQ(testing_support::filecheck(golden, out), "");
}

}  // namespace
}  // namespace remat
