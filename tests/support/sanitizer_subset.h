// The slow parameterised cases (brute-force searches, launches of 4 ranks) run in full once, in the release
// build; the sanitizer build, ~5-10x slower, runs the named few of them, enough to put every code path they
// reach under AddressSanitizer without paying for each size again.
//   INSTANTIATE_TEST_SUITE_P(Meshes, Distributed, testing::ValuesIn(sanitizer_subset(all, {"data2"})), ...);
#pragma once

#include "exec/exec.h"

#include <string>
#include <vector>

namespace remat::testing_support {

template <class Case>
std::vector<Case> sanitizer_subset(const std::vector<Case>& all, const std::vector<std::string>& kept) {
  if (!exec::kAddressSanitizer) return all;
  std::vector<Case> few;
  for (const Case& c : all)
    for (const std::string& name : kept)
      if (name == c.name) few.push_back(c);
  return few;
}

}  // namespace remat::testing_support
