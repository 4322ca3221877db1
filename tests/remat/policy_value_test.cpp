// The policy is a value, parsed once: a bare `custom` and the search's placements are built as values and
// print as the custom(...) text a user would paste; `auto` is a kind the model refuses to trace; a remat region
// carries its policy value, which decides its residuals (no lookup by text); the layer's checkpoint names reach the parser from above (remat/
// includes nothing of nn/).
#include "ir/text.h"
#include "nn/nn.h"
#include "remat/remat.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace remat {
namespace {

using rematerialize::Policy;
using rematerialize::Residency;

TEST(PolicyValue, BareCustomPlacesTheConfigKeysAsTheWrittenMapDoes) {
  const Policy keys = rematerialize::parse_policy("custom", {}, {{"query_proj", "offload"}, {"mlpwo", "device"}});
  const Policy text = rematerialize::parse_policy("custom(query_proj=offload, mlpwo=device)");
  EXPECT_EQ(keys.kind, Policy::Kind::custom);
  EXPECT_EQ(keys.written, "custom(query_proj=offload, mlpwo=device)");
  EXPECT_EQ(keys.save_names, (std::vector<std::string>{"decoder_layer_input", "mlpwo"}));
  EXPECT_EQ(keys.offload_names, std::vector<std::string>{"query_proj"});
  EXPECT_EQ(keys.text, text.text);
  EXPECT_THROW(rematerialize::parse_policy("custom"), Error);  // no keys: nothing to place
}

TEST(PolicyValue, APlacementPrintsAsPasteableCustomText) {
  const Policy p = rematerialize::custom_policy(
      {{"query_proj", Residency::offload}, {"mlpwo", Residency::save}, {"context", Residency::recompute}});
  EXPECT_EQ(p.written, "custom(query_proj=offload, mlpwo=device, context=remat)");
  EXPECT_EQ(rematerialize::parse_policy(p.written).text, p.text);
  EXPECT_EQ(p.described(), "custom = save_and_offload_only_these_names(save=[decoder_layer_input, mlpwo], "
                           "offload=[query_proj])");
}

TEST(PolicyValue, AutoIsAKindTheModelRefusesToTrace) {
  const nn::ModelConfig c = testing_support::micro_model(1, false, "auto");
  EXPECT_EQ(c.remat_policy.kind, Policy::Kind::automatic);
  try {
    nn::loss_graph(c, 1, 4);
    FAIL() << "the model traced remat_policy=auto";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the policy search"), std::string::npos) << e.what();
  }
}

// What a region's decisions come from: the value it carries. A minimal policy labelled "full" (its written
// text, what the IR prints) decides as minimal does; a lookup by text would decide as full.
std::vector<std::pair<std::string, Residency>> decisions(const nn::ModelConfig& c) {
  rematerialize::Decider d;
  train::grads_program(c, {1, 4, 1}, &d);
  std::vector<std::pair<std::string, Residency>> out;
  for (const rematerialize::ResidualRecord& r : d.records()) out.emplace_back(r.what, r.residency);
  return out;
}

TEST(PolicyValue, ARegionDecidesByThePolicyValueItCarriesNotByItsText) {
  const nn::ModelConfig full = testing_support::micro_model(1, false, "full");
  const nn::ModelConfig minimal = testing_support::micro_model(1, false, "minimal");
  nn::ModelConfig labelled = minimal;
  labelled.remat_policy.written = "full";
  const ir::Graph g = nn::loss_graph(labelled, 1, 4);
  EXPECT_NE(ir::print(g).find("policy=\"full\""), std::string::npos) << "the IR prints the written text";
  EXPECT_EQ(decisions(labelled), decisions(minimal));
  EXPECT_NE(decisions(labelled), decisions(full));
}

// num_vocab_tiling's chunks are remat regions of policy full whatever remat_policy is: each carries its own.
TEST(PolicyValue, VocabularyTilesCarryTheirOwnPolicyUnderAnyLayerPolicy) {
  nn::ModelConfig c = testing_support::micro_model(1, false, "minimal");
  c.num_vocab_tiling = 2;
  rematerialize::Decider d;
  train::grads_program(c, {1, 4, 1}, &d);
  std::set<std::string> policies;
  for (const rematerialize::ResidualRecord& r : d.records()) policies.insert(r.policy.substr(0, r.policy.find(' ')));
  EXPECT_EQ(policies, (std::set<std::string>{"full", "minimal"}));
}

// The spelling nn hands the parser: presets list the layer's own names (the table in nn/checkpoint_names.h).
TEST(PolicyValue, PresetsAreSpelledAsTheLayerHandsThem) {
  nn::ModelConfig c = testing_support::micro_model(1, false, "full");
  c.fused_qkv = true;
  EXPECT_EQ(nn::parse_remat_policy("save_qkv_proj", c).save_names, std::vector<std::string>{"qkv_proj"});
  c.fused_qkv = false;
  c.checkpoint_naming = nn::names::Naming::axlearn;
  EXPECT_EQ(nn::parse_remat_policy("save_out_proj", c).save_names,
            std::vector<std::string>{"GroupedQueryAttention.o_proj"});
  EXPECT_EQ(nn::parse_remat_policy("custom(out_proj=offload)", c).offload_names,
            std::vector<std::string>{"GroupedQueryAttention.o_proj"});
}

TEST(PolicyValue, RematIncludesNothingOfNn) {
  const std::filesystem::path remat = std::filesystem::path(REMAT_TEST_DATA).parent_path() / "src" / "remat";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(remat)) {
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str().find("#include \"nn/"), std::string::npos) << entry.path().filename();
    ++files;
  }
  EXPECT_GE(files, 6);
}

}  // namespace
}  // namespace remat
