#include "ir/ir.h"

#include <gtest/gtest.h>

namespace remat::ir {
namespace {

TEST(Builder, TracesMlpAndPrintsIt) {
  Graph g;
  g.name = "mlp";
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {8, 64}});
  Tensor w = b.param("w", {DType::f32, {64, 256}});
  {
    auto s = b.scope("mlp");
    auto s2 = b.scope("wi_0");
    b.result(checkpoint_name(matmul(x, w), "mlpwi_0"));
  }
  EXPECT_EQ(print(g),
            "graph @mlp(%x: f32[8,64], %w: f32[64,256]) -> (f32[8,256]) {\n"
            "  %0: f32[8,256] = dot_general(%x, %w) {contract=[[1],[0]], batch=[[],[]]} scope=\"mlp/wi_0\"\n"
            "  %1: f32[8,256] = name(%0) {name=\"mlpwi_0\"} scope=\"mlp/wi_0\"\n"
            "  return %1\n"
            "}\n");
  EXPECT_EQ(print(parse(print(g))), print(g));
}

TEST(Builder, ShapeErrorNamesOpScopeAndShapes) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {8, 64}});
  Tensor w = b.param("w", {DType::f32, {32, 256}});
  auto s = b.scope("mlp/wi_0");
  try {
    matmul(x, w);
    FAIL() << "expected a shape error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("dot_general (scope 'mlp/wi_0')"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[8,64] x f32[32,256]"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace remat::ir
