// The scaled masked softmax (the softmax op with a mask, exec/kernels/softmax.cpp) against the composition the
// model built before it, softmax(select(mask, x·scale, −inf)), run op by op by the reference executor (the
// elementwise kernels and the plain softmax: an independent route), and its VJP as autodiff differentiates those
// primitives. The same bits forward and backward for f32, bf16 and f64 scores, probabilities in bf16 or the scores'
// dtype, a scale exact in bf16 and one that is not; under a causal mask (each row's hidden tail skipped) and a
// scattered one with a row all hidden (NaN, as the primitives give); with a NaN score, and an infinite cotangent
// where a row is hidden (a NaN row there too); on one thread and in parallel; planned as well. Masks of other
// dimensions, and a scale without a mask, are refused.
#include "autodiff/autodiff.h"
#include "exec/exec.h"
#include "ir/ir.h"

#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/reference_executor.h"
#include "support/training_steps.h"

#include <cmath>
#include <limits>
#include <random>

namespace remat {
namespace {

using namespace ir;
using testing_support::same_bits;

struct Case {
  DType x, p;
};

// The model's attention probabilities before the op, from primitives.
Tensor masked_softmax_of_primitives(Builder& b, Tensor x, Tensor mask, double scale, DType p) {
  Tensor visible = broadcast_in_dim(mask, x.shape(), {x.rank() - 2, x.rank() - 1});
  Tensor hidden = full(b, x.type(), -std::numeric_limits<double>::infinity());
  return softmax(select(visible, x * scale, hidden), p);
}

// Scores in [−8, 8] and cotangents in [−1, 1]; the mask causal, or scattered (about 1 in 3 hidden) with row 1 all
// hidden; a NaN score at one visible place and an infinite cotangent past row 3's last visible key.
std::vector<exec::Array> inputs(const Graph& g, bool causal, int64_t s, int64_t t) {
  std::vector<exec::Array> args;
  for (ValueId p : g.params) args.emplace_back(g.type(p));
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> score(-8, 8), cot(-1, 1);
  for (int64_t i = 0; i < args[0].size(); ++i) args[0].set(i, score(rng));
  for (int64_t i = 0; i < args[1].size(); ++i) args[1].set(i, cot(rng));
  std::bernoulli_distribution hide(1.0 / 3);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < t; ++j) args[2].set(i * t + j, causal ? j <= i : i != 1 && !hide(rng));
  args[0].set(2 * t, std::numeric_limits<double>::quiet_NaN());  // row 2, key 0: visible in both masks
  if (causal) args[1].set(3 * t + t - 1, std::numeric_limits<double>::infinity());
  return args;
}

TEST(MaskedSoftmax, GivesTheBitsOfItsPrimitivesForwardAndBackward) {
  const Case cases[] = {{DType::f32, DType::bf16}, {DType::f32, DType::f32}, {DType::bf16, DType::bf16},
                        {DType::f64, DType::f64}};
  // [2,3,37,45]: rows past the 16 lanes with a tail, on one thread; [2,4,64,200]: the parallel path
  for (const Shape& shape : {Shape{2, 3, 37, 45}, Shape{2, 4, 64, 200}})
    for (const Case& c : cases)
      for (bool causal : {true, false})
        for (double scale : {0.125, 1 / std::sqrt(48.0)}) {
          const int64_t s = shape[2], t = shape[3];
          Graph g;
          Builder b(g);
          Tensor x = b.param("x", {c.x, shape}), cot = b.param("g", {c.p, shape});
          Tensor mask = b.param("mask", {DType::pred, {s, t}});
          Tensor p_op = masked_softmax(x, mask, scale, c.p), p_prim = masked_softmax_of_primitives(b, x, mask, scale, c.p);
          const ValueId dx_op = autodiff::vjp(g, std::array{std::pair{p_op.id, cot.id}}, std::array{x.id})[0];
          const ValueId dx_prim = autodiff::vjp(g, std::array{std::pair{p_prim.id, cot.id}}, std::array{x.id})[0];
          for (ValueId v : {p_op.id, p_prim.id, dx_op, dx_prim}) g.results.push_back(v);
          const std::vector<exec::Array> args = inputs(g, causal, s, t);
          const std::vector<exec::Array> out = testing_support::reference_run(g, args);
          const std::string where = fmt::format("{} -> {}, {} mask, scale {}", type_str(g.type(x.id)), dtype_name(c.p),
                                                causal ? "causal" : "scattered", scale);
          EXPECT_TRUE(same_bits(out[0], out[1])) << "p: " << where;
          EXPECT_TRUE(same_bits(out[2], out[3])) << "dx: " << where;
          const std::vector<exec::Array> planned = exec::run(g, args);
          for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(same_bits(planned[i], out[i])) << i << ": " << where;
        }
}

TEST(MaskedSoftmax, RefusesAMaskOfOtherDimsAndAScaleWithoutOne) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {2, 3, 5}}), g_p = b.param("g", {DType::f32, {2, 3, 5}});
  Tensor wrong = b.param("wrong", {DType::pred, {5, 3}}), ints = b.param("ints", {DType::i32, {3, 5}});
  for (Tensor m : {wrong, ints}) {
    const std::string e = testing_support::error_of([&] { masked_softmax(x, m, 0.5, DType::f32); });
    EXPECT_NE(e.find("softmax's mask must be bool [S, T] for x [..., S, T], got (f32[2,3,5], "), std::string::npos) << e;
  }
  const std::string e = testing_support::error_of([&] { softmax_grad(x, g_p, wrong, 0.5); });
  EXPECT_NE(e.find("softmax_grad's mask must be bool [S, T] for x [..., S, T]"), std::string::npos) << e;
  const std::string e2 = testing_support::error_of(
      [&] { x.b->emit1(Op::softmax, std::array{x}, Attrs().set("dtype", DType::f32).set("scale", 0.5)); });
  EXPECT_NE(e2.find("softmax's scale comes with a mask; give the mask (bool [S, T]) or no scale"), std::string::npos)
      << e2;
}

}  // namespace
}  // namespace remat
