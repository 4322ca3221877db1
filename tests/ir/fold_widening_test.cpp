// fold_widening_converts: IR text in, IR text out.
#include "ir/ir.h"
#include "support/error_of.h"

#include <gtest/gtest.h>

namespace remat::ir {
namespace {

std::string folded(const std::string& text, bool changes = true) {
  Graph g = parse(text);
  EXPECT_EQ(fold_widening_converts(g), changes);
  verify(g);
  return print(g);
}

// The optimizer's scalars and a parameter with its moments, for the adamw nodes below.
const std::string kOptimizerParams = "%p: f32[3,2], %m: f32[3,2], %v: f32[3,2], %s: f32[], %lr: f32[], %b: f32[]";
const std::string kAdamwAttrs = "{b1=0.9, b2=0.95, eps=1e-08, weight_decay=0.1}";

// A bf16 gradient widened for the norm's sum of squares and AdamW alone: both read it narrow, the convert goes.
TEST(FoldWidening, AWidenedGradientIsReadNarrow) {
  const std::string in =
      "graph @g(%x: bf16[3,2], " + kOptimizerParams + ") -> (f32[3], f32[3,2], f32[3,2], f32[3,2]) {\n"
      "  %0: bf16[3,2] = exp(%x)\n"
      "  %1: f32[3,2] = convert_element_type(%0) {dtype=f32}\n"
      "  %2: f32[3] = sum_of_squares(%1) {axes=[1]}\n"
      "  %3: f32[3,2], %4: f32[3,2], %5: f32[3,2] = adamw(%p, %m, %v, %1, %s, %lr, %b, %b) " + kAdamwAttrs + "\n"
      "  return %2, %3, %4, %5\n"
      "}\n";
  const std::string out =
      "graph @g(%x: bf16[3,2], " + kOptimizerParams + ") -> (f32[3], f32[3,2], f32[3,2], f32[3,2]) {\n"
      "  %0: bf16[3,2] = exp(%x)\n"
      "  %1: f32[3] = sum_of_squares(%0) {axes=[1], dtype=f32}\n"
      "  %2: f32[3,2], %3: f32[3,2], %4: f32[3,2] = adamw(%p, %m, %v, %0, %s, %lr, %b, %b) " + kAdamwAttrs + "\n"
      "  return %1, %2, %3, %4\n"
      "}\n";
  EXPECT_EQ(folded(in), out);
}

// The backward scan's weight gradients, widened in the body as its last act: the body gives them narrow, the
// stack is bf16, and the readers widen it.
TEST(FoldWidening, AScanWideningItsStackedGradientStacksItNarrow) {
  const std::string in =
      "graph @g(%c: f32[2], %xs: bf16[3,2], " + kOptimizerParams + ") -> (f32[2], f32[3], f32[3,2]) {\n"
      "  %0: f32[2], %1: f32[3,2] = scan(%c, %xs) {length=3, num_consts=0, num_carry=1, reverse=true}\n"
      "    graph @body(%h: f32[2], %x: bf16[2]) -> (f32[2], f32[2]) {\n"
      "      %0: bf16[2] = neg(%x)\n"
      "      %1: f32[2] = tanh(%h)\n"
      "      %2: f32[2] = convert_element_type(%0) {dtype=f32}\n"
      "      return %1, %2\n"
      "    }\n"
      "  %2: f32[3] = sum_of_squares(%1, %s) {axes=[1]}\n"
      "  %3: f32[3,2], %4: f32[3,2], %5: f32[3,2] = adamw(%p, %m, %v, %1, %s, %lr, %b, %b) " + kAdamwAttrs + "\n"
      "  return %0, %2, %3\n"
      "}\n";
  const std::string out =
      "graph @g(%c: f32[2], %xs: bf16[3,2], " + kOptimizerParams + ") -> (f32[2], f32[3], f32[3,2]) {\n"
      "  %0: f32[2], %1: bf16[3,2] = scan(%c, %xs) {length=3, num_consts=0, num_carry=1, reverse=true}\n"
      "    graph @body(%h: f32[2], %x: bf16[2]) -> (f32[2], bf16[2]) {\n"
      "      %0: bf16[2] = neg(%x)\n"
      "      %1: f32[2] = tanh(%h)\n"
      "      return %1, %0\n"
      "    }\n"
      "  %2: f32[3] = sum_of_squares(%1, %s) {axes=[1], dtype=f32}\n"
      "  %3: f32[3,2], %4: f32[3,2], %5: f32[3,2] = adamw(%p, %m, %v, %1, %s, %lr, %b, %b) " + kAdamwAttrs + "\n"
      "  return %0, %2, %3\n"
      "}\n";
  EXPECT_EQ(folded(in), out);
}

// Left alone: a widened value with another reader (an accumulation, a collective: it must exist wide) or that is
// a result; a narrowing convert; a carry; a body whose widened y it also reads.
TEST(FoldWidening, LeavesValuesThatMustExistWideAlone) {
  const std::string in =
      "graph @g(%x: bf16[3,2], %y: f32[3,2], %c: f32[2], %xs: bf16[3,2], " + kOptimizerParams +
      ") -> (f32[3], f32[3,2], bf16[3], f32[3], f32[3], f32[3,2], f32[3]) {\n"
      "  %0: f32[3,2] = convert_element_type(%x) {dtype=f32}\n"
      "  %1: f32[3,2] = add(%0, %y)\n"
      "  %2: f32[3] = sum_of_squares(%0) {axes=[1]}\n"
      "  %3: bf16[3,2] = convert_element_type(%y) {dtype=bf16}\n"
      "  %4: bf16[3] = sum_of_squares(%3) {axes=[1]}\n"
      "  %5: f32[2], %6: f32[3,2] = scan(%c, %xs) {length=3, num_consts=0, num_carry=1, reverse=false}\n"
      "    graph @body(%h: f32[2], %x: bf16[2]) -> (f32[2], f32[2]) {\n"
      "      %0: f32[2] = convert_element_type(%x) {dtype=f32}\n"
      "      %1: f32[2] = convert_element_type(%x) {dtype=f32}\n"
      "      %2: f32[2] = neg(%1)\n"
      "      return %0, %1\n"
      "    }\n"
      "  %7: f32[] = sum_of_squares(%5) {axes=[0]}\n"
      "  %8: f32[3] = sum_of_squares(%6) {axes=[1]}\n"
      "  %9: f32[3] = reduce_sum(%1) {axes=[1]}\n"
      "  %10: f32[3,2] = convert_element_type(%x) {dtype=f32}\n"
      "  %11: f32[3] = sum_of_squares(%10) {axes=[1]}\n"
      "  return %2, %1, %4, %8, %9, %10, %11\n"
      "}\n";
  EXPECT_EQ(folded(in, false), print(parse(in)));
}

// An f16 parameter widened: its readers read the parameter. Left alone: a widened value AdamW reads as a moment
// (not its gradient), one a sum of squares already widening reads, and a stack whose body returns the widened y
// twice.
TEST(FoldWidening, ReadsOnlyGradientsAndWholeBodyResults) {
  const std::string in =
      "graph @g(%h: f16[3,2], %x: bf16[3,2], %xs: bf16[3,2], " + kOptimizerParams +
      ") -> (f32[], f32[3,2], f32[3], f32[3], f32[3], f64[3]) {\n"
      "  %0: f32[3,2] = convert_element_type(%h) {dtype=f32}\n"
      "  %1: f32[] = sum_of_squares(%0) {axes=[0,1]}\n"
      "  %2: f32[3,2] = convert_element_type(%x) {dtype=f32}\n"
      "  %3: f32[3,2], %4: f32[3,2], %5: f32[3,2] = adamw(%p, %2, %v, %p, %s, %lr, %b, %b) " + kAdamwAttrs + "\n"
      "  %6: f32[3,2] = convert_element_type(%x) {dtype=f32}\n"
      "  %7: f64[3] = sum_of_squares(%6) {axes=[1], dtype=f64}\n"
      "  %8: f32[3,2], %9: f32[3,2] = scan(%xs) {length=3, num_consts=0, num_carry=0, reverse=false}\n"
      "    graph @body(%y: bf16[2]) -> (f32[2], f32[2]) {\n"
      "      %0: f32[2] = convert_element_type(%y) {dtype=f32}\n"
      "      return %0, %0\n"
      "    }\n"
      "  %10: f32[3] = sum_of_squares(%8) {axes=[1]}\n"
      "  %11: f32[3] = sum_of_squares(%9) {axes=[1]}\n"
      "  %12: f32[3] = reduce_sum(%3) {axes=[1]}\n"
      "  return %1, %4, %10, %11, %12, %7\n"
      "}\n";
  const std::string out =
      "graph @g(%h: f16[3,2], %x: bf16[3,2], %xs: bf16[3,2], " + kOptimizerParams +
      ") -> (f32[], f32[3,2], f32[3], f32[3], f32[3], f64[3]) {\n"
      "  %0: f32[] = sum_of_squares(%h) {axes=[0,1], dtype=f32}\n"
      "  %1: f32[3,2] = convert_element_type(%x) {dtype=f32}\n"
      "  %2: f32[3,2], %3: f32[3,2], %4: f32[3,2] = adamw(%p, %1, %v, %p, %s, %lr, %b, %b) " + kAdamwAttrs + "\n"
      "  %5: f32[3,2] = convert_element_type(%x) {dtype=f32}\n"
      "  %6: f64[3] = sum_of_squares(%5) {axes=[1], dtype=f64}\n"
      "  %7: f32[3,2], %8: f32[3,2] = scan(%xs) {length=3, num_consts=0, num_carry=0, reverse=false}\n"
      "    graph @body(%y: bf16[2]) -> (f32[2], f32[2]) {\n"
      "      %0: f32[2] = convert_element_type(%y) {dtype=f32}\n"
      "      return %0, %0\n"
      "    }\n"
      "  %9: f32[3] = sum_of_squares(%7) {axes=[1]}\n"
      "  %10: f32[3] = sum_of_squares(%8) {axes=[1]}\n"
      "  %11: f32[3] = reduce_sum(%2) {axes=[1]}\n"
      "  return %0, %3, %9, %10, %11, %6\n"
      "}\n";
  EXPECT_EQ(folded(in), out);
}

// The readers' widening is checked where the IR is: a sum of squares that narrows, or an adamw gradient wider than
// its parameter, is refused with the rule's words.
TEST(FoldWidening, TheReadersRefuseAnythingButAnExactWidening) {
  const std::string narrowing =
      "graph @g(%x: f32[3]) -> (bf16[]) {\n"
      "  %0: bf16[] = sum_of_squares(%x) {axes=[0], dtype=bf16}\n"
      "  return %0\n"
      "}\n";
  EXPECT_NE(testing_support::error_of([&] { verify(parse(narrowing)); }).find("must hold every value of x"),
            std::string::npos);
  const std::string wider =
      "graph @g(%p: bf16[2], %m: bf16[2], %v: bf16[2], %q: f32[2], %s: f32[]) -> (bf16[2]) {\n"
      "  %0: bf16[2], %1: bf16[2], %2: bf16[2] = adamw(%p, %m, %v, %q, %s, %s, %s, %s) " + kAdamwAttrs + "\n"
      "  return %0\n"
      "}\n";
  EXPECT_NE(testing_support::error_of([&] { verify(parse(wider)); }).find("a narrower float that it holds exactly"),
            std::string::npos);
}

}  // namespace
}  // namespace remat::ir
