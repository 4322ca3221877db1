// The cost model against hand-derived counts: 2·M·N·K per dot_general (batch dims multiply), one FLOP per
// output element of elementwise ops, one per input element of reductions, none for data movement, and a
// scan's body times its length.
#include "ir/cost.h"
#include "ir/ir.h"

#include <gtest/gtest.h>

namespace remat::ir {
namespace {

TEST(Cost, HandDerivedCounts) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {6, 5}});   // M=6, K=5
  Tensor w = b.param("w", {DType::f32, {5, 7}});   // K=5, N=7
  Tensor q = b.param("q", {DType::f32, {2, 3, 4}});  // batch 2, M=3, K=4
  Tensor k = b.param("k", {DType::f32, {2, 4, 9}});  // batch 2, K=4, N=9
  Tensor y = matmul(x, w);                                                   // 2·6·7·5 = 420
  Tensor s = dot_general(q, k, DotDims{{2}, {1}, {0}, {0}});                 // 2·(2·3·9)·4 = 432
  Tensor t = tanh(y);                                                        // 42
  Tensor u = t * y;                                                          // 42
  Tensor r = reduce_sum(u, {1});                                             // 42 (input elements)
  Tensor m = reduce_max(s, {1, 2});                                          // 54
  Tensor z = reshape(transpose(broadcast_to(r, {6, 6}), {1, 0}), {36});      // data movement: 0
  b.result(z);
  b.result(m);
  std::vector<double> each;
  for (const Node& n : g.nodes) each.push_back(flops(g, n));
  EXPECT_EQ(each, (std::vector<double>{420, 432, 42, 42, 42, 54, 0, 0, 0}));
  EXPECT_EQ(flops(g), 420 + 432 + 42 + 42 + 42 + 54);
}

// The row ops count per element of their first operand as ops.h lists them: softmax 5, softmax_grad 9,
// log_softmax 5, log_softmax_grad 4.
TEST(Cost, RowOpsCountTheirPerElementOperations) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {3, 5}}), d = b.param("d", {DType::f32, {3, 5}});
  b.result(softmax(x));
  b.result(softmax_grad(x, d));
  b.result(log_softmax(x));
  b.result(log_softmax_grad(x, d));
  std::vector<double> each;
  for (const Node& n : g.nodes) each.push_back(flops(g, n));
  EXPECT_EQ(each, (std::vector<double>{75, 135, 75, 60}));
}

TEST(Cost, ScanCountsItsBodyTimesItsLength) {
  Graph g;
  Builder b(g);
  Tensor h = b.param("h", {DType::f32, {2, 4}});
  Tensor ws = b.param("ws", {DType::f32, {3, 4, 4}});
  std::vector<Tensor> carries{h}, xs{ws};
  std::vector<Tensor> out = scan(b, 3, {}, carries, xs, [](Builder&, std::span<const Tensor>, std::span<const Tensor> c,
                                                           std::span<const Tensor> x) {
    return std::vector<Tensor>{exp(matmul(c[0], x[0]))};  // 2·2·4·4 + 8 = 72 per iteration
  });
  b.result(out[0]);
  EXPECT_EQ(flops(g), 3 * 72);
}

}  // namespace
}  // namespace remat::ir
