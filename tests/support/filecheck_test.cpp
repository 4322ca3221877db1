#include "support/filecheck.h"

#include <gtest/gtest.h>

namespace remat::testing_support {
namespace {

TEST(FileCheck, MatchesInOrderAndRejectsWhatIsMissing) {
  std::string out = "a 1\nb 2\nc 3\n";
  EXPECT_EQ(filecheck("// CHECK: a\n// CHECK-NEXT: b\n// CHECK: c", out), "");
  EXPECT_NE(filecheck("// CHECK: b\n// CHECK: a", out), "");        // order matters
  EXPECT_NE(filecheck("// CHECK: a\n// CHECK-NEXT: c", out), "");   // not adjacent
  EXPECT_NE(filecheck("no directives", out), "");
}

// A CHECK-NOT covers the lines strictly between the matches around it, and the rest of the output when
// it comes last.
TEST(FileCheck, CheckNotWindowIsBetweenTheSurroundingMatches) {
  std::string out = "a\nx\nb\nc\nx\n";
  EXPECT_NE(filecheck("// CHECK: a\n// CHECK-NOT: x\n// CHECK: b", out), "");  // x on the line between
  EXPECT_EQ(filecheck("// CHECK: b\n// CHECK-NOT: x\n// CHECK: c", out), "");  // the window is empty
  EXPECT_EQ(filecheck("// CHECK: a\n// CHECK-NOT: z\n// CHECK: c", out), "");
  EXPECT_NE(filecheck("// CHECK: c\n// CHECK-NOT: x", out), "");                // to the end of the output
  EXPECT_NE(filecheck("// CHECK-NOT: x\n// CHECK: b", out), "");                // from the start
  EXPECT_EQ(filecheck("// CHECK-NOT: x\n// CHECK: a", out), "");
  // A CHECK-NOT right before a CHECK-NEXT has an empty window: it cannot fail, whatever it names.
  EXPECT_EQ(filecheck("// CHECK: a\n// CHECK-NOT: x\n// CHECK-NEXT: x", out), "");
}

TEST(FileCheck, CapturesBindValuesAndLaterUsesMustMatchThem) {
  std::string out = "%3 = tanh(%1)\n%4 = mul(%3, %3)\n%5 = add(%4, %1)\n";
  EXPECT_EQ(filecheck("// CHECK: [[T:%[0-9]+]] = tanh([[X:%[0-9]+]])\n"
                      "// CHECK-NEXT: mul([[T]], [[T]])\n"
                      "// CHECK-NEXT: add({{%[0-9]+}}, [[X]])",
                      out),
            "");
  EXPECT_NE(filecheck("// CHECK: [[T:%[0-9]+]] = tanh([[X:%[0-9]+]])\n// CHECK: add({{%[0-9]+}}, [[T]])", out), "");
  EXPECT_EQ(filecheck("// CHECK: mul([[A:%[0-9]+]], [[A]])", out), "") << "a use in the pattern that binds it";
  EXPECT_NE(filecheck("// CHECK: add([[A:%[0-9]+]], [[A]])", out), "");
  EXPECT_NE(filecheck("// CHECK: mul([[NOPE]], %3)", out), "") << "a use before any binding";
  // A CHECK-NOT uses the bindings made before it.
  EXPECT_NE(filecheck("// CHECK: [[T:%[0-9]+]] = tanh\n// CHECK-NOT: mul([[T]]\n// CHECK: add", out), "");
  EXPECT_EQ(filecheck("// CHECK: [[T:%[0-9]+]] = tanh\n// CHECK-NOT: mul(%9\n// CHECK: add", out), "");
  // Brackets that do not open a variable are literal (IR attributes).
  EXPECT_EQ(filecheck("// CHECK: {contract=[[1],[0]], batch=[[],[]]} (x.y)", "d {contract=[[1],[0]], batch=[[],[]]} (x.y)"), "");
  EXPECT_NE(filecheck("// CHECK: (x.y)", "(xzy)"), "") << "regex characters in literal text are literal";
}

}  // namespace
}  // namespace remat::testing_support
