// packing=false (nn::ModelConfig::padded_targets): targets < 0 are padding and the loss is the mean over the
// others. Checked against an independent route: each sequence run alone, cut to its real targets, without
// padding (causal attention: a position never sees the padding after it), its loss and gradients weighted by its
// number of targets. In f64 (the logits and the loss are f32 in every precision: to f32's rounding), untiled and
// tiled (num_vocab_tiling), dot_product and flash attention.
#include "exec/exec.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <random>

namespace remat {
namespace {

constexpr int64_t kSeq = 16;

nn::ModelConfig model(bool padded, int64_t tiles, bool flash) {
  nn::ModelConfig c = testing_support::small_model(2, true, "full");
  c.precision = nn::parse_precision("f64");
  c.padded_targets = padded;
  c.num_vocab_tiling = tiles;
  c.flash_attention = flash;
  return c;
}

// Loss and gradients of one microbatch of `rows` (inputs, targets), each row `seq` tokens, from the same weights.
std::vector<exec::Array> grads(const nn::ModelConfig& c, const std::vector<std::vector<int32_t>>& inputs,
                               const std::vector<std::vector<int32_t>>& targets, int64_t seq) {
  const auto rows = static_cast<int64_t>(inputs.size());
  const ir::Graph g = train::grads_program(c, {rows, seq, 1}, nullptr).graph;
  std::vector<exec::Array> args = nn::init_params(c, 5);
  for (const auto* batch : {&inputs, &targets}) {
    exec::Array a = exec::Array::zeros({DType::i32, {1, rows, seq}});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < seq; ++t) a.data<int32_t>()[r * seq + t] = (*batch)[static_cast<size_t>(r)][static_cast<size_t>(t)];
    args.push_back(a);
  }
  return exec::run(g, args);
}

// Every result of `got` within `tolerance` of `want`, relative to the largest magnitude of the result.
void expect_close(const std::vector<double>& want, const exec::Array& got, double tolerance, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(want.size()), got.size()) << what;
  double largest = 0, worst = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    largest = std::max(largest, std::abs(want[static_cast<size_t>(i)]));
    worst = std::max(worst, std::abs(got.get(i) - want[static_cast<size_t>(i)]));
  }
  EXPECT_GT(largest, 0) << what;
  EXPECT_LE(worst, tolerance * largest) << what;
}

TEST(PaddedTargets, TheLossAndGradientsAreEachSequencesAloneWeightedByItsTargets) {
  const std::vector<int64_t> real = {9, 16, 3};  // real targets of each row; the rest are padding (-1)
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, 255);
  std::vector<std::vector<int32_t>> inputs, targets;
  for (int64_t n : real) {
    std::vector<int32_t> in(kSeq), tg(kSeq, -1);
    for (int32_t& x : in) x = tok(rng);  // padding inputs too: nothing real may depend on them
    for (int64_t t = 0; t < n; ++t) tg[static_cast<size_t>(t)] = tok(rng);
    inputs.push_back(in);
    targets.push_back(tg);
  }
  for (bool flash : {false, true}) {
    for (int64_t tiles : {1, 4}) {
      const std::string what = fmt::format("{}, {} tiles", flash ? "flash" : "dot_product", tiles);
      const std::vector<exec::Array> padded = grads(model(true, tiles, flash), inputs, targets, kSeq);
      std::vector<std::vector<double>> want(padded.size());
      for (size_t r = 0; r < padded.size(); ++r) want[r].assign(static_cast<size_t>(padded[r].size()), 0.0);
      const double total = static_cast<double>(real[0] + real[1] + real[2]);
      for (size_t row = 0; row < real.size(); ++row) {
        const int64_t n = real[row];
        const std::vector<std::vector<int32_t>> in{{inputs[row].begin(), inputs[row].begin() + n}};
        const std::vector<std::vector<int32_t>> tg{{targets[row].begin(), targets[row].begin() + n}};
        const std::vector<exec::Array> alone = grads(model(false, 1, flash), in, tg, n);
        ASSERT_EQ(alone.size(), padded.size());
        for (size_t r = 0; r < alone.size(); ++r)
          for (int64_t i = 0; i < alone[r].size(); ++i)
            want[r][static_cast<size_t>(i)] += alone[r].get(i) * static_cast<double>(n) / total;
      }
      for (size_t r = 0; r < padded.size(); ++r) expect_close(want[r], padded[r], 1e-6, what + fmt::format(", result {}", r));
    }
  }
}

TEST(PaddedTargets, AMicrobatchOfPaddingAloneHasLossAndGradientsZero) {
  const std::vector<std::vector<int32_t>> inputs{std::vector<int32_t>(kSeq, 65)}, targets{std::vector<int32_t>(kSeq, -1)};
  for (const exec::Array& r : grads(model(true, 1, false), inputs, targets, kSeq))
    for (int64_t i = 0; i < r.size(); ++i) ASSERT_EQ(r.get(i), 0.0);
}

}  // namespace
}  // namespace remat
