// The rms_norm kernels (exec/kernels/norm.cpp) against the composition the model built before the op: convert to
// f32 (f64 for f64), mean of the squares, + eps, rsqrt, times x, times the scale, convert — run op by op by the
// reference executor (the elementwise and reduction kernels: an independent route), and its VJP as autodiff
// differentiates those primitives. The same bits forward and backward (dx and dw) in f32, bf16 and f64, with a
// bf16 scale, a result in another dtype, rows longer than the lanes with a tail, on one thread or all. The planned
// executor (the op's workspace) gives the reference executor's bits. A scale of another length is refused.
#include "autodiff/autodiff.h"
#include "exec/exec.h"
#include "ir/ir.h"

#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/reference_executor.h"
#include "support/training_steps.h"

#include <random>

namespace remat {
namespace {

using namespace ir;
using testing_support::same_bits;

// The model's RMSNorm before the op, from primitives.
Tensor rms_norm_of_primitives(Tensor input, Tensor scale, double eps, DType out) {
  const DType a = input.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor x = convert(input, a);
  const int64_t last = x.rank() - 1;
  IntList rows(static_cast<size_t>(last));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  Tensor normalized = x * broadcast_in_dim(rsqrt(mean(square(x), {last}) + eps), x.shape(), rows);
  return convert(normalized * broadcast_in_dim(convert(scale, a), x.shape(), {last}), out);
}

struct Case {
  DType x, w, out;
};

// x uniform in [−3, 3], the scale in [0.5, 1.5], the cotangent in [−1, 1].
std::vector<exec::Array> inputs(const Graph& g, uint32_t seed) {
  std::vector<exec::Array> args;
  for (ValueId p : g.params) args.emplace_back(g.type(p));
  std::mt19937 rng(seed);
  const double lo[] = {-3, 0.5, -1}, hi[] = {3, 1.5, 1};
  for (size_t k = 0; k < args.size(); ++k) {
    std::uniform_real_distribution<double> value(lo[k], hi[k]);
    for (int64_t i = 0; i < args[k].size(); ++i) args[k].set(i, value(rng));
  }
  return args;
}

TEST(RmsNorm, GivesTheBitsOfItsPrimitivesForwardAndBackward) {
  const Case cases[] = {{DType::f32, DType::f32, DType::f32},
                        {DType::bf16, DType::f32, DType::bf16},
                        {DType::bf16, DType::bf16, DType::bf16},
                        {DType::f32, DType::f32, DType::bf16},
                        {DType::f16, DType::f32, DType::f16},
                        {DType::f32, DType::f32, DType::f64},
                        {DType::f64, DType::f64, DType::f64}};
  // rows of 45 (2 vectors of 16, a block of 8 and a tail of 5) in 3330 elements (one thread); of 203 (12 vectors,
  // a block of 8, a tail of 3) in 24969 (the parallel path); of 48 (vectors alone) and of 7 (a tail alone)
  for (const Shape& shape : {Shape{2, 37, 45}, Shape{3, 41, 203}, Shape{5, 48}, Shape{9, 7}})
    for (const Case& c : cases)
      for (double eps : {1e-6, 0.25}) {
        Graph g;
        Builder b(g);
        Tensor x = b.param("x", {c.x, shape}), w = b.param("w", {c.w, {shape.back()}});
        Tensor g_op = b.param("g", {c.out, shape});
        Tensor y_op = rms_norm(x, w, eps, c.out), y_prim = rms_norm_of_primitives(x, w, eps, c.out);
        const std::vector<ValueId> d_op = autodiff::vjp(g, std::array{std::pair{y_op.id, g_op.id}}, std::array{x.id, w.id});
        const std::vector<ValueId> d_prim =
            autodiff::vjp(g, std::array{std::pair{y_prim.id, g_op.id}}, std::array{x.id, w.id});
        for (ValueId v : {y_op.id, y_prim.id, d_op[0], d_prim[0], d_op[1], d_prim[1]}) g.results.push_back(v);
        const std::vector<exec::Array> args = inputs(g, 1);
        const std::vector<exec::Array> out = testing_support::reference_run(g, args);
        const std::string where = fmt::format("x {}, w {}, out {}, eps {}", type_str(g.type(x.id)),
                                              dtype_name(c.w), dtype_name(c.out), eps);
        EXPECT_TRUE(same_bits(out[0], out[1])) << "y: " << where;
        EXPECT_TRUE(same_bits(out[2], out[3])) << "dx: " << where;
        EXPECT_TRUE(same_bits(out[4], out[5])) << "dw: " << where;
        const std::vector<exec::Array> planned = exec::run(g, args);
        for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(same_bits(planned[i], out[i])) << i << ": " << where;
      }
}

TEST(RmsNorm, RefusesAScaleOfAnotherLength) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::bf16, {2, 3, 8}});
  Tensor w = b.param("w", {DType::f32, {6}});
  const std::string e = testing_support::error_of([&] { rms_norm(x, w, 1e-6); });
  EXPECT_NE(e.find("rms_norm takes x [..., D] and its scale w [D], floats, got (bf16[2,3,8], f32[6])"), std::string::npos)
      << e;
  Tensor ok = b.param("ok", {DType::f32, {8}});
  EXPECT_NE(testing_support::error_of([&] { rms_norm(x, ok, 0); }).find("rms_norm's eps must be > 0, got 0"),
            std::string::npos);
}

}  // namespace
}  // namespace remat
