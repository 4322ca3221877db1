// Shared by the libFuzzer harnesses (fuzz/*_fuzz.cpp): a remat::Error is the parser refusing bad input
// with a message (the expected outcome); anything else escaping — another exception, a sanitizer report, a
// trap — is a bug that libFuzzer saves as a crash input.
#pragma once

#include "base/check.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace remat::fuzz {

inline std::string_view text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// An Error must carry a message: the user is told what was wrong.
template <class F>
void refused_or_accepted(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (std::string_view(e.what()).empty()) std::abort();
  }
}

// A property the fuzzer found broken: print both sides and crash (the input is saved).
[[noreturn]] inline void broken(const char* property, const std::string& a, const std::string& b) {
  std::fprintf(stderr, "property broken: %s\n--- first\n%s\n--- second\n%s\n", property, a.c_str(), b.c_str());
  std::abort();
}

}  // namespace remat::fuzz
