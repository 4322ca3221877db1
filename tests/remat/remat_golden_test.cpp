// Golden tests of the remat split on one decoder layer (D=16, H=2, KV=1, Dh=8, F=32, batch 1, seq 4,
// unrolled): each tests/remat/golden/*.check file names its policy on a RUN line (`// RUN: policy=...`)
// and holds CHECK lines against the printed gradient graph. Set REMAT_PRINT_GOLDEN=1 to print it.
#include "remat/remat.h"
#include "support/filecheck.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

namespace remat {
namespace {

namespace fs = std::filesystem;

nn::ModelConfig one_layer(const std::string& policy) { return testing_support::micro_model(1, false, policy); }

ir::Graph layer_grads(const std::string& policy) { return train::grads_program(one_layer(policy), {1, 4, 1}).graph; }

// dot_generals the backward runs to recompute forward values.
int recomputed_dots(const ir::Graph& g) {
  int n = 0;
  for (const ir::Node& node : g.nodes) n += node.recomputed && node.op == ir::Op::dot_general;
  return n;
}

std::vector<std::string> golden_files() { return testing_support::golden_files("remat/golden", ".check"); }

class RematGolden : public testing::TestWithParam<std::string> {};

TEST_P(RematGolden, MatchesCheckLines) {
  std::string text = testing_support::read_file(GetParam());
  std::string run = testing_support::run_line(text);
  ASSERT_EQ(run.rfind("policy=", 0), 0u) << GetParam() << ": RUN line must be 'policy=...'";
  std::string out = ir::print(layer_grads(run.substr(7)));
  if (std::getenv("REMAT_PRINT_GOLDEN")) std::cout << out;
  EXPECT_EQ(testing_support::filecheck(text, out), "") << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Files, RematGolden, testing::ValuesIn(golden_files()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return fs::path(info.param).stem().string();
                         });

// AXLearn's check (attention_test.py) in our terms. Per layer, the backward recomputes under
// nothing_saveable 8 dot_generals: the q, k, v projections (3, for the attention VJP), the scores (1, for
// softmax's VJP), probs . v (1, for Wo's weight gradient), context . Wo (1, to rebuild x + out_proj for the
// post-attention norm), and h . Wi0, h . Wi1 (2, for the gated MLP's VJP); h . Wo of the MLP is never
// needed (the residual add's VJP reads no values). Saving q/k/v/context/out_proj removes exactly the 5
// dots that produce them: 8 - 5 = 3 (scores, Wi0, Wi1).
TEST(RematGolden, SavingAttentionProjectionsRemovesFiveRecomputedDots) {
  int nothing = recomputed_dots(layer_grads("nothing_saveable"));
  int attention = recomputed_dots(
      layer_grads("save_and_offload_only_these_names_regex(save=\"query_proj|key_proj|value_proj|context|out_proj\", "
                  "offload=\"\")"));
  EXPECT_EQ(nothing, 8);
  EXPECT_EQ(attention, 3);
  EXPECT_EQ(nothing - attention, 5);
}

// JAX's rule: dots without batch dims (the q/k/v/o and MLP projections) are saved; the scores and context
// dots (batch dims b, h) are recomputed. `.at()` throws for a scope with no record, so a dot the decider
// never saw fails the test instead of reading as a default.
TEST(RematGolden, DotsWithNoBatchDimsSavesProjectionsNotAttentionDots) {
  const nn::ModelConfig c = one_layer("dots_with_no_batch_dims_saveable");
  rematerialize::Decider d;
  train::grads_program(c, {1, 4, 1}, &d);
  std::map<std::string, std::vector<rematerialize::Residency>> dots;  // by scope, in record order
  for (const rematerialize::ResidualRecord& r : d.records())
    if (r.what.rfind("dot_general @ ", 0) == 0) dots[r.scope].push_back(r.residency);
  using rematerialize::Residency;
  for (const char* projection : {"query", "key", "value", "out"})
    EXPECT_EQ(dots.at(fmt::format("decoder/layers/self_attention/{}", projection)), std::vector{Residency::save})
        << projection;
  for (const char* projection : {"wi_0", "wi_1"})
    EXPECT_EQ(dots.at(fmt::format("decoder/layers/mlp/{}", projection)), std::vector{Residency::save}) << projection;
  // Both attention dots (scores, probs . v) are residuals, and both are recomputed.
  EXPECT_EQ(dots.at("decoder/layers/self_attention/attention"),
            (std::vector{Residency::recompute, Residency::recompute}));
}

}  // namespace
}  // namespace remat
