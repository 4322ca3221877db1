#include "support/filecheck.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace remat::testing_support {
namespace {

std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == '\n') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string trim(std::string s) {
  size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

struct Directive {
  std::string kind, text;
  int line;
};

}  // namespace

std::string filecheck(std::string_view test_file_text, std::string_view output) {
  std::vector<Directive> ds;
  int n = 0;
  for (const std::string& l : lines_of(test_file_text)) {
    ++n;
    for (std::string kind : {"CHECK-NEXT", "CHECK-NOT", "CHECK"}) {
      std::string tag = "// " + kind + ":";
      size_t at = l.find(tag);
      if (at != std::string::npos) {
        ds.push_back({kind, trim(l.substr(at + tag.size())), n});
        break;
      }
    }
  }
  if (ds.empty()) return "the test file has no CHECK lines";
  std::vector<std::string> out = lines_of(output);
  size_t cursor = 0;   // first line not yet consumed
  size_t not_from = 0;  // CHECK-NOT window start
  std::vector<const Directive*> pending_not;
  auto fail = [&](const Directive& d, std::string why) {
    return fmt::format("line {}: {}: {} '{}'\n--- output ---\n{}", d.line, d.kind, why, d.text, output);
  };
  for (const Directive& d : ds) {
    if (d.kind == "CHECK-NOT") {
      pending_not.push_back(&d);
      continue;
    }
    size_t found = out.size();
    if (d.kind == "CHECK-NEXT") {
      if (cursor < out.size() && out[cursor].find(d.text) != std::string::npos) found = cursor;
      if (found == out.size()) return fail(d, "the next line does not contain");
    } else {
      for (size_t i = cursor; i < out.size() && found == out.size(); ++i)
        if (out[i].find(d.text) != std::string::npos) found = i;
      if (found == out.size()) return fail(d, "no remaining line contains");
    }
    for (const Directive* nd : pending_not)
      for (size_t i = not_from; i < found; ++i)
        if (out[i].find(nd->text) != std::string::npos) return fail(*nd, fmt::format("output line {} contains", i + 1));
    pending_not.clear();
    cursor = found + 1;
    not_from = cursor;
  }
  for (const Directive* nd : pending_not)
    for (size_t i = not_from; i < out.size(); ++i)
      if (out[i].find(nd->text) != std::string::npos) return fail(*nd, fmt::format("output line {} contains", i + 1));
  return "";
}

std::string run_line(std::string_view text) {
  for (const std::string& l : lines_of(text)) {
    size_t at = l.find("// RUN:");
    if (at != std::string::npos) return trim(l.substr(at + 7));
  }
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> golden_files(const std::string& dir, const std::string& extension) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(REMAT_TEST_DATA) / dir))
    if (e.path().extension() == extension) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace remat::testing_support
