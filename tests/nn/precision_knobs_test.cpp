// MaxText's stability knobs under bf16 compute: float32_qk_product, float32_logits and logits_dot_in_fp32
// choose the dtype of the attention q.k product, of the attention scores and softmax, and of the
// vocabulary projection; every setting trains to a loss close to the default's.
#include "autodiff/autodiff.h"
#include "nn/nn.h"
#include "remat/remat.h"
#include "support/models.h"

#include <gtest/gtest.h>

#include <cmath>

namespace remat {
namespace {

nn::ModelConfig bf16_model() {
  nn::ModelConfig c = testing_support::small_model(2, false, "none");
  c.precision = nn::parse_precision("p=f32,c=bf16");
  return c;
}

// The dtypes of the dot_general outputs and of the exp ops under `scope`, in trace order.
std::vector<std::string> dtypes(const nn::ModelConfig& c, ir::Op op, const std::string& scope) {
  ir::Graph g = nn::loss_graph(c, 2, 16);
  std::vector<std::string> out;
  for (const ir::Node& n : g.nodes)
    if (n.op == op && n.scope.ends_with(scope)) {
      std::string in;
      for (ir::ValueId v : n.inputs) in += std::string(dtype_name(g.type(v).dtype)) + " ";
      out.push_back(in + "-> " + std::string(dtype_name(g.type(n.outputs[0]).dtype)));
    }
  return out;
}

TEST(PrecisionKnobs, DefaultsKeepScoresSoftmaxInF32AndTheVocabularyDotInBf16) {
  nn::ModelConfig c = bf16_model();
  // per layer: scores = q.k (f32), then ctx = probs.v (bf16)
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "self_attention/attention"),
            (std::vector<std::string>{"f32 f32 -> f32", "bf16 bf16 -> bf16", "f32 f32 -> f32", "bf16 bf16 -> bf16"}));
  EXPECT_EQ(dtypes(c, ir::Op::exp, "self_attention/attention"), (std::vector<std::string>{"f32 -> f32", "f32 -> f32"}));
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "logits_dense"), (std::vector<std::string>{"bf16 bf16 -> bf16"}));
}

TEST(PrecisionKnobs, EachKnobMovesItsOwnComputation) {
  nn::ModelConfig c = bf16_model();
  c.float32_qk_product = false;  // q.k in bf16, its scores cast up: the softmax stays f32
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "self_attention/attention")[0], "bf16 bf16 -> bf16");
  EXPECT_EQ(dtypes(c, ir::Op::exp, "self_attention/attention")[0], "f32 -> f32");
  c.float32_logits = false;  // and the softmax in bf16
  EXPECT_EQ(dtypes(c, ir::Op::exp, "self_attention/attention")[0], "bf16 -> bf16");
  c.logits_dot_in_fp32 = true;
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "logits_dense"), (std::vector<std::string>{"f32 f32 -> f32"}));
  c.logits_via_embedding = true;  // the tied projection follows the same knob
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "logits_dense"), (std::vector<std::string>{"f32 f32 -> f32"}));
}

double loss(const nn::ModelConfig& c) {
  ir::Graph f = nn::loss_graph(c, 2, 16);
  std::vector<exec::Array> args = nn::init_params(c, 3);
  std::vector<int32_t> tokens(32);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 53 + 7) % 256);
  args.push_back(exec::Array::from<int32_t>({2, 16}, tokens));
  std::rotate(tokens.begin(), tokens.begin() + 1, tokens.end());
  args.push_back(exec::Array::from<int32_t>({2, 16}, tokens));
  return exec::run(f, args)[0].get(0);
}

TEST(PrecisionKnobs, AllSettingsGiveNearlyTheSameLoss) {
  nn::ModelConfig c = bf16_model();
  const double reference = loss(c);  // ln(256) = 5.545 at init
  EXPECT_NEAR(reference, std::log(256.0), 0.05);
  c.float32_qk_product = c.float32_logits = false;
  c.logits_dot_in_fp32 = true;
  EXPECT_NEAR(loss(c), reference, 1e-2 * reference);
}

}  // namespace
}  // namespace remat
