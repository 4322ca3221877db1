// The rope kernel (exec/kernels/rope.cpp) against the composition it replaces: x·cos + [−x₂, x₁]·sin built from
// slice, neg, concatenate, mul and add with the tables repeated over both halves, run op by op by the reference
// executor (an independent route: the elementwise kernels) — the same bits in f32, bf16 and f64, for heads whose
// half is longer than the vectors with an odd tail, positions read across batch and heads, and arrays on one thread
// or all. Its VJP, rope with −sin, turns a rotation back: in f64 rope(rope(x, c, s), c, −s) = x where c² + s² = 1.
// Planned, it writes over a dying x (ir::in_place_operand) and the run equals the reference executor's. Tables of
// the whole head (the composition's [T, Dh]) are refused, naming the op and the types.
#include "exec/executable.h"
#include "ir/ir.h"
#include "plan/plan.h"

#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/reference_executor.h"
#include "support/training_steps.h"

#include <cmath>
#include <random>

namespace remat {
namespace {

using namespace ir;
using testing_support::same_bits;

// x·cos + rotate_half(x)·sin of the primitives, rotate_half(x) = [−x₂, x₁], the [T, Dh/2] tables repeated.
Tensor rope_of_primitives(Tensor x, Tensor cos, Tensor sin) {
  const Shape& s = x.shape();
  const int64_t h = s[3] / 2;
  Tensor x1 = slice(x, {0, 0, 0, 0}, {s[0], s[1], s[2], h});
  Tensor x2 = slice(x, {0, 0, 0, h}, {s[0], s[1], s[2], s[3]});
  Tensor rotated = concatenate(std::array{neg(x2), x1}, 3);
  Tensor c = broadcast_in_dim(concatenate(std::array{cos, cos}, 1), s, {1, 3});
  Tensor sn = broadcast_in_dim(concatenate(std::array{sin, sin}, 1), s, {1, 3});
  return x * c + rotated * sn;
}

// x [B,T,N,Dh] uniform in [−3, 3], tables of angles from a seed: cos, sin as the model's (c² + s² = 1).
std::vector<exec::Array> inputs(const Graph& g, uint32_t seed) {
  std::vector<exec::Array> args;
  for (ValueId p : g.params) args.emplace_back(g.type(p));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> value(-3, 3), angle(-40, 40);
  for (int64_t i = 0; i < args[0].size(); ++i) args[0].set(i, value(rng));
  for (int64_t i = 0; i < args[1].size(); ++i) {
    const double a = angle(rng);
    args[1].set(i, std::cos(a)), args[2].set(i, std::sin(a));
  }
  return args;
}

TEST(Rope, GivesTheBitsOfItsPrimitives) {
  // half 37: vectors and an odd tail; 2 x 31 x 5 x 74 = 22940 elements (the parallel path), 1 x 3 x 2 x 6 (serial)
  for (const Shape& shape : {Shape{2, 31, 5, 74}, Shape{1, 3, 2, 6}})
    for (DType d : {DType::f32, DType::bf16, DType::f64}) {
      Graph g;
      Builder b(g);
      const Type table{d, {shape[1], shape[3] / 2}};
      Tensor x = b.param("x", {d, shape}), cos = b.param("cos", table), sin = b.param("sin", table);
      b.result(rope(x, cos, sin));
      b.result(rope_of_primitives(x, cos, sin));
      const std::vector<exec::Array> out = testing_support::reference_run(g, inputs(g, 1));
      EXPECT_TRUE(same_bits(out[0], out[1])) << dtype_name(d) << " " << type_str(g.type(x.id));
    }
}

TEST(Rope, ItsVjpTurnsTheRotationBack) {
  Graph g;
  Builder b(g);
  const Type table{DType::f64, {7, 5}};
  Tensor x = b.param("x", {DType::f64, {2, 7, 3, 10}}), cos = b.param("cos", table), sin = b.param("sin", table);
  b.result(rope(rope(x, cos, sin), cos, neg(sin)));
  const std::vector<exec::Array> args = inputs(g, 2);
  const exec::Array back = exec::run(g, args)[0];
  for (int64_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back.get(i), args[0].get(i), 1e-14) << i;
}

TEST(Rope, WritesOverItsDyingInput) {
  for (bool x_read_later : {false, true}) {
    Graph g;
    Builder b(g);
    const Type table{DType::bf16, {9, 8}};
    Tensor s = b.param("s", {DType::bf16, {2, 9, 4, 16}}), cos = b.param("cos", table), sin = b.param("sin", table);
    Tensor x = tanh(s) * 2.0f;  // a temporary of the plan
    Tensor y = rope(x, cos, sin);
    b.result(x_read_later ? y + x : exp(y));
    const plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
    const int bx = p.buffer_of[static_cast<size_t>(x.id)], by = p.buffer_of[static_cast<size_t>(y.id)];
    ASSERT_GE(bx, 0);
    EXPECT_EQ(bx == by, !x_read_later) << (x_read_later ? "x is read after rope" : "x dies at rope");
    const std::vector<exec::Array> args = inputs(g, 3);
    exec::Executable e(g, p);
    EXPECT_TRUE(same_bits(e.run(args)[0], testing_support::reference_run(g, args)[0]));
  }
}

TEST(Rope, RefusesTablesOfTheWholeHead) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {1, 4, 2, 8}});
  Tensor whole = b.param("cos", {DType::f32, {4, 8}});
  const std::string e = testing_support::error_of([&] { rope(x, whole, whole); });
  EXPECT_NE(e.find("rope takes x [B,T,N,Dh] with Dh even and cos, sin [T,Dh/2] of x's float dtype, got "
                   "(f32[1,4,2,8], f32[4,8], f32[4,8])"),
            std::string::npos)
      << e;
  Tensor half = b.param("sin", {DType::bf16, {4, 4}});
  EXPECT_NE(testing_support::error_of([&] { rope(x, half, half); }).find("rope takes"), std::string::npos) << "bf16 tables";
}

}  // namespace
}  // namespace remat
