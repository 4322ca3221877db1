// sink_converts_into_scans: IR text in, IR text out.
#include "ir/ir.h"

#include <gtest/gtest.h>

namespace remat::ir {
namespace {

std::string sunk(const std::string& text) {
  Graph g = parse(text);
  sink_converts_into_scans(g);
  dce(g);
  verify(g);
  return print(g);
}

// A scan whose stacked bf16 y is widened after the loop (the bwd scan of mp_cast=upfront's weight
// gradients): the body widens each y as its last node and the scan stacks f32 directly.
TEST(SinkConverts, WideningConvertOfAStackedOutputMovesIntoTheBody) {
  const std::string in =
      "graph @g(%c: f32[2], %xs: bf16[3,2]) -> (f32[2], f32[3,2]) {\n"
      "  %0: f32[2], %1: bf16[3,2] = scan(%c, %xs) {length=3, num_consts=0, num_carry=1, reverse=false}\n"
      "    graph @body(%h: f32[2], %x: bf16[2]) -> (f32[2], bf16[2]) {\n"
      "      %0: bf16[2] = neg(%x)\n"
      "      %1: f32[2] = tanh(%h)\n"
      "      return %1, %0\n"
      "    }\n"
      "  %2: f32[3,2] = convert_element_type(%1) {dtype=f32} scope=\"grad\"\n"
      "  return %0, %2\n"
      "}\n";
  const std::string out =
      "graph @g(%c: f32[2], %xs: bf16[3,2]) -> (f32[2], f32[3,2]) {\n"
      "  %0: f32[2], %1: f32[3,2] = scan(%c, %xs) {length=3, num_consts=0, num_carry=1, reverse=false}\n"
      "    graph @body(%h: f32[2], %x: bf16[2]) -> (f32[2], f32[2]) {\n"
      "      %0: bf16[2] = neg(%x)\n"
      "      %1: f32[2] = tanh(%h)\n"
      "      %2: f32[2] = convert_element_type(%0) {dtype=f32} scope=\"grad\"\n"
      "      return %1, %2\n"
      "    }\n"
      "  return %0, %1\n"
      "}\n";
  EXPECT_EQ(sunk(in), out);
}

// Through reshapes (the double scan's [groups, layers, ...] gradients viewed as [L, ...]).
TEST(SinkConverts, LooksThroughSingleUseReshapes) {
  const std::string in =
      "graph @g(%xs: bf16[2,3,4]) -> (f32[6,4]) {\n"
      "  %0: bf16[2,3,4] = scan(%xs) {length=2, num_consts=0, num_carry=0, reverse=false}\n"
      "    graph @body(%x: bf16[3,4]) -> (bf16[3,4]) {\n"
      "      %0: bf16[3,4] = exp(%x)\n"
      "      return %0\n"
      "    }\n"
      "  %1: bf16[6,4] = reshape(%0) {shape=[6,4]}\n"
      "  %2: f32[6,4] = convert_element_type(%1) {dtype=f32}\n"
      "  return %2\n"
      "}\n";
  const std::string out =
      "graph @g(%xs: bf16[2,3,4]) -> (f32[6,4]) {\n"
      "  %0: f32[2,3,4] = scan(%xs) {length=2, num_consts=0, num_carry=0, reverse=false}\n"
      "    graph @body(%x: bf16[3,4]) -> (f32[3,4]) {\n"
      "      %0: bf16[3,4] = exp(%x)\n"
      "      %1: f32[3,4] = convert_element_type(%0) {dtype=f32}\n"
      "      return %1\n"
      "    }\n"
      "  %1: f32[6,4] = reshape(%0) {shape=[6,4]}\n"
      "  return %1\n"
      "}\n";
  EXPECT_EQ(sunk(in), out);
}

// Left alone: a stack read by anything besides the convert (it must exist in its own dtype), and a
// converted final carry (carries are not stacked).
TEST(SinkConverts, LeavesSharedStacksAndCarriesAlone) {
  const std::string in =
      "graph @g(%c: bf16[2], %xs: bf16[3,2]) -> (f32[2], f32[3,2], bf16[3,2]) {\n"
      "  %0: bf16[2], %1: bf16[3,2] = scan(%c, %xs) {length=3, num_consts=0, num_carry=1, reverse=false}\n"
      "    graph @body(%h: bf16[2], %x: bf16[2]) -> (bf16[2], bf16[2]) {\n"
      "      %0: bf16[2] = add(%h, %x)\n"
      "      return %0, %0\n"
      "    }\n"
      "  %2: f32[2] = convert_element_type(%0) {dtype=f32}\n"
      "  %3: f32[3,2] = convert_element_type(%1) {dtype=f32}\n"
      "  return %2, %3, %1\n"
      "}\n";
  EXPECT_EQ(sunk(in), in);
}

// A sunk convert's readers move to the stack: a second convert may then sink only if the stack has no
// other reader (here the f32 stack is also negated, so the f16 convert stays outside).
TEST(SinkConverts, ReadersOfASunkConvertKeepTheStackInItsNewDtype) {
  const std::string in =
      "graph @g(%xs: bf16[3,2]) -> (f16[3,2], f32[3,2]) {\n"
      "  %0: bf16[3,2] = scan(%xs) {length=3, num_consts=0, num_carry=0, reverse=false}\n"
      "    graph @body(%x: bf16[2]) -> (bf16[2]) {\n"
      "      %0: bf16[2] = exp(%x)\n"
      "      return %0\n"
      "    }\n"
      "  %1: f32[3,2] = convert_element_type(%0) {dtype=f32}\n"
      "  %2: f16[3,2] = convert_element_type(%1) {dtype=f16}\n"
      "  %3: f32[3,2] = neg(%1)\n"
      "  return %2, %3\n"
      "}\n";
  const std::string out =
      "graph @g(%xs: bf16[3,2]) -> (f16[3,2], f32[3,2]) {\n"
      "  %0: f32[3,2] = scan(%xs) {length=3, num_consts=0, num_carry=0, reverse=false}\n"
      "    graph @body(%x: bf16[2]) -> (f32[2]) {\n"
      "      %0: bf16[2] = exp(%x)\n"
      "      %1: f32[2] = convert_element_type(%0) {dtype=f32}\n"
      "      return %1\n"
      "    }\n"
      "  %1: f16[3,2] = convert_element_type(%0) {dtype=f16}\n"
      "  %2: f32[3,2] = neg(%0)\n"
      "  return %1, %2\n"
      "}\n";
  EXPECT_EQ(sunk(in), out);
}

// A convert sunk into an outer scan's body sinks again into the inner scan it reads (the double scan's
// layer groups).
TEST(SinkConverts, CascadesIntoNestedScans) {
  const std::string in =
      "graph @g(%xs: bf16[2,3,4]) -> (f32[2,3,4]) {\n"
      "  %0: bf16[2,3,4] = scan(%xs) {length=2, num_consts=0, num_carry=0, reverse=false}\n"
      "    graph @group(%x: bf16[3,4]) -> (bf16[3,4]) {\n"
      "      %0: bf16[3,4] = scan(%x) {length=3, num_consts=0, num_carry=0, reverse=false}\n"
      "        graph @layer(%y: bf16[4]) -> (bf16[4]) {\n"
      "          %0: bf16[4] = exp(%y)\n"
      "          return %0\n"
      "        }\n"
      "      return %0\n"
      "    }\n"
      "  %1: f32[2,3,4] = convert_element_type(%0) {dtype=f32}\n"
      "  return %1\n"
      "}\n";
  const std::string out =
      "graph @g(%xs: bf16[2,3,4]) -> (f32[2,3,4]) {\n"
      "  %0: f32[2,3,4] = scan(%xs) {length=2, num_consts=0, num_carry=0, reverse=false}\n"
      "    graph @group(%x: bf16[3,4]) -> (f32[3,4]) {\n"
      "      %0: f32[3,4] = scan(%x) {length=3, num_consts=0, num_carry=0, reverse=false}\n"
      "        graph @layer(%y: bf16[4]) -> (f32[4]) {\n"
      "          %0: bf16[4] = exp(%y)\n"
      "          %1: f32[4] = convert_element_type(%0) {dtype=f32}\n"
      "          return %1\n"
      "        }\n"
      "      return %0\n"
      "    }\n"
      "  return %0\n"
      "}\n";
  EXPECT_EQ(sunk(in), out);
}

}  // namespace
}  // namespace remat::ir
