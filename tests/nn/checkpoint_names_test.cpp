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

TEST(CheckpointNames, EachNameOncePerLayer) {
  for (bool scan : {false, true}) {
    nn::ModelConfig c = one_layer(scan);
    c.num_decoder_layers = 3;
    c.remat_policy = "minimal";
    std::map<std::string, int> counts;
    count_names(nn::loss_graph(c, 1, 4), counts, 1);
    EXPECT_EQ(counts.size(), nn::names::kAll.size());
    for (std::string_view name : nn::names::kAll) EXPECT_EQ(counts[std::string(name)], 3) << name << " scan=" << scan;
  }
}

TEST(CheckpointNames, GoldenOneLayerModel) {
  std::string out = ir::print(nn::loss_graph(one_layer(false), 1, 4));
  if (std::getenv("REMAT_PRINT_GOLDEN")) std::cout << out;
  std::string golden = testing_support::read_file(std::string(REMAT_TEST_DATA) + "/nn/golden/decoder_1layer.check");
  EXPECT_EQ(testing_support::filecheck(golden, out), "");
}

}  // namespace
}  // namespace remat
