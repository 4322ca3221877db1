#include "train/data.h"

#include "base/check.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace remat::train {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  CHECK(in.good(), "cannot read dataset file '{}' (config key dataset_path)", p.string());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void add_file(Dataset& d, const std::vector<uint8_t>& bytes, double validation_fraction) {
  auto cut = static_cast<std::ptrdiff_t>(static_cast<double>(bytes.size()) * (1.0 - validation_fraction));
  d.train.insert(d.train.end(), bytes.begin(), bytes.begin() + cut);
  d.validation.insert(d.validation.end(), bytes.begin() + cut, bytes.end());
}

// Lines "word>drow": the model learns to reverse lowercase words. Deterministic.
Dataset synthetic_reversal(double validation_fraction) {
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int> len(3, 12), letter('a', 'z');
  std::vector<uint8_t> text;
  while (text.size() < 300000) {
    std::string w(static_cast<size_t>(len(rng)), 'a');
    for (char& c : w) c = static_cast<char>(letter(rng));
    std::string line = w + ">" + std::string(w.rbegin(), w.rend()) + "\n";
    text.insert(text.end(), line.begin(), line.end());
  }
  Dataset d;
  d.description = "synthetic sequence reversal (300 kB)";
  add_file(d, text, validation_fraction);
  return d;
}

}  // namespace

Dataset load_dataset(const std::string& path, double validation_fraction) {
  CHECK(validation_fraction > 0 && validation_fraction < 1, "validation fraction must be in (0, 1), got {}",
        validation_fraction);
  fs::path root = path.empty() ? fs::path(kDefaultCorpus) : fs::path(path);
  if (path.empty() && !fs::is_directory(root)) {
    Dataset d = synthetic_reversal(validation_fraction);
    d.description = fmt::format("{} -- note: the default corpus {} is absent", d.description, kDefaultCorpus);
    return d;
  }
  std::error_code ec;
  CHECK(fs::exists(root, ec), "dataset_path '{}' does not exist; give a text file or a directory of text files",
        root.string());
  std::vector<fs::path> files;
  if (fs::is_directory(root)) {
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(root);
  }
  Dataset d;
  size_t bytes = 0;
  for (const fs::path& f : files) {
    std::vector<uint8_t> content = read_bytes(f);
    bytes += content.size();
    add_file(d, content, validation_fraction);
  }
  CHECK(bytes > 0, "dataset_path '{}' holds no data ({} files, all empty)", root.string(), files.size());
  d.description = fmt::format("{} ({} files, {:.1f} kB)", root.string(), files.size(), static_cast<double>(bytes) / 1e3);
  return d;
}

Batcher::Batcher(const std::vector<uint8_t>& data, int64_t seq, uint64_t seed, const char* split)
    : data_(data), seq_(seq), rng_(seed) {
  CHECK(static_cast<int64_t>(data.size()) > seq,
        "max_target_length {} is too long for the {} split of the dataset ({} bytes): it needs at least {} bytes; "
        "use a shorter max_target_length or more data",
        seq, split, data.size(), seq + 1);
}

std::string Batcher::state() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

void Batcher::restore(const std::string& state) {
  std::istringstream in(state);
  in >> rng_;
  CHECK(!in.fail(), "the checkpoint's data sampler state is malformed ({} bytes)", state.size());
}

void Batcher::next(int64_t count, int32_t* inputs, int32_t* targets, int64_t part, int64_t parts) {
  std::uniform_int_distribution<int64_t> start(0, static_cast<int64_t>(data_.size()) - seq_ - 1);
  for (int64_t drawn = 0; drawn < parts * count; ++drawn) {
    const int64_t s = start(rng_), i = drawn - part * count;
    if (i < 0 || i >= count) continue;  // another rank's sequence
    for (int64_t t = 0; t < seq_; ++t) {
      inputs[i * seq_ + t] = data_[static_cast<size_t>(s + t)];
      targets[i * seq_ + t] = data_[static_cast<size_t>(s + t + 1)];
    }
  }
}

}  // namespace remat::train
