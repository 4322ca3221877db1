// The op table's columns drive the stages: an effectful op (check_finite) is kept by DCE though nothing
// reads it and never moved by the scheduler (effectful ops keep their order); a view op gets no buffer;
// every row's class and cost agree with what the kernels do (spot checks against the executor).
#include "exec/executable.h"
#include "exec/kernels/exp.h"
#include "ir/cost.h"
#include "ir/ir.h"
#include "plan/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace remat {
namespace {

using namespace ir;

TEST(OpTable, EffectfulOpsSurviveDceAndKeepTheirPlace) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {4}});
  Tensor w = b.param("w", {DType::f32, {4}});  // loop-invariant: nodes from it alone would float
  Tensor checked = check_finite(exp(w));  // effect 1: reads only w; read last, so a pure node would float there
  Tensor y = tanh(x);
  check_finite(y + y);        // effect 2: unread
  Tensor unused = exp(x);     // pure and unread: removed
  (void)unused;
  b.result(y * checked);
  dce(g);
  std::vector<Op> ops;
  for (const Node& n : g.nodes) ops.push_back(n.op);
  ASSERT_EQ(std::count(ops.begin(), ops.end(), Op::check_finite), 2) << print(g);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), Op::exp), 1) << "the check's exp(w) stays, exp(x) goes:\n" << print(g);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), Op::add), 1) << "effect 2's operand stays";
  // The scheduler (plan::build, with w invariant) floats w-only pure nodes to their first use but never
  // moves an effectful one: check 1 still runs before tanh, check 2 after it.
  plan::Plan p = plan::build(g, {.donate = {}, .invariant_params = 2});
  std::vector<Op> order;
  for (int i : p.schedule) order.push_back(g.nodes[static_cast<size_t>(i)].op);
  const auto first = std::find(order.begin(), order.end(), Op::check_finite);
  const auto second = std::find(first + 1, order.end(), Op::check_finite);
  const auto t = std::find(order.begin(), order.end(), Op::tanh);
  EXPECT_LT(first, t);
  EXPECT_GT(second, t);
  // Running it: finite values pass; a NaN fails naming the op.
  exec::Executable e(g, p);
  std::vector<exec::Array> args{exec::Array::from<float>({4}, {0, 1, 2, 3}), exec::Array::from<float>({4}, {1, 1, 1, 1})};
  EXPECT_EQ(e.run(args)[0].get(1), static_cast<double>(std::tanh(1.0f) * exec::exp_f32(1.0f)));  // the kernels' exp
  EXPECT_NO_THROW(e.run(args));
  args[0].set(2, std::nan(""));
  try {
    e.run(args);
    FAIL() << "a NaN passed check_finite";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("check_finite: element 2 of f32[4] is nan"), std::string::npos) << err.what();
  }
}

// A region whose body holds an effectful op is kept though nothing reads its outputs.
TEST(OpTable, RegionsHoldingEffectsSurviveDce) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {4}});
  std::vector<Tensor> in{x};
  checkpoint(b, in, [](Builder&, std::span<const Tensor> a) { return std::vector<Tensor>{check_finite(tanh(a[0]))}; },
             "nothing_saveable");  // its output unread
  checkpoint(b, in, [](Builder&, std::span<const Tensor> a) { return std::vector<Tensor>{tanh(a[0])}; },
             "nothing_saveable");  // pure and unread: removed
  b.result(exp(x));
  dce(g);
  int regions = 0;
  for (const Node& n : g.nodes) regions += n.op == Op::remat;
  EXPECT_EQ(regions, 1) << print(g);
}

TEST(OpTable, ColumnsAgreeWithTheStages) {
  EXPECT_TRUE(is_view(Op::reshape) && is_view(Op::name) && is_view(Op::check_finite));
  EXPECT_FALSE(is_view(Op::transpose));
  EXPECT_TRUE(is_elementwise(Op::select) && is_elementwise(Op::convert_element_type) && !is_elementwise(Op::reduce_sum));
  EXPECT_TRUE(has_body(Op::scan) && has_body(Op::remat) && !has_body(Op::convert_group));
  EXPECT_TRUE(is_effectful(Op::check_finite));
  for (int i = 0; i < kNumOps; ++i) {  // the effectful ops today: a check that can fail, the collectives, messages
    const Op op = static_cast<Op>(i);
    EXPECT_EQ(is_effectful(op), op == Op::check_finite || op == Op::all_reduce || op == Op::all_gather ||
                                    op == Op::reduce_scatter || op == Op::send || op == Op::send_done || op == Op::recv)
        << op_name(op);
  }
  // A view's output shares its operand's storage in the plan (no buffer of its own).
  Graph g;
  Builder b(g);
  Tensor r = reshape(tanh(b.param("x", {DType::f32, {2, 3}})), {6});
  b.result(exp(r));
  plan::Plan p = plan::build(g);
  EXPECT_EQ(p.root[static_cast<size_t>(r.id)], g.nodes[0].outputs[0]);
  // Cost column: per_output for exp (6), none for reshape, per_input for reduce_sum.
  EXPECT_EQ(flops(g, g.nodes[0]), 6);
  EXPECT_EQ(flops(g, g.nodes[1]), 0);
}

}  // namespace
}  // namespace remat
