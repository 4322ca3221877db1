// num_vocab_tiling (MaxText's key; it chunks the tokens): the output projection and cross-entropy scanned over
// chunks of the batch's tokens. Against the untiled head (one [B,T,V] logits array, an independent route): the
// same loss and gradients in f64 (to rounding), tied and untied, in bf16 within its tolerance; no value of the
// compiled step holds more than one chunk's logits; a tiling that does not divide the tokens is refused.
#include "compile/compile.h"
#include "exec/exec.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

namespace remat {
namespace {

constexpr int64_t kBatch = 2, kSeq = 24;

nn::ModelConfig model(int64_t tiles, const std::string& precision, bool tied = false) {
  nn::ModelConfig c = testing_support::small_model(2, true, "full");
  c.precision = nn::parse_precision(precision);
  c.logits_via_embedding = tied;
  c.num_vocab_tiling = tiles;
  return c;
}

// Loss and gradients for one batch of random tokens, from the same initial weights.
std::vector<exec::Array> grads(const nn::ModelConfig& c) {
  const ir::Graph g = train::grads_program(c, {kBatch, kSeq, 1}, nullptr).graph;
  std::vector<exec::Array> args = nn::init_params(c, 5);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> tok(0, 255);
  for (int k = 0; k < 2; ++k) {
    exec::Array tokens = exec::Array::zeros({DType::i32, {1, kBatch, kSeq}});
    for (int64_t i = 0; i < tokens.size(); ++i) tokens.data<int32_t>()[i] = tok(rng);
    args.push_back(tokens);
  }
  return exec::run(g, args);
}

// Every result of `got` within `tolerance` of the largest magnitude of the same result in `want`; the loss
// (result 0, a sum of f32 log-probabilities whatever the dtype, summed chunk by chunk) within `loss_tolerance`.
void expect_close(const std::vector<exec::Array>& want, const std::vector<exec::Array>& got, double tolerance,
                  double loss_tolerance, const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  EXPECT_NEAR(got[0].get(0), want[0].get(0), loss_tolerance * std::abs(want[0].get(0))) << what << ": the loss";
  for (size_t r = 1; r < want.size(); ++r) {
    double largest = 0, worst = 0;
    for (int64_t i = 0; i < want[r].size(); ++i) {
      largest = std::max(largest, std::abs(want[r].get(i)));
      worst = std::max(worst, std::abs(got[r].get(i) - want[r].get(i)));
    }
    EXPECT_LE(worst, tolerance * largest) << what << ": gradient " << r;
    EXPECT_GT(largest, 0) << what << ": result " << r;
  }
}

TEST(VocabTiling, SameLossAndGradientsAsTheUntiledHead) {
  for (bool tied : {false, true}) {
    const std::vector<exec::Array> want = grads(model(1, "f64", tied));
    for (int64_t tiles : {2, 3, 48})  // 48: one token per chunk
      expect_close(want, grads(model(tiles, "f64", tied)), 1e-12, 1e-6,
                   fmt::format("f64, {} tiles{}", tiles, tied ? ", tied" : ""));
  }
  expect_close(grads(model(1, "p=f32,c=bf16")), grads(model(4, "p=f32,c=bf16")), 2e-2, 1e-6, "bf16, 4 tiles");
}

// The largest number of elements of any value whose last dimension is the vocabulary, the output kernel and its
// gradient ([D,V]) aside, over the step's graph and every body in it.
int64_t largest_vocab_value(const nn::ModelConfig& c) {
  const compile::Compiled s = compile::compile({.model = c, .shape = {kBatch, kSeq, 1}, .kind = compile::Kind::train_step});
  int64_t largest = 0;
  std::function<void(const ir::Graph&)> walk = [&](const ir::Graph& g) {
    for (const ir::Node& n : g.nodes) {
      for (ir::ValueId v : n.outputs) {
        const ir::Type& t = g.type(v);
        if (!t.shape.empty() && t.shape.back() == c.vocab_size && t.shape != ir::Shape{c.emb_dim, c.vocab_size})
          largest = std::max(largest, t.num_elements());
      }
      if (n.body) walk(*n.body);
    }
  };
  walk(s.program);
  return largest;
}

TEST(VocabTiling, NoValueHoldsMoreThanOneChunksLogits) {
  const int64_t tokens = kBatch * kSeq, vocab = model(1, "f32").vocab_size;
  EXPECT_EQ(largest_vocab_value(model(1, "f32")), tokens * vocab);  // untiled: the [B,T,V] logits
  EXPECT_EQ(largest_vocab_value(model(4, "f32")), tokens / 4 * vocab);
  EXPECT_EQ(largest_vocab_value(model(4, "p=f32,c=bf16")), tokens / 4 * vocab);
  EXPECT_EQ(largest_vocab_value(model(4, "f32", true)), tokens / 4 * vocab);  // tied: the embedding is [V,D]
}

// Where the logits are the largest arrays (vocabulary 8192, D = 32, 2 x 96 tokens: the bf16 logits are 3 MiB —
// the loss reads them in f32 without an f32 copy, target_log_prob — the vocabulary's parameters and their gradients
// 1 MiB each), the planned peak drops by more than three quarters of one [B,T,V] logits array with 4 tiles.
TEST(VocabTiling, LowersThePeakWhereTheLogitsAreTheLargestArrays) {
  constexpr int64_t kLongSeq = 96;
  auto peak = [](int64_t tiles) {
    nn::ModelConfig c = model(tiles, "p=f32,c=bf16");
    c.vocab_size = 8192;
    return compile::compile({.model = c, .shape = {kBatch, kLongSeq, 1}, .kind = compile::Kind::train_step})
        .plan.lower_bound[0];
  };
  const int64_t untiled = peak(1), tiled = peak(4), logits = kBatch * kLongSeq * 8192 * 2;
  EXPECT_LT(tiled, untiled - logits * 3 / 4) << "untiled " << untiled << " B, 4 tiles " << tiled << " B";
}

TEST(VocabTiling, ATilingThatDoesNotDivideTheTokensIsRefused) {
  try {
    grads(model(5, "f32"));
    FAIL() << "5 tiles of 48 tokens accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("'num_vocab_tiling' (5) must divide the tokens of one microbatch on one "
                                         "device (batch 2 x sequence 24 = 48)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace remat
