#include "cli/commands.h"

#include "autodiff/autodiff.h"
#include "exec/executable.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

namespace remat::cli {
namespace {

using namespace ir;

constexpr int64_t kIn = 16, kHidden = 64, kBatch = 256, kEval = 2048;

struct Task {
  std::vector<float> a, b;  // target directions
  std::mt19937_64 rng;
  exec::Array x(int64_t n) {
    std::normal_distribution<float> d(0, 1);
    exec::Array out({DType::f32, {n, kIn}});
    for (int64_t i = 0; i < out.size(); ++i) out.data<float>()[i] = d(rng);
    return out;
  }
  exec::Array y(const exec::Array& x) const {
    int64_t n = x.type().shape[0];
    exec::Array out({DType::f32, {n, 1}});
    for (int64_t r = 0; r < n; ++r) {
      float pa = 0, pb = 0;
      for (int64_t c = 0; c < kIn; ++c) {
        pa += x.data<float>()[r * kIn + c] * a[static_cast<size_t>(c)];
        pb += x.data<float>()[r * kIn + c] * b[static_cast<size_t>(c)];
      }
      out.data<float>()[r] = std::sin(pa) + 0.5f * std::cos(pb);
    }
    return out;
  }
};

// loss(params, x, y) = mean((mlp(x) - y)^2); params are w1, b1, w2, b2, w3.
Graph loss_graph(int64_t batch) {
  Graph g;
  g.name = "mlp_loss";
  Builder b(g);
  Tensor w1 = b.param("w1", {DType::f32, {kIn, kHidden}});
  Tensor b1 = b.param("b1", {DType::f32, {kHidden}});
  Tensor w2 = b.param("w2", {DType::f32, {kHidden, kHidden}});
  Tensor b2 = b.param("b2", {DType::f32, {kHidden}});
  Tensor w3 = b.param("w3", {DType::f32, {kHidden, 1}});
  Tensor x = b.param("x", {DType::f32, {batch, kIn}});
  Tensor y = b.param("y", {DType::f32, {batch, 1}});
  Tensor h;
  {
    auto s = b.scope("layer1");
    h = tanh(matmul(x, w1) + b1);
  }
  {
    auto s = b.scope("layer2");
    h = tanh(matmul(h, w2) + b2);
  }
  auto s = b.scope("loss");
  b.result(mean(square(matmul(h, w3) - y), {0, 1}));
  return g;
}

// One training step as one graph: (params, velocities, x, y) -> (loss, new params, new velocities).
Graph step_graph(double lr) {
  const int kParams = 5;
  std::vector<int> wrt(kParams);
  for (int i = 0; i < kParams; ++i) wrt[static_cast<size_t>(i)] = i;
  Graph g = autodiff::grad_graph(loss_graph(kBatch), wrt);
  g.name = "mlp_step";
  Builder b(g);
  auto s = b.scope("sgd_momentum");
  std::vector<ValueId> new_params, new_velocity;
  for (int i = 0; i < kParams; ++i) {
    Tensor p = b.wrap(g.params[static_cast<size_t>(i)]);
    Tensor v = b.param("v_" + g.param_names[static_cast<size_t>(i)], p.type());
    Tensor grad = b.wrap(g.results[static_cast<size_t>(1 + i)]);
    Tensor v2 = v * 0.9 + grad;
    new_velocity.push_back(v2.id);
    new_params.push_back((p - v2 * lr).id);
  }
  g.results.resize(1);
  g.results.insert(g.results.end(), new_params.begin(), new_params.end());
  g.results.insert(g.results.end(), new_velocity.begin(), new_velocity.end());
  // Param order: w1 b1 w2 b2 w3 x y v_w1 ... v_w3; move the velocities before x, y.
  std::rotate(g.params.begin() + kParams, g.params.begin() + kParams + 2, g.params.end());
  std::rotate(g.param_names.begin() + kParams, g.param_names.begin() + kParams + 2, g.param_names.end());
  dce(g);
  verify(g);
  return g;
}

}  // namespace

int run_demo(const DemoOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> unit(0, 1);
  Task task;
  for (int64_t i = 0; i < kIn; ++i) {
    task.a.push_back(unit(rng) * 0.4f);
    task.b.push_back(unit(rng) * 0.4f);
  }
  task.rng.seed(o.seed + 1);
  // Planned once: the step writes new parameters and velocities (results 1..10) into its own argument
  // buffers (0..9); evaluation reads those parameters, in the step's arena where its plan fits.
  Graph step_g = step_graph(o.learning_rate), eval_g = loss_graph(kEval);
  std::vector<std::pair<int, int>> donate;
  for (int i = 0; i < 10; ++i) donate.emplace_back(1 + i, i);
  plan::Plan step_plan = plan::build(step_g, {.donate = donate, .workspace = exec::workspace_of(exec::cpu())});
  for (auto [result, arg] : donate) ASSERT(step_plan.donated_param[static_cast<size_t>(result)] == arg);
  plan::Plan eval_plan = plan::build(eval_g, {.workspace = exec::workspace_of(exec::cpu())});
  exec::Executable step(std::move(step_g), std::move(step_plan));
  exec::Executable eval(std::move(eval_g), std::move(eval_plan), {}, &step);
  std::vector<exec::Array>& args = step.own_arguments();
  for (size_t i = 0; i < 5; ++i) {  // weights: normal / sqrt(fan_in); biases and velocities: zero
    const Shape& s = args[i].type().shape;
    if (s.size() != 2) continue;
    float scale = 1.0f / std::sqrt(static_cast<float>(s[0]));
    for (int64_t k = 0; k < args[i].size(); ++k) args[i].data<float>()[k] = unit(rng) * scale;
  }
  std::map<int, exec::Array> weights;
  for (int i = 0; i < 5; ++i) weights.emplace(i, args[static_cast<size_t>(i)]);
  std::vector<exec::Array>& eval_args = eval.own_arguments(weights);
  exec::Array eval_x = task.x(kEval), eval_y = task.y(eval_x);
  std::memcpy(eval_args[5].bytes(), eval_x.bytes(), static_cast<size_t>(eval_x.type().bytes()));
  std::memcpy(eval_args[6].bytes(), eval_y.bytes(), static_cast<size_t>(eval_y.type().bytes()));
  auto eval_loss = [&] { return eval.run()[0].get(0); };
  double variance = 0, mean_y = 0;
  for (int64_t i = 0; i < kEval; ++i) mean_y += eval_y.get(i) / kEval;
  for (int64_t i = 0; i < kEval; ++i) variance += (eval_y.get(i) - mean_y) * (eval_y.get(i) - mean_y) / kEval;
  fmt::print("demo: MLP {}-{}-{}-1 on y = sin(x.a) + 0.5 cos(x.b); batch {}, {} steps, lr {}\n", kIn, kHidden,
             kHidden, kBatch, o.steps, o.learning_rate);
  fmt::print("held-out MSE before training {:.4f} (target variance {:.4f})\n", eval_loss(), variance);
  auto start = std::chrono::steady_clock::now();
  double loss = 0;
  for (int s = 1; s <= o.steps; ++s) {
    exec::Array x = task.x(kBatch), y = task.y(x);
    std::memcpy(args[10].bytes(), x.bytes(), static_cast<size_t>(x.type().bytes()));
    std::memcpy(args[11].bytes(), y.bytes(), static_cast<size_t>(y.type().bytes()));
    loss = step.run()[0].get(0);
    if (s % 50 == 0 || s == o.steps) {
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      fmt::print("step {:4d}/{}  train MSE {:.4f}  {:.2f} ms/step\n", s, o.steps, loss, ms / s);
    }
  }
  double final_eval = eval_loss();
  fmt::print("held-out MSE after training {:.4f} ({:.1f}% of the target variance)\n", final_eval,
             100 * final_eval / variance);
  return std::isfinite(final_eval) ? 0 : 1;
}

}  // namespace remat::cli
