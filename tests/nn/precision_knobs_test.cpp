// MaxText's stability knobs under bf16 compute: float32_qk_product (q.k in f32), float32_logits (scores
// cast up to f32 before the softmax, never down) and logits_dot_in_fp32 (the vocabulary projection in f32).
// Also: a bf16 loss and its gradients with every knob off stay close to the default's.
#include "autodiff/autodiff.h"
#include "nn/nn.h"
#include "remat/remat.h"
#include "support/models.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace remat {
namespace {

nn::ModelConfig bf16_model() {
  nn::ModelConfig c = testing_support::small_model(2, false, "none");
  c.precision = nn::parse_precision("p=f32,c=bf16");
  return c;
}

// The dtypes of the operands and the result of each `op` node under `scope`, in trace order.
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
  // the softmax reads f32 scores (and the causal mask) and gives the probabilities in bf16, for the bf16 matmul
  EXPECT_EQ(dtypes(c, ir::Op::softmax, "self_attention/attention"),
            (std::vector<std::string>{"f32 bool -> bf16", "f32 bool -> bf16"}));
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "logits_dense"), (std::vector<std::string>{"bf16 bf16 -> bf16"}));
}

TEST(PrecisionKnobs, EachKnobMovesItsOwnComputation) {
  nn::ModelConfig c = bf16_model();
  c.float32_logits = false;  // q.k in f32 already: nothing casts the scores down, the softmax reads f32
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "self_attention/attention")[0], "f32 f32 -> f32");
  EXPECT_EQ(dtypes(c, ir::Op::softmax, "self_attention/attention")[0], "f32 bool -> bf16");
  c.float32_logits = true;
  c.float32_qk_product = false;  // q.k in bf16, its scores cast up: the softmax reads f32
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "self_attention/attention")[0], "bf16 bf16 -> bf16");
  EXPECT_EQ(dtypes(c, ir::Op::softmax, "self_attention/attention")[0], "f32 bool -> bf16");
  c.float32_logits = false;  // and the softmax of bf16 scores
  EXPECT_EQ(dtypes(c, ir::Op::softmax, "self_attention/attention")[0], "bf16 bool -> bf16");
  c.logits_dot_in_fp32 = true;
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "logits_dense"), (std::vector<std::string>{"f32 f32 -> f32"}));
  c.logits_via_embedding = true;  // the tied projection follows the same knob
  EXPECT_EQ(dtypes(c, ir::Op::dot_general, "logits_dense"), (std::vector<std::string>{"f32 f32 -> f32"}));
}

// The loss and every gradient, flattened (f32 master weights: f32 gradients).
std::vector<double> loss_and_grads(const nn::ModelConfig& c) {
  std::vector<int> wrt;
  for (size_t i = 0; i < nn::param_specs(c).size(); ++i) wrt.push_back(static_cast<int>(i));
  rematerialize::Decider decider;
  ir::Graph f = autodiff::grad_graph(nn::loss_graph(c, 2, 16), wrt, &decider, wrt);
  std::vector<exec::Array> args = nn::init_params(c, 3);
  std::vector<int32_t> tokens(32);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 53 + 7) % 256);
  args.push_back(exec::Array::from<int32_t>({2, 16}, tokens));
  std::rotate(tokens.begin(), tokens.begin() + 1, tokens.end());
  args.push_back(exec::Array::from<int32_t>({2, 16}, tokens));
  std::vector<double> out;
  for (const exec::Array& a : exec::run(f, args))
    for (int64_t i = 0; i < a.size(); ++i) out.push_back(a.get(i));
  return out;
}

// bf16 scores and softmax (both knobs off) against the defaults: the loss within 0.1% and the gradient
// vector within 2% (relative L2): what bf16 rounding of [B,H,T,T] scores costs on this model.
TEST(PrecisionKnobs, Bf16ScoresKeepLossAndGradientsClose) {
  nn::ModelConfig c = bf16_model();
  const std::vector<double> reference = loss_and_grads(c);
  EXPECT_NEAR(reference[0], std::log(256.0), 0.05);  // at init: about uniform over 256 bytes
  c.float32_qk_product = c.float32_logits = false;
  c.logits_dot_in_fp32 = true;
  const std::vector<double> got = loss_and_grads(c);
  ASSERT_EQ(got.size(), reference.size());
  EXPECT_NEAR(got[0], reference[0], 1e-3 * reference[0]);
  double diff = 0, norm = 0;
  for (size_t i = 1; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    diff += (got[i] - reference[i]) * (got[i] - reference[i]);
    norm += reference[i] * reference[i];
  }
  std::printf("relative gradient difference %.4f\n", std::sqrt(diff / norm));
  EXPECT_LT(std::sqrt(diff / norm), 0.02);
  EXPECT_GT(std::sqrt(diff / norm), 0.0) << "the knobs changed nothing";
}

}  // namespace
}  // namespace remat
