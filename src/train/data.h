// Training data: byte-level tokens (vocab 256) from a text file or a directory of text files, split
// deterministically into train and validation (each file gives its first 90% to train, the rest to
// validation), and batches of random windows drawn from a seeded generator.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace remat::train {

// The default corpus: the plain-text licenses every Debian system carries.
inline constexpr const char* kDefaultCorpus = "/usr/share/common-licenses";

struct Dataset {
  std::string description;          // what was loaded, for the log
  std::vector<uint8_t> train, validation;
};

// Loads `path` (a file, or every regular file under a directory in name order; symbolic links are
// skipped so aliases are not read twice). An empty path means the default corpus, or, when that is
// absent, a synthetic sequence-reversal task (said in the description). Errors name the path and the key.
Dataset load_dataset(const std::string& path, double validation_fraction);

// Random windows of seq+1 bytes: inputs are the first seq, targets the last seq.
class Batcher {
 public:
  Batcher(const std::vector<uint8_t>& data, int64_t seq, uint64_t seed, const char* split);
  // Draws a global batch of `parts` x `count` sequences and fills part `part`'s `count` into inputs/targets
  // (count * seq int32 each). Every data-parallel rank draws the same windows, so the sampler's state is the
  // same on all of them, and rank r's part is what one process's sequences r*count.. of the batch hold.
  void next(int64_t count, int32_t* inputs, int32_t* targets, int64_t part = 0, int64_t parts = 1);
  // Where the sampler is, as text (for checkpoints), and back: a restored sampler draws what the saved one
  // would have drawn next.
  std::string state() const;
  void restore(const std::string& state);

 private:
  const std::vector<uint8_t>& data_;
  int64_t seq_;
  std::mt19937_64 rng_;
};

}  // namespace remat::train
