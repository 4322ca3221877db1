// The learning-rate schedule has one definition, the ops the step graph traces (train::learning_rate); the
// trainer prints the step's `lr` result. Here it is run against its closed form over a whole schedule: linear
// warmup to the peak, the cosine from the peak through its midpoint to the final fraction, flat after. (The
// step's `lr` also matches PyTorch's over five steps: reference_test.cpp.)
#include "exec/exec.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

namespace remat {
namespace {

using namespace ir;

train::OptimizerConfig schedule(double peak, int64_t warmup, int64_t steps, double final_fraction) {
  train::OptimizerConfig o;
  o.learning_rate = peak;
  o.warmup_steps = warmup;
  o.schedule_steps = steps;
  o.final_lr_fraction = final_fraction;
  return o;
}

double lr_at(const train::OptimizerConfig& o, int32_t step) {
  Graph g;
  Builder b(g);
  b.result(train::learning_rate(b, o, b.param("step", {DType::i32, {}})));
  const std::vector<exec::Array> args = {exec::Array::from<int32_t>({}, {step})};
  return exec::run(g, args)[0].get(0);
}

TEST(LearningRate, WarmsUpLinearlyThenFollowsTheCosineToTheFinalFraction) {
  const train::OptimizerConfig o = schedule(3e-4, 10, 110, 0.1);
  const double peak = 3e-4, low = 3e-5, tolerance = 1e-6 * peak;  // f32 arithmetic
  for (int32_t s = 0; s < 10; ++s) EXPECT_NEAR(lr_at(o, s), peak * (s + 1) / 10, tolerance) << "warmup step " << s;
  EXPECT_NEAR(lr_at(o, 10), peak, tolerance) << "the cosine starts at the peak";
  EXPECT_NEAR(lr_at(o, 60), (peak + low) / 2, tolerance) << "halfway through the decay";
  double before = peak;
  for (int32_t s = 10; s <= 110; ++s) {
    const double want = low + (peak - low) / 2 * (1 + std::cos(std::numbers::pi * (s - 10) / 100)), got = lr_at(o, s);
    EXPECT_NEAR(got, want, tolerance) << "decay step " << s;
    EXPECT_LE(got, before) << "decay step " << s;
    before = got;
  }
  for (int32_t s : {110, 111, 1000}) EXPECT_NEAR(lr_at(o, s), low, tolerance) << "after the schedule, step " << s;
}

TEST(LearningRate, WithoutWarmupStartsAtThePeak) {
  const train::OptimizerConfig o = schedule(1e-3, 0, 4, 0);
  EXPECT_NEAR(lr_at(o, 0), 1e-3, 1e-9);
  EXPECT_NEAR(lr_at(o, 2), 5e-4, 1e-9);
  EXPECT_NEAR(lr_at(o, 4), 0, 1e-9);
}

}  // namespace
}  // namespace remat
