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

// Steps of a micro model in f16 with loss scaling; arguments and results found by name in the signature.
struct ScaledSteps {
  nn::ModelConfig model = testing_support::micro_model(1, true, "full");
  train::OptimizerConfig opt;
  train::Program program;
  std::vector<exec::Array> args;  // in the signature's order

  ScaledSteps(int64_t period, double min_scale) {
    model.precision = nn::parse_precision("p=f32,c=f16");
    opt.loss_scale.enabled = true;
    opt.loss_scale.period = period;
    opt.loss_scale.min_scale = min_scale;
    program = train::step_program(model, {1, 4, 1}, opt);
    std::vector<exec::Array> params = nn::init_params(model, 3);
    for (size_t i = 0; i < program.signature.args.size(); ++i) {
      const ir::Slot& a = program.signature.args[i];
      const ir::Type& type = program.graph.type(program.graph.params[i]);
      args.push_back(a.role == ir::Role::parameter ? params[i] : exec::Array::zeros(type));
    }
    arg("inputs") = exec::Array::from<int32_t>({1, 1, 4}, {1, 2, 3, 4});
    arg("targets") = exec::Array::from<int32_t>({1, 1, 4}, {2, 3, 4, 5});
  }
  exec::Array& arg(std::string_view name) { return args[static_cast<size_t>(program.signature.arg(name))]; }
  double result(std::string_view name) const { return out[static_cast<size_t>(program.signature.result(name))].get(0); }
  std::vector<exec::Array> out;  // the last step's results
  std::vector<size_t> weights_and_moments() const {
    std::vector<size_t> is;
    for (size_t i = 0; i < args.size(); ++i)
      if (program.signature.args[i].role == ir::Role::parameter || program.signature.args[i].role == ir::Role::optimizer_state)
        is.push_back(i);
    return is;
  }

  // One step at `scale`; returns (new scale, new count, finite) and feeds every updated value forward.
  std::tuple<double, double, double> step(double scale) {
    arg("loss_scale").set(0, scale);
    out = exec::run(program.graph, args);
    for (auto [r, a] : program.signature.updates()) args[static_cast<size_t>(a)] = out[static_cast<size_t>(r)];
    return {result("loss_scale"), result("loss_scale_count"), result("finite")};
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
  EXPECT_EQ(r.result("loss"), other.result("loss"));
  EXPECT_EQ(r.result("grad_norm"), other.result("grad_norm"));
  EXPECT_GT(r.result("grad_norm"), 0.0);
  for (size_t i : r.weights_and_moments()) EXPECT_TRUE(same_bytes(r.args[i], other.args[i])) << "argument " << i;
  // 1e30 * loss overflows f16 in the backward: every update is skipped, the scale halves, the count resets.
  std::vector<exec::Array> kept;
  for (size_t i : r.weights_and_moments()) kept.push_back(r.args[i].clone());
  std::tie(scale, count, finite) = r.step(1e30);
  EXPECT_EQ(finite, 0.0);
  EXPECT_EQ(scale, f32(f32(1e30) / 2));
  EXPECT_EQ(count, 0.0);
  for (size_t i : r.weights_and_moments())
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
