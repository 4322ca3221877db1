// The optimizer's fused ops against the primitives they replace, bit for bit: adamw against the AdamW formula
// written with mul/add/div/sqrt/select (the unfused step of train/step.cpp), in f32, bf16 and f64, with and
// without a skipped step and with the loss scale's division; sum_of_squares against reduce_sum(x * x) over
// trailing, leading and middle axes, and of x / d with a divisor. Both reading a narrower float widened on load
// (ir::fold_widening_converts) against the same op of its convert.
#include "cli/config.h"
#include "compile/compile.h"
#include "exec/exec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace remat {
namespace {

using namespace ir;

void fill(exec::Array& a, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < a.size(); ++i) a.set(i, dist(rng));
}

bool same_bits(const exec::Array& a, const exec::Array& b) {
  return a.type() == b.type() && std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())) == 0;
}

// AdamW's operands p, m, v, g, scale, lr, bias1, bias2, finite (true), loss scale: values of a typical step.
void fill_adamw(std::vector<exec::Array>& args, std::mt19937& rng, bool unscaled) {
  fill(args[0], rng, -1, 1);
  fill(args[1], rng, -1e-2, 1e-2);
  fill(args[2], rng, 0, 1e-4);
  fill(args[3], rng, unscaled ? -30.0 : -1e-2, unscaled ? 30.0 : 1e-2);
  args[4].set(0, 0.7);
  args[5].set(0, 3e-4);
  args[6].set(0, 0.271);
  args[7].set(0, 0.0975);
  args[8].set(0, 1);
  args[9].set(0, 3072);  // 3 * 2^10: exact in every dtype, not a power of two (the division rounds)
}

// Operands beyond the 8 AdamW always has: none, `finite`, or `finite` and the loss scale.
enum class Extra { none, finite, loss_scale };

class Adamw : public testing::TestWithParam<std::tuple<DType, Extra>> {};

