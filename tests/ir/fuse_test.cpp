// ir::fuse: IR text in, IR text out; and what a fusion's body may hold (the fusion op's shape rule).
#include "ir/ir.h"

#include <gtest/gtest.h>

#include "support/error_of.h"

namespace remat::ir {
namespace {

std::string fused(const std::string& text) {
  Graph g = parse(text);
  fuse(g);
  verify(g);
  return print(g);
}

// RMSNorm's scaling: x * rsqrt(mean + eps) * w, with eps, the row statistic and the weight broadcast. The
// three elementwise ops and the three broadcasts they read become one fusion that reads x, the row
// statistic, eps and w; no [4,8] intermediate or broadcast is left. The reduction stays outside.
TEST(Fuse, AChainWithTheBroadcastsItReadsIsOneFusion) {
  const std::string in =
      "graph @g(%x: f32[4,8], %w: f32[8]) -> (f32[4,8]) {\n"
      "  %0: f32[4,8] = mul(%x, %x)\n"
      "  %1: f32[4] = reduce_sum(%0) {axes=[1]}\n"
      "  %2: f32[] = full() {dtype=f32, shape=[], value=1e-06}\n"
      "  %3: f32[4,8] = broadcast_in_dim(%1) {shape=[4,8], dims=[0]}\n"
      "  %4: f32[4,8] = broadcast_in_dim(%2) {shape=[4,8], dims=[]}\n"
      "  %5: f32[4,8] = add(%3, %4)\n"
      "  %6: f32[4,8] = rsqrt(%5)\n"
      "  %7: f32[4,8] = mul(%x, %6)\n"
      "  %8: f32[4,8] = broadcast_in_dim(%w) {shape=[4,8], dims=[1]}\n"
      "  %9: f32[4,8] = mul(%7, %8) scope=\"norm\"\n"
      "  return %9\n"
      "}\n";
  const std::string out =
      "graph @g(%x: f32[4,8], %w: f32[8]) -> (f32[4,8]) {\n"
      "  %0: f32[4,8] = mul(%x, %x)\n"
      "  %1: f32[4] = reduce_sum(%0) {axes=[1]}\n"
      "  %2: f32[] = full() {dtype=f32, shape=[], value=1e-06}\n"
      "  %3: f32[4,8] = fusion(%1, %2, %x, %w) scope=\"norm\"\n"
      "    graph @fusion0(%x0: f32[4], %x1: f32[], %x2: f32[4,8], %x3: f32[8]) -> (f32[4,8]) {\n"
      "      %0: f32[4,8] = broadcast_in_dim(%x0) {shape=[4,8], dims=[0]}\n"
      "      %1: f32[4,8] = broadcast_in_dim(%x1) {shape=[4,8], dims=[]}\n"
      "      %2: f32[4,8] = add(%0, %1)\n"
      "      %3: f32[4,8] = rsqrt(%2)\n"
      "      %4: f32[4,8] = mul(%x2, %3)\n"
      "      %5: f32[4,8] = broadcast_in_dim(%x3) {shape=[4,8], dims=[1]}\n"
      "      %6: f32[4,8] = mul(%4, %5) scope=\"norm\"\n"
      "      return %6\n"
      "    }\n"
      "  return %3\n"
      "}\n";
  EXPECT_EQ(fused(in), out);
}

// A value read outside its chain closes the chain: it becomes the fusion's output, and what reads it later
// starts a new fusion. Here exp's result feeds a reduction (softmax's sum) and the division after it.
TEST(Fuse, AValueReadOutsideIsAnOutputAndClosesTheFusion) {
  const std::string in =
      "graph @g(%x: f32[2,3], %m: f32[2]) -> (f32[2,3]) {\n"
      "  %0: f32[2,3] = broadcast_in_dim(%m) {shape=[2,3], dims=[0]}\n"
      "  %1: f32[2,3] = sub(%x, %0)\n"
      "  %2: f32[2,3] = exp(%1)\n"
      "  %3: f32[2] = reduce_sum(%2) {axes=[1]}\n"
      "  %4: f32[2,3] = broadcast_in_dim(%3) {shape=[2,3], dims=[0]}\n"
      "  %5: f32[2,3] = div(%2, %4)\n"
      "  %6: f32[2,3] = neg(%5)\n"
      "  return %6\n"
      "}\n";
  const std::string out =
      "graph @g(%x: f32[2,3], %m: f32[2]) -> (f32[2,3]) {\n"
      "  %0: f32[2,3] = fusion(%x, %m)\n"
      "    graph @fusion0(%x0: f32[2,3], %x1: f32[2]) -> (f32[2,3]) {\n"
      "      %0: f32[2,3] = broadcast_in_dim(%x1) {shape=[2,3], dims=[0]}\n"
      "      %1: f32[2,3] = sub(%x0, %0)\n"
      "      %2: f32[2,3] = exp(%1)\n"
      "      return %2\n"
      "    }\n"
      "  %1: f32[2] = reduce_sum(%0) {axes=[1]}\n"
      "  %2: f32[2,3] = fusion(%0, %1)\n"
      "    graph @fusion1(%x0: f32[2,3], %x1: f32[2]) -> (f32[2,3]) {\n"
      "      %0: f32[2,3] = broadcast_in_dim(%x1) {shape=[2,3], dims=[0]}\n"
      "      %1: f32[2,3] = div(%x0, %0)\n"
      "      %2: f32[2,3] = neg(%1)\n"
      "      return %2\n"
      "    }\n"
      "  return %2\n"
      "}\n";
  EXPECT_EQ(fused(in), out);
}

// Ops of another shape, a lone op without a broadcast, recomputes beside non-recomputes, and chains on either
// side of an effectful op stay apart; a scan body is fused inside.
TEST(Fuse, ShapesRecomputesEffectsAndScanBodies) {
  const std::string in =
      "graph @g(%x: f32[4], %y: f32[2], %c: f32[4]) -> (f32[4], f32[2], f32[4], f32[4]) {\n"
      "  %0: f32[2] = exp(%y)\n"
      "  %1: f32[4] = tanh(%x)\n"
      "  %2: f32[4] = tanh.remat(%x)\n"
      "  %3: f32[4] = add(%1, %2)\n"
      "  %4: f32[4] = check_finite(%3)\n"
      "  %5: f32[4] = neg(%4)\n"
      "  %6: f32[4] = exp(%5)\n"
      "  %7: f32[4] = scan(%c) {length=1, num_consts=0, num_carry=1, reverse=false}\n"
      "    graph @body(%h: f32[4]) -> (f32[4]) {\n"
      "      %0: f32[4] = sin(%h)\n"
      "      %1: f32[4] = cos(%0)\n"
      "      return %1\n"
      "    }\n"
      "  return %3, %0, %6, %7\n"
      "}\n";
  const std::string out =
      "graph @g(%x: f32[4], %y: f32[2], %c: f32[4]) -> (f32[4], f32[2], f32[4], f32[4]) {\n"
      "  %0: f32[2] = exp(%y)\n"
      "  %1: f32[4] = tanh.remat(%x)\n"
      "  %2: f32[4] = fusion(%x, %1)\n"
      "    graph @fusion0(%x0: f32[4], %x1: f32[4]) -> (f32[4]) {\n"
      "      %0: f32[4] = tanh(%x0)\n"
      "      %1: f32[4] = add(%0, %x1)\n"
      "      return %1\n"
      "    }\n"
      "  %3: f32[4] = check_finite(%2)\n"
      "  %4: f32[4] = fusion(%3)\n"
      "    graph @fusion1(%x0: f32[4]) -> (f32[4]) {\n"
      "      %0: f32[4] = neg(%x0)\n"
      "      %1: f32[4] = exp(%0)\n"
      "      return %1\n"
      "    }\n"
      "  %5: f32[4] = scan(%c) {length=1, num_consts=0, num_carry=1, reverse=false}\n"
      "    graph @body(%h: f32[4]) -> (f32[4]) {\n"
      "      %0: f32[4] = fusion(%h)\n"
      "        graph @fusion0(%x0: f32[4]) -> (f32[4]) {\n"
      "          %0: f32[4] = sin(%x0)\n"
      "          %1: f32[4] = cos(%0)\n"
      "          return %1\n"
      "        }\n"
      "      return %0\n"
      "    }\n"
      "  return %2, %0, %4, %5\n"
      "}\n";
  EXPECT_EQ(fused(in), out);
}

std::string fusion_error(const std::string& body, const std::string& result = "f32[4]") {
  return testing_support::error_of([&] {
    parse("graph @g(%x: f32[4], %s: f32[]) -> (" + result + ") {\n"
          "  %0: " + result + " = fusion(%x, %s)\n"
          "    graph @f(%a: f32[4], %b: f32[]) -> (" + result + ") {\n" + body +
          "    }\n"
          "  return %0\n"
          "}\n");
  });
}

TEST(FusionBody, HoldsOnlyWhatItsKernelRuns) {
  EXPECT_EQ(fusion_error("%0: f32[4] = broadcast_in_dim(%b) {shape=[4], dims=[]}\n%1: f32[4] = add(%a, %0)\nreturn %1\n"), "");
  EXPECT_NE(fusion_error("%0: f32[] = reduce_sum(%a) {axes=[0]}\nreturn %0\n", "f32[]")
                .find("a fusion holds elementwise ops, broadcasts of its params, iotas and fulls only"),
            std::string::npos);
  EXPECT_NE(fusion_error("%0: f32[] = neg(%b)\n%1: f32[4] = broadcast_in_dim(%0) {shape=[4], dims=[]}\nreturn %1\n")
                .find("every value a fusion computes has its loop shape [4]"),
            std::string::npos);
  EXPECT_NE(fusion_error("%0: f32[4] = neg(%a)\n%1: f32[4] = broadcast_in_dim(%0) {shape=[4], dims=[0]}\nreturn %1\n")
                .find("a fused broadcast reads a param"),
            std::string::npos);
  EXPECT_NE(fusion_error("return %a\n").find("a fusion's results are distinct values its body computes"), std::string::npos);
}

}  // namespace
}  // namespace remat::ir
