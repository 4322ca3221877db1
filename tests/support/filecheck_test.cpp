#include "support/filecheck.h"

#include <gtest/gtest.h>

namespace remat::testing_support {
namespace {

TEST(FileCheck, MatchesInOrderAndRejectsWhatIsMissing) {
  std::string out = "a 1\nb 2\nc 3\n";
  EXPECT_EQ(filecheck("// CHECK: a\n// CHECK-NEXT: b\n// CHECK: c", out), "");
  EXPECT_NE(filecheck("// CHECK: b\n// CHECK: a", out), "");        // order matters
  EXPECT_NE(filecheck("// CHECK: a\n// CHECK-NEXT: c", out), "");   // not adjacent
  EXPECT_NE(filecheck("// CHECK: a\n// CHECK-NOT: b\n// CHECK: c", out), "");
  EXPECT_EQ(filecheck("// CHECK: a\n// CHECK-NOT: z\n// CHECK: c", out), "");
  EXPECT_NE(filecheck("no directives", out), "");
}

}  // namespace
}  // namespace remat::testing_support