TEST_P(Adamw, EqualsThePrimitivesBitForBit) {
  const auto [dtype, extra] = GetParam();
  const bool with_finite = extra != Extra::none, unscaled = extra == Extra::loss_scale;
  const AdamwHyper h{.b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const Type t{dtype, {37, 129}}, s{DType::f32, {}};
  Graph g;
  Builder b(g);
  Tensor p = b.param("p", t), m = b.param("m", t), v = b.param("v", t), grad = b.param("g", t);
  Tensor scale = b.param("scale", s), lr = b.param("lr", s), bias1 = b.param("bias1", s), bias2 = b.param("bias2", s);
  Tensor finite = b.param("finite", {DType::pred, {}}), loss_scale = b.param("loss_scale", s);
  // The unfused formula (scalars converted to the parameters' dtype, as the step would have to).
  auto as_t = [&](Tensor x) { return dtype == DType::f32 ? x : convert(x, dtype); };
  Tensor gs = (unscaled ? grad / broadcast_to(as_t(loss_scale), t.shape) : grad) * as_t(scale);
  Tensor m2 = m * h.b1 + gs * (1.0 - h.b1);
  Tensor v2 = v * h.b2 + square(gs) * (1.0 - h.b2);
  Tensor decayed = p - p * as_t(lr * h.weight_decay);
  Tensor update = (m2 / as_t(bias1)) / (sqrt(v2 / as_t(bias2)) + h.eps);
  Tensor p2 = decayed - update * as_t(lr);
  if (with_finite) {
    Tensor keep = broadcast_to(finite, t.shape);
    p2 = select(keep, p2, p);
    m2 = select(keep, m2, m);
    v2 = select(keep, v2, v);
  }
  const auto fused = adamw(p, m, v, grad, scale, lr, bias1, bias2, with_finite ? std::optional(finite) : std::nullopt, h,
                           unscaled ? std::optional(loss_scale) : std::nullopt);
  for (Tensor r : {p2, m2, v2, fused[0], fused[1], fused[2]}) b.result(r);
  std::mt19937 rng(5);
  for (bool step_taken : {true, false}) {
    std::vector<exec::Array> args;
    for (ValueId param : g.params) args.emplace_back(g.type(param));
    fill_adamw(args, rng, unscaled);
    args[8].set(0, step_taken ? 1 : 0);
    const std::vector<exec::Array> out = exec::run(g, args);
    for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(same_bits(out[k], out[k + 3])) << "result " << k << " step " << step_taken;
    if (!with_finite) break;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Adamw,
                         testing::Combine(testing::Values(DType::f32, DType::bf16, DType::f16, DType::f64),
                                          testing::Values(Extra::none, Extra::finite, Extra::loss_scale)),
                         [](const testing::TestParamInfo<std::tuple<DType, Extra>>& i) {
                           const Extra e = std::get<1>(i.param);
                           return fmt::format("{}{}", dtype_name(std::get<0>(i.param)),
                                              e == Extra::none ? "" : e == Extra::finite ? "_finite" : "_loss_scale");
                         });

TEST(SumOfSquares, EqualsReduceSumOfTheSquareBitForBit) {
  std::mt19937 rng(9);
  for (DType d : {DType::f32, DType::bf16, DType::f16})
    for (const IntList& axes : {IntList{2}, IntList{0}, IntList{1}, IntList{0, 2}, IntList{0, 1, 2}, IntList{}}) {
      Graph g;
      Builder b(g);
      Tensor x = b.param("x", {d, {6, 50, 333}});
      Tensor divisor = b.param("d", {DType::f32, {}});
      b.result(reduce_sum(square(x), axes));
      b.result(sum_of_squares(x, axes));
      b.result(reduce_sum(square(x / broadcast_to(convert(divisor, d), x.shape())), axes));
      b.result(sum_of_squares(x, axes, divisor));
      std::vector<exec::Array> args{exec::Array(g.type(g.params[0])), exec::Array(g.type(g.params[1]))};
      fill(args[0], rng, d == DType::f16 ? -200 : -3000, d == DType::f16 ? 200 : 3000);  // f16 squares stay finite
      args[1].set(0, 3072);  // 3 * 2^10: exact in every dtype, not a power of two (the division rounds)
      const std::vector<exec::Array> out = exec::run(g, args);
      EXPECT_TRUE(same_bits(out[0], out[1])) << dtype_name(d) << " axes " << shape_str(axes);
      EXPECT_TRUE(same_bits(out[2], out[3])) << dtype_name(d) << " axes " << shape_str(axes) << ", with a divisor";
    }
}

// sum_of_squares with a dtype (ir::fold_widening_converts' reads of narrow gradients) is sum_of_squares of x converted
// to it, bit for bit, with and without a divisor.
TEST(SumOfSquares, WithADtypeEqualsItOfTheConvertedOperandBitForBit) {
  std::mt19937 rng(11);
  for (const auto& [from, to] : {std::pair{DType::bf16, DType::f32}, std::pair{DType::f16, DType::f32},
                                 std::pair{DType::f32, DType::f64}, std::pair{DType::bf16, DType::f64}})
    for (const IntList& axes : {IntList{2}, IntList{0}, IntList{1}, IntList{0, 2}, IntList{0, 1, 2}}) {
      Graph g;
      Builder b(g);
      Tensor x = b.param("x", {from, {6, 50, 333}});
      Tensor divisor = b.param("d", {DType::f32, {}});
      const Attrs widened = Attrs().set("axes", axes).set("dtype", to);
      b.result(sum_of_squares(convert(x, to), axes));
      b.result(b.emit1(Op::sum_of_squares, std::array{x}, widened));
      b.result(sum_of_squares(convert(x, to), axes, divisor));
      b.result(b.emit1(Op::sum_of_squares, std::array{x, divisor}, widened));
      std::vector<exec::Array> args{exec::Array(g.type(g.params[0])), exec::Array(g.type(g.params[1]))};
      fill(args[0], rng, from == DType::f16 ? -60000 : -3e4, from == DType::f16 ? 60000 : 3e4);
      args[1].set(0, 3072);
      const std::vector<exec::Array> out = exec::run(g, args);
      const std::string label = fmt::format("{} to {}, axes {}", dtype_name(from), dtype_name(to), shape_str(axes));
      EXPECT_TRUE(same_bits(out[0], out[1])) << label;
      EXPECT_TRUE(same_bits(out[2], out[3])) << label << ", with a divisor";
    }
}

// adamw with a gradient of a narrower float than its parameter reads it widened: the bits of adamw of the
// converted gradient.
TEST(AdamwGradient, OfANarrowerFloatEqualsItConvertedBitForBit) {
  const AdamwHyper h{.b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::mt19937 rng(13);
  for (const auto& [pd, gd] : {std::pair{DType::f32, DType::bf16}, std::pair{DType::f32, DType::f16},
                               std::pair{DType::f64, DType::f32}})
    for (bool unscaled : {false, true}) {
      const Type t{pd, {37, 129}}, s{DType::f32, {}};
      Graph g;
      Builder b(g);
      Tensor p = b.param("p", t), m = b.param("m", t), v = b.param("v", t), grad = b.param("g", {gd, t.shape});
      Tensor scale = b.param("scale", s), lr = b.param("lr", s), bias1 = b.param("bias1", s), bias2 = b.param("bias2", s);
      Tensor finite = b.param("finite", {DType::pred, {}}), loss_scale = b.param("loss_scale", s);
      const std::optional<Tensor> ls = unscaled ? std::optional(loss_scale) : std::nullopt;
      const std::optional<Tensor> taken = unscaled ? std::optional(finite) : std::nullopt;  // the loss scale's check
      const auto wide = adamw(p, m, v, convert(grad, pd), scale, lr, bias1, bias2, taken, h, ls);
      const auto narrow = adamw(p, m, v, grad, scale, lr, bias1, bias2, taken, h, ls);
      for (Tensor r : {wide[0], wide[1], wide[2], narrow[0], narrow[1], narrow[2]}) b.result(r);
      std::vector<exec::Array> args;
      for (ValueId param : g.params) args.emplace_back(g.type(param));
      fill_adamw(args, rng, unscaled);
      const std::vector<exec::Array> out = exec::run(g, args);
      for (size_t k = 0; k < 3; ++k)
        EXPECT_TRUE(same_bits(out[k], out[k + 3])) << dtype_name(pd) << " from " << dtype_name(gd) << " result " << k
                                                   << (unscaled ? ", unscaled" : "");
    }
}

// An f16 gradient divided by a loss scale f16 cannot hold (2^17 > 65504): the quotient is taken in f32 and rounded
// to f16, not divided by an infinite f16 scale (every gradient 0).
TEST(SumOfSquares, DividesF16ByAScaleF16CannotHold) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f16, {4, 100}}), d = b.param("d", {DType::f32, {}});
  b.result(reduce_sum(square(convert(convert(x, DType::f32) / broadcast_to(d, {4, 100}), DType::f16)), {1}));
  b.result(sum_of_squares(x, {1}, d));
  std::mt19937 rng(4);
  std::vector<exec::Array> args{exec::Array(g.type(x.id)), exec::Array(g.type(d.id))};
  fill(args[0], rng, -60000, 60000);
  args[1].set(0, 131072);
  const std::vector<exec::Array> out = exec::run(g, args);
  EXPECT_TRUE(same_bits(out[0], out[1]));
  EXPECT_GT(out[1].get(0), 0.0);
}

