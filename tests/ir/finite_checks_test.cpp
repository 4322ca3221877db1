// insert_finite_checks: IR text in, IR text out, then run: the first failing check names the first op
// whose output is not finite.
#include "exec/exec.h"
#include "ir/ir.h"

#include <gtest/gtest.h>

namespace remat::ir {
namespace {

// Every float value an op computes is checked right after it and read through the check; integer and
// view outputs are not checked; a scan body gets its own checks; results are the checked values.
TEST(FiniteChecks, EveryFloatOpIsCheckedBeforeItsValueIsRead) {
  Graph g = parse(
      "graph @g(%x: f32[2], %i: i32[2], %xs: f32[3,2]) -> (f32[2], i32[2], f32[2]) {\n"
      "  %0: f32[2] = log(%x) scope=\"a\"\n"
      "  %1: f32[2] = name(%0) {name=\"query_proj\"}\n"
      "  %2: i32[2] = add(%i, %i)\n"
      "  %3: f32[2] = scan(%1, %xs) {length=3, num_consts=0, num_carry=1, reverse=false}\n"
      "    graph @body(%h: f32[2], %y: f32[2]) -> (f32[2]) {\n"
      "      %0: f32[2] = mul(%h, %y)\n"
      "      return %0\n"
      "    }\n"
      "  %4: f32[2] = exp(%1)\n"
      "  return %3, %2, %4\n"
      "}\n");
  insert_finite_checks(g);
  verify(g);
  EXPECT_EQ(print(g),
            "graph @g(%x: f32[2], %i: i32[2], %xs: f32[3,2]) -> (f32[2], i32[2], f32[2]) {\n"
            "  %0: f32[2] = log(%x) scope=\"a\"\n"
            "  %1: f32[2] = check_finite(%0) {of=\"log (scope 'a'), checkpoint name 'query_proj'\"} scope=\"a\"\n"
            "  %2: f32[2] = name(%1) {name=\"query_proj\"}\n"
            "  %3: i32[2] = add(%i, %i)\n"
            "  %4: f32[2] = scan(%2, %xs) {length=3, num_consts=0, num_carry=1, reverse=false}\n"
            "    graph @body(%h: f32[2], %y: f32[2]) -> (f32[2]) {\n"
            "      %0: f32[2] = mul(%h, %y)\n"
            "      %1: f32[2] = check_finite(%0) {of=\"mul\"}\n"
            "      return %1\n"
            "    }\n"
            "  %5: f32[2] = exp(%2)\n"
            "  %6: f32[2] = check_finite(%5) {of=\"exp\"}\n"
            "  return %4, %3, %6\n"
            "}\n");
  // log(0) = -inf is the first non-finite value; exp(-inf) = 0 would hide it from a check of the results.
  exec::Array x = exec::Array::from<float>({2}, {1, 0}), i = exec::Array::from<int32_t>({2}, {1, 2});
  exec::Array xs = exec::Array::from<float>({3, 2}, {1, 1, 1, 1, 1, 1});
  try {
    exec::run(g, std::vector<exec::Array>{x, i, xs});
    FAIL() << "the check of log passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("element 1 of f32[2] is -inf, the output of log (scope 'a'), checkpoint name 'query_proj'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace remat::ir
