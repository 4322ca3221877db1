// The text form: exact round trip on every .ir file under tests/, and parse errors that name the line.
#include "ir/ir.h"
#include "support/filecheck.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace remat::ir {
namespace {

namespace fs = std::filesystem;

TEST(Text, EveryIrFileRoundTripsExactly) {
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(REMAT_TEST_DATA)) {
    if (e.path().extension() != ".ir") continue;
    ++files;
    std::string text = testing_support::read_file(e.path().string());
    Graph g = parse(text, e.path().string());
    std::string printed = print(g);
    EXPECT_EQ(print(parse(printed)), printed) << e.path();
    // The golden inputs are written in canonical form: printing reproduces the graph text itself.
    EXPECT_NE(text.find(printed.substr(0, printed.size() - 1)), std::string::npos)
        << e.path() << " is not in canonical form; canonical:\n" << printed;
  }
  EXPECT_GE(files, 4);
}

TEST(Text, AttributeValuesRoundTrip) {
  const std::string text =
      "graph @attrs(%x: f32[2,3]) -> (f32[2,3], f32[2,3]) {\n"
      "  %0: f32[2,3] = full() {dtype=f32, shape=[2,3], value=-1.5e-07}\n"
      "  %1: f32[2,3] = full() {dtype=f32, shape=[2,3], value=-inf}\n"
      "  %2: f32[2,3] = name(%x) {name=\"a \\\"quoted\\\" name\"} scope=\"outer/inner\"\n"
      "  %3: f32[2,3] = add(%2, %0)\n"
      "  return %3, %1\n"
      "}\n";
  EXPECT_EQ(print(parse(text)), text);
}

void expect_parse_error(const std::string& text, const std::string& needle) {
  try {
    parse(text, "bad.ir");
    ADD_FAILURE() << "parsed without error:\n" << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Text, ParseErrorsNameFileAndLine) {
  expect_parse_error("graph @g(%x: f32[2]) -> (f32[2]) {\n  %0: f32[2] = frobnicate(%x)\n  return %0\n}\n",
                     "bad.ir:2: unknown op 'frobnicate'");
  expect_parse_error("graph @g(%x: f32[2]) -> (f32[2]) {\n  %0: f32[2] = neg(%y)\n  return %0\n}\n",
                     "bad.ir:2: value %y is used before it is defined");
  expect_parse_error("graph @g(%x: q7[2]) -> (f32[2]) {\n  return %x\n}\n", "bad.ir:1: expected a type");
  expect_parse_error("graph @g(%x: f32[2]) -> (f32[3]) {\n  return %x\n}\n", "declares result 0 as f32[3]");
}

// Found by fuzz/ir_text_fuzz: an attribute of the wrong kind escaped as std::bad_variant_access.
TEST(Text, MissingAndMistypedAttributesAreErrorsNamingThem) {
  const std::string scan = "graph @g(%h: f32[2]) -> (f32[2]) {{\n  %0: f32[2] = scan(%h) {{{}}}\n"
                           "    graph @b(%c: f32[2]) -> (f32[2]) {{\n      return %c\n    }}\n  return %0\n}}\n";
  expect_parse_error(fmt::format(fmt::runtime(scan), "length=\"3\", num_consts=0, num_carry=1, reverse=false"),
                     "attribute 'length' is a string, expected an integer");
  expect_parse_error(fmt::format(fmt::runtime(scan), "length=1, num_consts=0, num_carry=1, reverse=[1]"),
                     "attribute 'reverse' is a list of integers, expected a boolean");
  expect_parse_error(fmt::format(fmt::runtime(scan), "length=1, num_consts=0, reverse=false"), "missing attribute 'num_carry'");
}

}  // namespace
}  // namespace remat::ir
