// Lint: policy names and regexes that match no checkpoint name are errors (listing the names that exist),
// unless allowed; a no-batch-dims dot policy on a model whose dots all have batch dims is a warning.
#include "nn/nn.h"
#include "remat/remat.h"
#include "support/models.h"

#include <gtest/gtest.h>

namespace remat {
namespace {

// A traced model and the policy of its remat regions.
struct Traced {
  ir::Graph graph;
  rematerialize::Policy policy;
};

Traced model_with(const std::string& policy) {
  const nn::ModelConfig c = testing_support::micro_model(2, true, policy);
  return {nn::loss_graph(c, 1, 4), c.remat_policy};
}

std::string lint_error(const Traced& t, bool allow = false) {
  try {
    rematerialize::lint(t.graph, t.policy, {.allow_unmatched = allow});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kNames =
    "the names are: context, decoder_layer_input, key_proj, mlpwi_0, mlpwi_1, mlpwo, out_proj, query_proj, value_proj";

TEST(Lint, EveryPresetMatchesTheModel) {
  for (const std::string& p : rematerialize::preset_names()) EXPECT_EQ(lint_error(model_with(p)), "") << p;
}

TEST(Lint, UnmatchedNameIsAnErrorListingTheNames) {
  std::string e = lint_error(model_with("save_only_these_names(query_proj, qkv_proj)"));
  EXPECT_NE(e.find("name 'qkv_proj' matches no checkpoint name in the model"), std::string::npos) << e;
  EXPECT_NE(e.find(kNames), std::string::npos) << e;
  EXPECT_NE(e.find("remat_allow_unmatched=true"), std::string::npos) << e;
}

TEST(Lint, UnmatchedRegexIsAnError) {  // "attention\\..*" is Python's way of writing the regex attention\..*
  std::string e =
      lint_error(model_with("save_and_offload_only_these_names_regex(save=\".*_proj\", offload=\"attention\\\\..*\")"));
  EXPECT_NE(e.find("regex \"attention\\..*\" matches no checkpoint name"), std::string::npos) << e;
}

TEST(Lint, AllowUnmatchedTurnsTheErrorIntoAWarning) {
  const Traced t = model_with("save_only_these_names(query_proj, qkv_proj)");
  EXPECT_EQ(lint_error(t, true), "");
  std::vector<std::string> w = rematerialize::lint(t.graph, t.policy, {.allow_unmatched = true});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("name 'qkv_proj' matches no checkpoint name"), std::string::npos);
}

TEST(Lint, CustomKeyThatIsNotACheckpointNameIsAnError) {
  std::string e = lint_error(model_with("custom(query_proj=offload, attn_out=device)"));
  EXPECT_NE(e.find("remat policy 'custom': name 'attn_out' matches no checkpoint name"), std::string::npos) << e;
  EXPECT_NE(e.find(kNames), std::string::npos) << e;
}

TEST(Lint, NoBatchDimsPolicyOnBatchedDotsWarns) {
  // A region whose only dot has batch dims (as every dot does under a vmap over pipeline stages).
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("x", {DType::f32, {4, 8, 8}});
  auto body = [](ir::Builder&, std::span<const ir::Tensor> a) {
    return std::vector<ir::Tensor>{ir::tanh(ir::matmul(a[0], a[0]))};
  };
  b.result(ir::checkpoint(b, std::array{x}, body, "dots_with_no_batch_dims_saveable")[0]);
  std::vector<std::string> w = rematerialize::lint(g, rematerialize::parse_policy("dots_with_no_batch_dims_saveable"), {});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("every one of the 1 dot_generals in remat regions has batch dimensions, so it saves nothing"),
            std::string::npos)
      << w[0];
  EXPECT_EQ(lint_error(model_with("dots_with_no_batch_dims_saveable")), "");
}

TEST(Policy, ParseErrorsShowTheGrammar) {
  auto error = [](const std::string& text) {
    try {
      rematerialize::parse_policy(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("save_everything").find("unknown remat policy 'save_everything'"), std::string::npos);
  EXPECT_NE(error("save_everything").find("a policy is one of"), std::string::npos);
  EXPECT_NE(error("save_and_offload_only_these_names(save=[a], offload=[a])").find("'a' is both saved and offloaded"),
            std::string::npos);
  EXPECT_NE(error("save_from_both_policies(minimal, qkv_proj_offloaded)").find("cannot combine offloading policies"),
            std::string::npos);
  EXPECT_NE(error("save_and_offload_only_these_names_regex(save=\"(\", offload=\"\")").find("bad regular expression"),
            std::string::npos);
  EXPECT_NE(error("custom(query_proj=disk)").find("expected remat, device or offload, got 'disk'"), std::string::npos);
}

TEST(Policy, CombineNeedsAPreferenceForConflictingAnswers) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor named = ir::checkpoint_name(b.param("x", {DType::f32, {2}}), "query_proj");
  const ir::Node& node = g.nodes.at(static_cast<size_t>(0));
  (void)named;
  rematerialize::Policy conflict = rematerialize::parse_policy("combine(save_qkv_proj, qkv_proj_offloaded)");
  EXPECT_THROW(rematerialize::evaluate(conflict, g, node, 0), Error);
  rematerialize::Policy preferred = rematerialize::parse_policy("combine(save_qkv_proj, qkv_proj_offloaded, prefer=offload)");
  EXPECT_EQ(rematerialize::evaluate(preferred, g, node, 0).residency, rematerialize::Residency::offload);
  rematerialize::Policy agree = rematerialize::parse_policy("combine(nothing_saveable, save_qkv_proj)");
  EXPECT_EQ(rematerialize::evaluate(agree, g, node, 0).residency, rematerialize::Residency::save);
}

}  // namespace
}  // namespace remat
