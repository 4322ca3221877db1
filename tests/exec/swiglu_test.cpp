// The swiglu kernels (exec/kernels/swiglu.cpp) against the composition the model built before the op, silu(gate)·up
// from logistic and mul (for bf16 in f32 between converts), run op by op by the reference executor (the
// elementwise kernels: an independent route), and its VJP as autodiff differentiates those primitives. The same
// bits forward and backward (dgate and dup) in f32, bf16 and f64, on lengths with a tail past the vector lanes, on
// one thread or all, over gates from deep in the logistic's tails; and f32 infinities, zeros and subnormals. The planned executor gives the same bits, and
// writes the result over a dying gate. Operands of different types are refused.
#include "autodiff/autodiff.h"
#include "exec/exec.h"
#include "exec/executable.h"
#include "ir/ir.h"
#include "plan/plan.h"

#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/reference_executor.h"
#include "support/training_steps.h"

#include <limits>
#include <random>

namespace remat {
namespace {

using namespace ir;
using testing_support::same_bits;

// gate uniform in [−lim, lim], up and the cotangent in [−2, 2]; every 97th gate element an f32 special value.
std::vector<exec::Array> inputs(const Graph& g, double lim, bool specials) {
  std::vector<exec::Array> args;
  for (ValueId p : g.params) args.emplace_back(g.type(p));
  std::mt19937 rng(3);
  const double inf = std::numeric_limits<double>::infinity();
  const double special[] = {inf, -inf, 0.0, -0.0, 1e-40, -1e-40, 88.5, -104.5};
  for (size_t k = 0; k < args.size(); ++k) {
    std::uniform_real_distribution<double> value(k == 0 ? -lim : -2, k == 0 ? lim : 2);
    for (int64_t i = 0; i < args[k].size(); ++i)
      args[k].set(i, specials && k == 0 && i % 97 == 0 ? special[i / 97 % 8] : value(rng));
  }
  return args;
}

TEST(Swiglu, GivesTheBitsOfItsPrimitivesForwardAndBackward) {
  // 3330 elements (one thread; 208 vectors of 16 and a tail of 2) and 24969 (the parallel path)
  for (const Shape& shape : {Shape{2, 37, 45}, Shape{3, 41, 203}})
    for (DType d : {DType::f32, DType::bf16, DType::f64})
      for (double lim : {4.0, 120.0}) {
        Graph g;
        Builder b(g);
        Tensor gate = b.param("gate", {d, shape}), up = b.param("up", {d, shape}), cot = b.param("g", {d, shape});
        // bf16 computes in f32, rounding its result once (the converts' VJPs round the cotangents likewise)
        const DType c = d == DType::bf16 ? DType::f32 : d;
        Tensor y_op = swiglu(gate, up), y_prim = convert(silu(convert(gate, c)) * convert(up, c), d);
        const std::vector<ValueId> d_op =
            autodiff::vjp(g, std::array{std::pair{y_op.id, cot.id}}, std::array{gate.id, up.id});
        const std::vector<ValueId> d_prim =
            autodiff::vjp(g, std::array{std::pair{y_prim.id, cot.id}}, std::array{gate.id, up.id});
        for (ValueId v : {y_op.id, y_prim.id, d_op[0], d_prim[0], d_op[1], d_prim[1]}) g.results.push_back(v);
        const std::vector<exec::Array> args = inputs(g, lim, d == DType::f32);
        const std::vector<exec::Array> out = testing_support::reference_run(g, args);
        const std::string where = fmt::format("{}, gates in ±{}", type_str(g.type(gate.id)), lim);
        EXPECT_TRUE(same_bits(out[0], out[1])) << "y: " << where;
        EXPECT_TRUE(same_bits(out[2], out[3])) << "dgate: " << where;
        EXPECT_TRUE(same_bits(out[4], out[5])) << "dup: " << where;
        const std::vector<exec::Array> planned = exec::run(g, args);
        for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(same_bits(planned[i], out[i])) << i << ": " << where;
      }
}

// gate made by a multiply: when nothing reads it after swiglu (and swiglu_grad) their first result takes its buffer,
// and the run keeps the reference executor's bits.
// dgate (and swiglu's product) over a dying gate, dup over a dying up: one buffer each, and the bits of the
// reference executor.
TEST(Swiglu, WritesOverItsDyingGateAndUp) {
  for (bool operands_read_later : {false, true})
    for (bool backward : {false, true}) {
      Graph g;
      Builder b(g);
      Tensor x = b.param("x", {DType::bf16, {64, 96}});
      Tensor gate = x * 1.5f, up = x * 0.75f;  // temporaries of the plan
      std::vector<Tensor> ys{swiglu(gate, up)};
      if (backward) {
        const std::array<Tensor, 2> d = swiglu_grad(gate, up, x);
        ys = {d[0], d[1]};
      }
      const std::array<Tensor, 2> over = {gate, up};
      Tensor sum = ys[0];
      for (size_t k = 1; k < ys.size(); ++k) sum = sum + ys[k];
      b.result(operands_read_later ? sum + gate * up : exp(sum));
      const plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
      for (size_t k = 0; k < ys.size(); ++k) {
        const int bo = p.buffer_of[static_cast<size_t>(over[k].id)], by = p.buffer_of[static_cast<size_t>(ys[k].id)];
        ASSERT_GE(bo, 0);
        EXPECT_EQ(bo == by, !operands_read_later)
            << (backward ? "swiglu_grad" : "swiglu") << " result " << k
            << (operands_read_later ? ": its operand is read after it" : ": its operand dies at it");
      }
      const std::vector<exec::Array> args = inputs(g, 6, false);
      exec::Executable e(g, p);
      EXPECT_TRUE(same_bits(e.run(args)[0], testing_support::reference_run(g, args)[0]));
    }
}

TEST(Swiglu, RefusesOperandsOfDifferentTypes) {
  Graph g;
  Builder b(g);
  Tensor gate = b.param("gate", {DType::bf16, {2, 8}}), up = b.param("up", {DType::f32, {2, 8}});
  const std::string e = testing_support::error_of([&] { swiglu(gate, up); });
  EXPECT_NE(e.find("swiglu takes gate and up of one float type, got (bf16[2,8], f32[2,8])"), std::string::npos) << e;
  Tensor ok = b.param("ok", {DType::bf16, {2, 8}}), wide = b.param("wide", {DType::bf16, {2, 9}});
  const std::string e2 = testing_support::error_of([&] { swiglu_grad(gate, ok, wide); });
  EXPECT_NE(e2.find("swiglu_grad takes gate, up and the product's cotangent g of one float type"), std::string::npos)
      << e2;
}

}  // namespace
}  // namespace remat
