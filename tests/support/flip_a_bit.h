// Corrupts a checkpoint for tests of the fallback: flips one bit 7 bytes before the end of `file`, in the last
// tensor's data, so the checksum no longer matches (the file keeps its size and header).
#pragma once

#include <filesystem>
#include <fstream>

namespace remat::testing_support {

inline void flip_a_bit(const std::filesystem::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-7, std::ios::end);
  char c = 0;
  f.get(c);
  f.seekp(-7, std::ios::end);
  f.put(static_cast<char>(c ^ 1));
}

}  // namespace remat::testing_support
