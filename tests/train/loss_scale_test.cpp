// Dynamic loss scaling (jmp's DynamicLossScale) in the f16 training step: a finite step updates and
// counts, a step whose scaled gradients overflow is skipped (parameters and moments kept bit for bit) and
// backs the scale off, and `period` finite steps in a row grow it.
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <cstring>

namespace remat {
namespace {

double f32(double x) { return static_cast<float>(x); }  // the scale is an f32 value

struct ScaledSteps {
  nn::ModelConfig model = testing_support::micro_model(1, true, "full");
  train::OptimizerConfig opt;
  ir::Graph graph;
  std::vector<exec::Array> args;
  size_t np = 0;

  ScaledSteps(int64_t period, double min_scale) {
    model.precision = nn::parse_precision("p=f32,c=f16");
    opt.loss_scale.enabled = true;
    opt.loss_scale.period = period;
    opt.loss_scale.min_scale = min_scale;
    graph = train::step_program(model, {1, 4, 1}, opt).graph;
    args = nn::init_params(model, 3);
    np = args.size();
    for (size_t i = 0; i < 2 * np; ++i) args.push_back(exec::Array::zeros(args[i % np].type()));
    args.push_back(exec::Array::from<int32_t>({}, {0}));
    args.push_back(exec::Array::zeros({DType::f32, {}}));  // loss_scale, set per step
    args.push_back(exec::Array::from<int32_t>({}, {0}));   // loss_scale_count
    args.push_back(exec::Array::from<int32_t>({1, 1, 4}, {1, 2, 3, 4}));
    args.push_back(exec::Array::from<int32_t>({1, 1, 4}, {2, 3, 4, 5}));
  }
  std::vector<exec::Array> out;  // the last step's results: loss, grad_norm, lr, params', m', v', scale state

  // One step at `scale`; returns (new scale, new count, finite) and feeds the state forward.
  std::tuple<double, double, double> step(double scale) {
    args[3 * np + 1].set(0, scale);
    out = exec::run(graph, args);
    const size_t base = 3 + 3 * np;
    for (size_t i = 0; i < 3 * np; ++i) args[i] = out[3 + i];
    args[3 * np + 2] = out[base + 1];
    return {out[base].get(0), out[base + 1].get(0), out[base + 2].get(0)};
  }
};

bool same_bytes(const exec::Array& a, const exec::Array& b) {
  return a.type() == b.type() && std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())) == 0;
}

TEST(LossScale, FiniteStepUpdatesOverflowIsSkippedAndBacksOff) {
  ScaledSteps r(2000, 1), other(2000, 1);
  exec::Array before = r.args[0].clone();
  auto [scale, count, finite] = r.step(4096.0);
  EXPECT_EQ(finite, 1.0);
  EXPECT_EQ(scale, 4096.0);
  EXPECT_EQ(count, 1.0);
  EXPECT_FALSE(same_bytes(before, r.args[0])) << "a finite step updates the parameters";
  // Scaling by a power of two and unscaling is exact while no f16 gradient overflows or becomes subnormal:
  // the same step at 8192 gives the same loss, gradient norm and bit-identical parameters and moments.
  // (At 2048 and below a few key-kernel gradients of this model are f16 subnormals and lose bits, so the
  // moments differ in their last bits: what loss scaling is for.)
  other.step(8192.0);
  EXPECT_EQ(r.out[0].get(0), other.out[0].get(0)) << "loss";
  EXPECT_EQ(r.out[1].get(0), other.out[1].get(0)) << "gradient norm";
  EXPECT_GT(r.out[1].get(0), 0.0);
  for (size_t i = 0; i < 3 * r.np; ++i) EXPECT_TRUE(same_bytes(r.args[i], other.args[i])) << "argument " << i;
  // 1e30 * loss overflows f16 in the backward: every update is skipped, the scale halves, the count resets.
  std::vector<exec::Array> kept;
  for (size_t i = 0; i < 3 * r.np; ++i) kept.push_back(r.args[i].clone());
  std::tie(scale, count, finite) = r.step(1e30);
  EXPECT_EQ(finite, 0.0);
  EXPECT_EQ(scale, f32(f32(1e30) / 2));
  EXPECT_EQ(count, 0.0);
  for (size_t i = 0; i < 3 * r.np; ++i)
    EXPECT_EQ(std::memcmp(kept[i].bytes(), r.args[i].bytes(), static_cast<size_t>(kept[i].type().bytes())), 0) << i;
}

TEST(LossScale, GrowsAfterPeriodFiniteStepsAndNeverBelowTheFloor) {
  ScaledSteps r(2, 1);
  auto [s1, c1, f1] = r.step(256.0);
  EXPECT_EQ(std::tuple(s1, c1, f1), std::tuple(256.0, 1.0, 1.0));
  auto [s2, c2, f2] = r.step(s1);
  EXPECT_EQ(std::tuple(s2, c2, f2), std::tuple(512.0, 0.0, 1.0));  // the second finite step in a row grows it
  ScaledSteps floor(2000, 1e30);
  auto [s3, c3, f3] = floor.step(1e30);  // overflows: backs off to max(1e30 / 2, 1e30)
  EXPECT_EQ(std::tuple(s3, c3, f3), std::tuple(f32(1e30), 0.0, 0.0));
}

}  // namespace
}  // namespace remat
