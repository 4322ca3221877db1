// attention: flash against dot_product on a grouped-query model: the same loss and gradients within the dtype's
// tolerance (f32: 1e-5 of the largest gradient; bf16: 3e-2), and the per-token activation bytes of the layer
// without remat have no term in T (dot_product's keep score-sized arrays).
#include "autodiff/autodiff.h"
#include "compile/compile.h"
#include "exec/exec.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
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

// The op against attention written with primitives (the model's dot_product), in f64, at sizes that cross the
// kernel's blocks (150 queries: 7 tiles of 24 rows, 3 blocks of 64 keys, causal masks inside blocks; keys and head
// dims past the key transpose's 8 x 8 blocks) and run it on several threads: the context and the gradients of q,
// k and v agree to 1e-10.
// Flash attention against its primitives (scores, mask, softmax, weighted values) over B=2, T tokens, 4 heads
// over 2 kv heads of D dims: the context and the gradients of q, k, v, each as its largest gap relative to the
// primitives' largest element. The primitives run in `dtype` (f64 or f32); flash in f64, or in bf16 from f32
// params (then converted back).
std::vector<double> gaps_to_primitives(DType dtype, bool bf16_flash, int64_t T, int64_t D, bool causal) {
  const int64_t B = 2, H = 4, KV = 2;
  const double scale = 0.35;
  ir::Graph g;
  ir::Builder b(g);
  using namespace ir;
  Tensor q = b.param("q", {dtype, {B, T, H, D}}), k = b.param("k", {dtype, {B, T, KV, D}});
  Tensor v = b.param("v", {dtype, {B, T, KV, D}}), w = b.param("w", {dtype, {B, T, H, D}});
  auto repeat = [&](Tensor x) { return reshape(broadcast_in_dim(x, {B, T, KV, H / KV, D}, {0, 1, 2, 4}), {B, T, H, D}); };
  Tensor scores = dot_general(q, repeat(k), DotDims{{3}, {3}, {0, 2}, {0, 2}}) * scale;  // [B,H,T,S]
  if (causal) {
    Tensor visible = compare(iota(b, DType::i32, {B, H, T, T}, 3), iota(b, DType::i32, {B, H, T, T}, 2), "le");
    scores = select(visible, scores, full(b, scores.type(), -std::numeric_limits<double>::infinity()));
  }
  Tensor primitive = transpose(dot_general(softmax(scores), repeat(v), DotDims{{3}, {1}, {0, 1}, {0, 2}}), {0, 2, 1, 3});
  auto low = [&](Tensor x) { return bf16_flash ? convert(x, DType::bf16) : x; };
  Tensor fused = attention(low(q), low(k), low(v), causal, scale)[0];
  if (bf16_flash) fused = convert(fused, dtype);
  // Two losses, one per formulation; the gradients of each with respect to q, k, v.
  Tensor loss_p = reduce_sum(primitive * w, {0, 1, 2, 3}), loss_f = reduce_sum(fused * w, {0, 1, 2, 3});
  const std::vector<ValueId> gp = autodiff::grad(g, loss_p.id, std::array{q.id, k.id, v.id});
  const std::vector<ValueId> gf = autodiff::grad(g, loss_f.id, std::array{q.id, k.id, v.id});
  b.result(primitive);
  b.result(fused);
  for (size_t i = 0; i < 3; ++i) b.result(b.wrap(gp[i])), b.result(b.wrap(gf[i]));
  std::vector<exec::Array> args;
  std::mt19937 rng(causal ? 1 : 2);
  std::uniform_real_distribution<double> dist(-1, 1);
  for (ValueId p : g.params) {
    args.emplace_back(g.type(p));
    for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, dist(rng));
  }
  const std::vector<exec::Array> out = exec::run(g, args);
  std::vector<double> gaps;
  for (size_t r = 0; r < out.size(); r += 2) {
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < out[r].size(); ++i) {
      worst = std::max(worst, std::abs(out[r].get(i) - out[r + 1].get(i)));
      largest = std::max(largest, std::abs(out[r].get(i)));
    }
    EXPECT_GT(largest, 0);
    gaps.push_back(worst / largest);
  }
  return gaps;
}

TEST(FlashAttention, EqualsThePrimitivesAcrossBlocksInF64) {
  for (bool causal : {true, false}) {
    const std::vector<double> gaps = gaps_to_primitives(DType::f64, false, 150, 12, causal);
    for (size_t r = 0; r < gaps.size(); ++r) EXPECT_LE(gaps[r], 1e-10) << (causal ? "causal " : "") << "result " << r;
  }
}

// bf16 flash with wide heads (its key gradients leave their accumulator in chunks of fewer keys than a block)
// over 150 tokens (a partial last block), within bf16's tolerance of the f32 primitives.
TEST(FlashAttention, Bf16WithWideHeadsIsWithinItsToleranceOfThePrimitives) {
  for (int64_t D : {128, 256}) {
    const std::vector<double> gaps = gaps_to_primitives(DType::f32, true, 150, D, true);
    for (size_t r = 0; r < gaps.size(); ++r) EXPECT_LE(gaps[r], 3e-2) << "head_dim " << D << ", result " << r;
  }
}

// Saving the context (minimal_with_context) saves the kernel's residuals with it — the context and its
// log-sum-exp carry the name — so the backward does not run the attention again; under full it does, once.
TEST(FlashAttention, SavingTheContextSavesTheAttention) {
  for (const auto& [policy, runs_per_layer] : {std::pair{"minimal_with_context", 1}, std::pair{"full", 2}}) {
    const compile::Compiled c =
        compile::compile({.model = model(true, false, policy), .shape = {2, 16, 1}, .kind = compile::Kind::grads});
    uint64_t origin = 0;
    std::function<void(const ir::Graph&)> find = [&](const ir::Graph& g) {
      for (const ir::Node& n : g.nodes) {
        if (n.op == ir::Op::attention && !n.recomputed) origin = n.origin;
        if (n.body) find(*n.body);
      }
    };
    find(c.program);
    ASSERT_NE(origin, 0u) << policy;
    EXPECT_EQ(c.explanation.runs.at(origin), 2 * runs_per_layer) << policy << ": 2 layers";
  }
}

}  // namespace
}  // namespace remat
