// Two error channels (docs/design.md, "Invariants": errors are the user's or ours).
//   CHECK(cond, fmt, args...)  anything a user can cause (bad config, bad shapes, bad file): throws
//                              remat::Error whose message says what was wrong, where, and how to fix it.
//   ASSERT(cond)               an internal invariant: a bug in remat, never the user's fault. Throws
//                              remat::InternalError naming the condition, file and line.
// Usage: CHECK(a.rank() == 2, "matmul at scope '{}': lhs must be rank 2, got {}", scope, a.rank());
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace remat {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

[[noreturn]] void throw_error(std::string message);
[[noreturn]] void throw_internal(const char* condition, const char* file, int line);

}  // namespace remat

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) ::remat::throw_error(fmt::format(__VA_ARGS__));  \
  } while (0)

#define ASSERT(cond)                                                         \
  do {                                                                       \
    if (!(cond)) ::remat::throw_internal(#cond, __FILE__, __LINE__);         \
  } while (0)
