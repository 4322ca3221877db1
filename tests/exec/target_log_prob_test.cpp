// The target_log_prob kernels (exec/kernels/softmax.cpp) against the composition the loss built before the op:
// log_softmax of the logits converted to the log-probabilities' dtype, picked by a one-hot reduce_sum, run op by op
// by the reference executor (the log_softmax, elementwise and reduction kernels: an independent route), and its VJP
// as autodiff differentiates those primitives (log_softmax_grad of the one-hot row, the convert back). The same bits
// forward and backward for bf16, f32 and f64 logits in f32 or f64, targets outside the vocabulary (padding, ≥ V)
// included, rows shorter and longer than the lanes. The planned executor gives the reference executor's bits. A
// dtype that cannot hold the logits' values, targets of another shape, and row statistics of another shape, are
// refused.
#include "autodiff/autodiff.h"
#include "exec/exec.h"
#include "ir/ir.h"

#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/reference_executor.h"
#include "support/training_steps.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace remat {
namespace {

using namespace ir;
using testing_support::same_bits;

// The loss's target log-probabilities before the op, from primitives.
Tensor target_log_prob_of_primitives(Builder& b, Tensor logits, Tensor targets, DType dtype) {
  const int64_t v = logits.rank() - 1;
  Tensor logp = log_softmax(convert(logits, dtype));
  Tensor vocab = iota(b, DType::i32, logits.shape(), v);
  IntList dims(static_cast<size_t>(v));
  std::iota(dims.begin(), dims.end(), int64_t{0});
  Tensor hot = compare(vocab, broadcast_in_dim(targets, logits.shape(), dims), "eq");
  return reduce_sum(select(hot, logp, zeros_like(logp)), {v});
}

// Logits uniform in [−8, 8], targets in [−2, V + 1] (a few outside the vocabulary), the cotangent in [−1, 1] (−0
// in every fifth row: a masked token's).
std::vector<exec::Array> inputs(const Graph& g, uint32_t seed) {
  std::vector<exec::Array> args;
  for (ValueId p : g.params) args.emplace_back(g.type(p));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> logit(-8, 8), cot(-1, 1);
  std::uniform_int_distribution<int32_t> target(-2, static_cast<int32_t>(g.type(g.params[0]).shape.back()) + 1);
  for (int64_t i = 0; i < args[0].size(); ++i) args[0].set(i, logit(rng));
  for (int64_t i = 0; i < args[1].size(); ++i) args[1].data<int32_t>()[i] = target(rng);
  for (int64_t i = 0; i < args[2].size(); ++i) args[2].set(i, i % 5 == 0 ? -0.0 : cot(rng));
  return args;
}

TEST(TargetLogProb, GivesTheBitsOfItsPrimitivesForwardAndBackward) {
  const std::pair<DType, DType> cases[] = {{DType::f32, DType::f32}, {DType::bf16, DType::f32}, {DType::bf16, DType::bf16},
                                           {DType::f64, DType::f64}, {DType::f32, DType::f64}};
  // rows of 13 (shorter than the lanes), 45 (groups and a tail) and 3001 (the loss's long rows)
  for (const Shape& shape : {Shape{2, 3, 13}, Shape{2, 37, 45}, Shape{2, 5, 3001}})
    for (const auto& [x_type, d] : cases) {
      Graph g;
      Builder b(g);
      const Shape rows(shape.begin(), shape.end() - 1);
      Tensor x = b.param("x", {x_type, shape}), t = b.param("targets", {DType::i32, rows});
      Tensor cot = b.param("g", {d, rows});
      const auto [y_op, stats] = target_log_prob(x, t, d);
      Tensor y_prim = target_log_prob_of_primitives(b, x, t, d);
      const ValueId dx_op = autodiff::vjp(g, std::array{std::pair{y_op.id, cot.id}}, std::array{x.id})[0];
      const ValueId dx_prim = autodiff::vjp(g, std::array{std::pair{y_prim.id, cot.id}}, std::array{x.id})[0];
      for (ValueId v : {y_op.id, y_prim.id, dx_op, dx_prim, stats.id}) g.results.push_back(v);
      const std::vector<exec::Array> args = inputs(g, 1);
      const std::vector<exec::Array> out = testing_support::reference_run(g, args);
      const std::string where = fmt::format("x {}, log-probabilities in {}", type_str(g.type(x.id)), dtype_name(d));
      EXPECT_TRUE(same_bits(out[0], out[1])) << "y: " << where;
      EXPECT_TRUE(same_bits(out[2], out[3])) << "dx: " << where;
      // The VJP read the forward's statistics; each row's max among them, found again here (exact in any dtype).
      const int64_t w = shape.back();
      for (int64_t r = 0; r < args[0].size() / w; ++r) {
        double m = -INFINITY;
        for (int64_t j = 0; j < w; ++j) m = std::max(m, args[0].get(r * w + j));
        ASSERT_EQ(out[4].get(2 * r), m) << "row " << r << "'s max: " << where;
      }
      const std::vector<exec::Array> planned = exec::run(g, args);
      for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(same_bits(planned[i], out[i])) << i << ": " << where;
    }
}

TEST(TargetLogProb, RefusesANarrowerDtypeAndOperandsOfAnotherShape) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {2, 3, 8}});
  Tensor t = b.param("t", {DType::i32, {2, 3}});
  const std::string e = testing_support::error_of([&] { target_log_prob(x, t, DType::bf16); });
  EXPECT_NE(e.find("target_log_prob's dtype must be x's float dtype or wider, got bf16 for f32[2,3,8]"),
            std::string::npos)
      << e;
  Tensor wrong = b.param("wrong", {DType::i32, {2, 8}});
  EXPECT_NE(testing_support::error_of([&] { target_log_prob(x, wrong, DType::f32); })
                .find("target_log_prob takes logits x [..., V] of a float dtype and targets [...] i32, got "
                      "(f32[2,3,8], i32[2,8])"),
            std::string::npos);
  Tensor stats = b.param("stats", {DType::f32, {2, 3}}), cot = b.param("g", {DType::f32, {2, 3}});
  const std::string grad = testing_support::error_of([&] { target_log_prob_grad(x, t, stats, cot, DType::f32); });
  EXPECT_NE(grad.find("target_log_prob_grad takes x, targets, the forward's row statistics f32[2,3,2] and the "
                      "cotangent f32[2,3], got (f32[2,3,8], i32[2,3], f32[2,3], f32[2,3])"),
            std::string::npos)
      << grad;
}

}  // namespace
}  // namespace remat
