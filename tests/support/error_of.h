// The message of the remat::Error that `f` throws, or "" when it throws none: for tests of user-facing errors.
//   EXPECT_NE(testing_support::error_of([] { parse_schedule("zb"); }).find("unknown schedule"), std::string::npos);
#pragma once

#include "base/check.h"

#include <functional>
#include <string>

namespace remat::testing_support {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace remat::testing_support