// The step's finiteness check: sum_of_squares(g, every axis, +inf) is 0 when every element is finite (g / inf
// is ±0) and NaN when a single element is inf or NaN, in each dtype a gradient may have.
TEST(SumOfSquares, ByInfinityIsZeroExactlyWhenEveryElementIsFinite) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    Graph g;
    Builder b(g);
    Tensor x = b.param("x", {d, {5, 300}});
    b.result(sum_of_squares(x, {0, 1}, scalar(b, DType::f32, std::numeric_limits<double>::infinity())));
    std::mt19937 rng(2);
    exec::Array a(g.type(x.id));
    fill(a, rng, -60000, 60000);
    EXPECT_EQ(exec::run(g, std::span(&a, 1))[0].get(0), 0.0) << dtype_name(d);
    for (double bad : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::quiet_NaN()}) {
      exec::Array one(a.type());
      std::memcpy(one.bytes(), a.bytes(), static_cast<size_t>(a.type().bytes()));
      one.set(777, bad);
      EXPECT_TRUE(std::isnan(exec::run(g, std::span(&one, 1))[0].get(0))) << dtype_name(d) << " with " << bad;
    }
  }
}

// The tiny training step in f32, bf16 and f16 (dynamic loss scaling: the gradients unscaled where the norm and
// AdamW read them, the finiteness check in one pass): no buffer made in the optimizer's scope holds more than
// 16 KiB (its partial sums of squares and scalars), while a layer weight's gradient is 1 MiB.
TEST(FusedOptimizer, MakesNoFullSizeTemporaryInAnyDtype) {
  for (const char* dtype : {"float32", "bfloat16", "float16"}) {
    const cli::Config c = cli::load_config(std::string(REMAT_TEST_DATA) + "/../configs/base.yml", {fmt::format("dtype={}", dtype)});
    const compile::Compiled s = compile::compile({.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer});
    int64_t largest = 0, optimizer = 0;
    for (const plan::Buffer& buf : s.plan.buffers) {
      if (buf.node < 0 || buf.space != plan::Space::device) continue;
      largest = std::max(largest, buf.bytes);
      if (s.program.nodes[static_cast<size_t>(buf.node)].scope.starts_with("optimizer"))
        optimizer = std::max(optimizer, buf.bytes);
    }
    EXPECT_LE(optimizer, 16 << 10) << dtype;
    EXPECT_GE(largest, 1 << 20) << dtype;
  }
}

}  // namespace
}  // namespace remat
