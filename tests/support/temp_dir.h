// A fresh directory per use (mkdtemp), removed with everything in it at the end of the scope, so tests
// running in parallel (ctest -j) never share one.
#pragma once

#include "base/check.h"

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace remat::testing_support {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "remat_test_XXXXXX").string();
    ASSERT(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace remat::testing_support
