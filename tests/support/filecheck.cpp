#include "support/filecheck.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
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

// A directive's pattern as a regex: literal text, `[[NAME:regex]]` binds NAME to what `regex` matched,
// `[[NAME]]` must match NAME's bound text exactly, `{{regex}}` matches `regex`. `[[` opens a variable
// only before an identifier (so IR attributes like `[[1],[0]]` stay literal). `vars` holds the bindings
// of earlier directives; `binds` receives the names this pattern binds, in the order of its groups.
struct Pattern {
  std::regex re;
  std::vector<std::string> binds;
  std::string error;
};

Pattern compile_pattern(const std::string& text, const std::map<std::string, std::string>& vars) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  static const std::regex variable(R"(^\[\[([A-Za-z_][A-Za-z0-9_]*)(:|\]\]))");
  auto literal = [](const std::string& t) { return std::regex_replace(t, special, "\\$&"); };
  Pattern p;
  std::string re;
  size_t i = 0;
  while (i < text.size()) {
    size_t at = i;
    std::smatch m;
    while (at < text.size() && !(text.compare(at, 2, "{{") == 0 ||
                                 (text.compare(at, 2, "[[") == 0 &&
                                  std::regex_search(text.cbegin() + static_cast<std::ptrdiff_t>(at), text.cend(), m,
                                                    variable))))
      ++at;
    re += literal(text.substr(i, at - i));
    if (at == text.size()) break;
    const bool raw = text.compare(at, 2, "{{") == 0;
    const size_t stop = text.find(raw ? "}}" : "]]", at + 2);
    if (stop == std::string::npos) {
      p.error = fmt::format("unclosed {}", text.substr(at, 2));
      return p;
    }
    const std::string inner = text.substr(at + 2, stop - at - 2);
    const size_t colon = inner.find(':');
    if (raw) {
      re += fmt::format("(?:{})", inner);
    } else if (colon != std::string::npos) {
      p.binds.push_back(inner.substr(0, colon));
      re += fmt::format("({})", inner.substr(colon + 1));
    } else if (auto own = std::find(p.binds.begin(), p.binds.end(), inner); own != p.binds.end()) {
      re += fmt::format("\\{}", own - p.binds.begin() + 1);  // bound earlier in this pattern
    } else if (auto it = vars.find(inner); it != vars.end()) {
      re += literal(it->second);
    } else {
      p.error = fmt::format("[[{}]] is used before it is bound", inner);
      return p;
    }
    i = stop + 2;
  }
  p.re = std::regex(re);
  return p;
}

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
  std::map<std::string, std::string> vars;  // [[NAME:...]] bindings
  size_t cursor = 0;                        // first line not yet consumed
  std::vector<const Directive*> pending_not;
  auto fail = [&](const Directive& d, std::string why) {
    return fmt::format("line {}: {}: {} '{}'\n--- output ---\n{}", d.line, d.kind, why, d.text, output);
  };
  // Output line `i` matches pattern `p`: binds its captures when it does.
  auto matches = [&](const Pattern& p, size_t i) {
    std::smatch m;
    if (!std::regex_search(out[i], m, p.re)) return false;
    for (size_t k = 0; k < p.binds.size(); ++k) vars[p.binds[k]] = m[k + 1].str();
    return true;
  };
  // The CHECK-NOTs seen since the last match must match no line in [from, to).
  auto check_nots = [&](size_t from, size_t to) -> std::string {
    for (const Directive* nd : pending_not) {
      Pattern p = compile_pattern(nd->text, vars);
      if (!p.error.empty()) return fail(*nd, p.error);
      for (size_t i = from; i < to; ++i)
        if (matches(p, i)) return fail(*nd, fmt::format("output line {} matches", i + 1));
    }
    pending_not.clear();
    return "";
  };
  for (const Directive& d : ds) {
    if (d.kind == "CHECK-NOT") {
      pending_not.push_back(&d);
      continue;
    }
    Pattern p = compile_pattern(d.text, vars);
    if (!p.error.empty()) return fail(d, p.error);
    size_t found = out.size();
    const size_t last = d.kind == "CHECK-NEXT" ? std::min(cursor + 1, out.size()) : out.size();
    for (size_t i = cursor; i < last && found == out.size(); ++i)
      if (matches(p, i)) found = i;
    if (found == out.size())
      return fail(d, d.kind == "CHECK-NEXT" ? "the next line does not match" : "no remaining line matches");
    if (std::string e = check_nots(cursor, found); !e.empty()) return e;
    cursor = found + 1;
  }
  return check_nots(cursor, out.size());
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
