// ir::ScanAttrs, the typed form of a scan's attributes: read from a parsed scan, written back as the
// builder's scans print, and a missing or mistyped attribute is an error naming it.
#include "ir/ir.h"

#include <gtest/gtest.h>

namespace remat::ir {
namespace {

TEST(ScanAttrs, ReadsAndWritesAScansAttributes) {
  const Graph g = parse(
      "graph @g(%w: f32[2], %h: f32[2], %xs: f32[3,2]) -> (f32[2]) {\n"
      "  %0: f32[2] = scan(%w, %h, %xs) {length=3, num_consts=1, num_carry=1, reverse=true}\n"
      "    graph @body(%w: f32[2], %h: f32[2], %x: f32[2]) -> (f32[2]) {\n"
      "      %0: f32[2] = mul(%h, %x)\n"
      "      return %0\n"
      "    }\n"
      "  return %0\n"
      "}\n");
  const ScanAttrs s = scan_attrs(g.nodes[0].attrs);
  EXPECT_EQ(s.length, 3);
  EXPECT_EQ(s.num_consts, 1);
  EXPECT_EQ(s.num_carry, 1);
  EXPECT_TRUE(s.reverse);
  Attrs written;
  s.write(written);
  EXPECT_EQ(written, g.nodes[0].attrs) << "the same keys, values and order";
  Attrs narrower = written;
  ScanAttrs{.length = 3, .num_consts = 0, .num_carry = 1, .reverse = true}.write(narrower);
  EXPECT_EQ(narrower.items()[1].first, "num_consts") << "rewritten in place";
  EXPECT_EQ(scan_attrs(narrower).num_consts, 0);
}

// scan_attrs' error message for `a`, or "" when it reads them.
std::string error_of(const Attrs& a) {
  try {
    scan_attrs(a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ScanAttrs, AMissingOrMistypedAttributeIsNamed) {
  Attrs a;
  a.set("length", int64_t{3}).set("num_consts", int64_t{0}).set("num_carry", int64_t{1});
  EXPECT_EQ(error_of(a), "missing attribute 'reverse'");
  a.set("reverse", int64_t{1});
  EXPECT_EQ(error_of(a), "attribute 'reverse' is an integer, expected a boolean");
  a.set("reverse", false);
  EXPECT_EQ(error_of(a), "");
}

}  // namespace
}  // namespace remat::ir
