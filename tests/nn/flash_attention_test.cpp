// attention: flash against dot_product on a grouped-query model: the same loss and gradients within the dtype's
// tolerance (f32: 1e-5 of the largest gradient; bf16: 3e-2), and the per-token activation bytes of the layer
// without remat have no term in T (dot_product's keep score-sized arrays).
#include "compile/compile.h"
#include "exec/exec.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace remat {
namespace {

nn::ModelConfig model(bool flash, bool bf16, const std::string& policy = "full") {
  nn::ModelConfig c = testing_support::small_model(2, true, policy);  // 4 query heads over 2 kv heads
  c.flash_attention = flash;
  if (bf16) c.precision = nn::parse_precision("p=f32,c=bf16");
  return c;
}

// Loss and gradients for one batch of random tokens, from the same initial weights.
std::vector<exec::Array> grads(const nn::ModelConfig& c) {
  const ir::Graph g = train::grads_program(c, {2, 24, 1}, nullptr).graph;
  std::vector<exec::Array> args = nn::init_params(c, 5);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, 255);
  for (int k = 0; k < 2; ++k) {
    exec::Array tokens = exec::Array::zeros({DType::i32, {1, 2, 24}});
    for (int64_t i = 0; i < tokens.size(); ++i) tokens.data<int32_t>()[i] = tok(rng);
    args.push_back(tokens);
  }
  return exec::run(g, args);
}

class FlashAttention : public testing::TestWithParam<bool> {};

TEST_P(FlashAttention, SameLossAndGradientsAsDotProduct) {
  const bool bf16 = GetParam();
  const std::vector<exec::Array> want = grads(model(false, bf16)), got = grads(model(true, bf16));
  ASSERT_EQ(want.size(), got.size());
  const double tolerance = bf16 ? 3e-2 : 1e-5;
  EXPECT_NEAR(got[0].get(0), want[0].get(0), tolerance * std::abs(want[0].get(0))) << "loss";
  for (size_t r = 1; r < want.size(); ++r) {
    double largest = 0, worst = 0;
    for (int64_t i = 0; i < want[r].size(); ++i) {
      largest = std::max(largest, std::abs(want[r].get(i)));
      worst = std::max(worst, std::abs(got[r].get(i) - want[r].get(i)));
    }
    EXPECT_LE(worst, tolerance * largest) << "gradient " << r;
    EXPECT_GT(largest, 0) << "gradient " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlashAttention, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "bf16" : "f32"; });

// Activation bytes saved per step when every residual is saved (everything_saveable), at T and 2T tokens: flash's
// are linear in T (q, k, v, the context and the log-sum-exp per token), dot_product's grow faster (scores and
// probabilities, T per token).
double saved(bool flash, int64_t seq) {
  compile::Request r{.model = model(flash, false, "everything_saveable"), .shape = {2, seq, 1}, .kind = compile::Kind::grads};
  r.plan = false;
  return compile::compile(r).explanation.saved_bytes();
}

TEST(FlashAttention, SavedBytesPerTokenHaveNoTermInT) {
  EXPECT_EQ(saved(true, 64), 2 * saved(true, 32));
  EXPECT_GT(saved(false, 64), 2 * saved(false, 32));
  EXPECT_LT(saved(true, 64), saved(false, 64));
}

}  // namespace
}  // namespace remat
