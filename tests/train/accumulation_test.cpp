// Gradient accumulation over k microbatches equals one batch k times as large: same tokens, same mean.
// Tolerance: |accumulated - single| <= 1e-5 * max|single| per tensor (the sums run in a different order).
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <random>

namespace remat {
namespace {

TEST(Accumulation, FourMicrobatchesMatchOneBigBatch) {
  nn::ModelConfig m = testing_support::small_model(2, true, "full");
  const int64_t k = 4, B = 2, T = 16;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, 255);
  std::vector<int32_t> in(static_cast<size_t>(k * B * T)), tg(in.size());
  for (auto& x : in) x = tok(rng);
  for (auto& x : tg) x = tok(rng);
  std::vector<exec::Array> params = nn::init_params(m, 3);
  auto run = [&](train::StepShape shape) {
    std::vector<exec::Array> args = params;
    args.push_back(exec::Array::from<int32_t>({shape.accumulation, shape.batch, T}, in));
    args.push_back(exec::Array::from<int32_t>({shape.accumulation, shape.batch, T}, tg));
    return exec::run(train::grads_program(m, shape).graph, args);
  };
  std::vector<exec::Array> acc = run({B, T, k}), one = run({k * B, T, 1});
  ASSERT_EQ(acc.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    double scale = 0;
    for (int64_t j = 0; j < one[i].size(); ++j) scale = std::max(scale, std::abs(one[i].get(j)));
    for (int64_t j = 0; j < one[i].size(); ++j)
      ASSERT_NEAR(acc[i].get(j), one[i].get(j), 1e-5 * scale) << "result " << i << " element " << j;
  }
}

}  // namespace
}  // namespace remat
