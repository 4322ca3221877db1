// The verifier rejects malformed graphs with messages that name the node.
#include "ir/ir.h"

#include <gtest/gtest.h>

namespace remat::ir {
namespace {

// A valid graph to break: x -> neg -> add(x) -> result.
Graph base() {
  Graph g;
  g.name = "g";
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {2, 3}});
  auto s = b.scope("blk");
  Tensor y = neg(x);
  b.result(y + x);
  return g;
}

void expect_rejected(const Graph& g, const std::vector<std::string>& needles) {
  try {
    verify(g);
    ADD_FAILURE() << "verified a malformed graph:\n" << print(g);
  } catch (const Error& e) {
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Verify, AcceptsAWellFormedGraph) { EXPECT_NO_THROW(verify(base())); }

TEST(Verify, RejectsUseBeforeDefinition) {
  Graph g = base();
  std::swap(g.nodes[0], g.nodes[1]);
  expect_rejected(g, {"node #0 add in graph @g (scope 'blk')", "before it is defined"});
}

TEST(Verify, RejectsWrongOutputType) {
  Graph g = base();
  g.types[static_cast<size_t>(g.nodes[0].outputs[0])] = Type{DType::f32, {3, 2}};
  expect_rejected(g, {"node #0 neg", "declared f32[3,2] but the op yields f32[2,3]"});
}

TEST(Verify, RejectsShapeMismatchBetweenOperands) {
  Graph g = base();
  ValueId other = g.add_param("z", Type{DType::f32, {4}});
  g.nodes[1].inputs[1] = other;
  expect_rejected(g, {"node #1 add", "f32[2,3] and f32[4]"});
}

TEST(Verify, RejectsWrongArity) {
  Graph g = base();
  g.nodes[0].inputs.push_back(g.params[0]);
  expect_rejected(g, {"node #0 neg", "takes 1 operands, got 2"});
}

TEST(Verify, RejectsValueDefinedTwice) {
  Graph g = base();
  g.nodes[1].outputs[0] = g.nodes[0].outputs[0];
  expect_rejected(g, {"node #1 add", "defined twice"});
}

TEST(Verify, RejectsUndefinedResult) {
  Graph g = base();
  g.results[0] = 99;
  expect_rejected(g, {"result 0 (value id 99) is never defined"});
}

TEST(Verify, RejectsScanBodySignatureMismatch) {
  Graph g;
  g.name = "outer";
  Builder b(g);
  Tensor h = b.param("h", {DType::f32, {3}});
  Tensor xs = b.param("xs", {DType::f32, {4, 3}});
  auto body = [](Builder&, std::span<const Tensor>, std::span<const Tensor> hs, std::span<const Tensor> x) {
    return std::vector<Tensor>{hs[0] + x[0]};
  };
  b.result(scan(b, 4, {}, std::array{h}, std::array{xs}, body, "step")[0]);
  g.nodes[0].attrs.set("length", int64_t{5});
  expect_rejected(g, {"node #0 scan", "xs input 1 must be stacked [5, ...]"});
}

TEST(Verify, RejectsBadAttribute) {
  Graph g = base();
  Builder b(g);
  b.result(transpose(b.wrap(g.params[0]), {1, 0}));
  g.nodes.back().attrs.set("perm", IntList{0, 0});
  expect_rejected(g, {"node #2 transpose", "perm axis 0 appears twice"});
}

}  // namespace
}  // namespace remat::ir
