#include "train/data.h"

#include "base/check.h"
#include "train/shards.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace remat::train {
namespace {

namespace fs = std::filesystem;

// What the files of one path gave: the tokens (split into train and validation, or all in train), and how
// many tokens and bytes of text they hold.
struct Loaded {
  Tokens train, validation;
  int64_t files = 0, tokens = 0, text_bytes = 0;

  // One file's tokens: the first (1 - fraction) to train, the rest to validation (fraction 0: all train).
  // `add(part, from, count)` appends `count` tokens from the file's token `from` on to `part`.
  template <class Add>
  void split(int64_t count, double fraction, const Add& add) {
    const auto cut = static_cast<int64_t>(static_cast<double>(count) * (1.0 - fraction));
    add(train, 0, cut);
    add(validation, cut, count - cut);
    files += 1;
    tokens += count;
  }
  void add_shard(const Shard& s, double fraction) {
    split(s.header.tokens, fraction, [&](Tokens& part, int64_t from, int64_t n) { part.add(s, from, n); });
    text_bytes += s.header.text_bytes;
  }
  // One file of text documents, each tokenized and packed after the one before.
  void add_text(const std::vector<std::string_view>& docs, const Tokenizer& tokenizer, double fraction) {
    auto file = std::make_shared<FileTokens>();
    for (std::string_view doc : docs) {
      const std::vector<int32_t> d = tokenizer.encode_document(doc);
      file->starts.push_back(static_cast<int64_t>(file->ids.size()));
      file->ids.insert(file->ids.end(), d.begin(), d.end());
      text_bytes += static_cast<int64_t>(doc.size());
    }
    split(static_cast<int64_t>(file->ids.size()), fraction,
          [&](Tokens& part, int64_t from, int64_t n) { part.add(file, from, n); });
  }
  double bytes_per_token() const { return tokens > 0 && text_bytes > 0 ? static_cast<double>(text_bytes) / static_cast<double>(tokens) : 0; }
};

// Lines "word>drow": the model learns to reverse lowercase words. Deterministic.
std::string synthetic_reversal() {
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int> len(3, 12), letter('a', 'z');
  std::string text;
  while (text.size() < 300000) {
    std::string w(static_cast<size_t>(len(rng)), 'a');
    for (char& c : w) c = static_cast<char>(letter(rng));
    text += w + ">" + std::string(w.rbegin(), w.rend()) + "\n";
  }
  return text;
}

// Every file of `corpus`, split by `fraction` (0: all to train).
Loaded load_files(const Corpus& corpus, const char* key, const Tokenizer& tokenizer, int64_t vocab_size, double fraction) {
  Loaded l;
  for (const fs::path& file : corpus_files(corpus.path, key)) {
    if (corpus.type == "tokens") {
      l.add_shard(open_shard(file, vocab_size), fraction);
      continue;
    }
    std::vector<std::string> docs;
    for_each_document(corpus, file, [&](std::string_view d) { docs.emplace_back(d); });
    l.add_text({docs.begin(), docs.end()}, tokenizer, fraction);
  }
  CHECK(l.tokens > 0, "{} '{}' holds no data ({} files, all empty)", key,
        corpus.path.empty() ? kDefaultCorpus : corpus.path, l.files);
  return l;
}

}  // namespace

Tokens::Tokens(const std::vector<uint8_t>& bytes) {
  auto file = std::make_shared<FileTokens>(FileTokens{.ids = {bytes.begin(), bytes.end()}, .starts = {0}});
  add(file, 0, static_cast<int64_t>(file->ids.size()));
}

void Tokens::add(std::shared_ptr<const FileTokens> file, int64_t first, int64_t count) {
  push({.start = size_, .count = count, .first = first, .memory = std::move(file), .shard = {}});
}

void Tokens::add(const Shard& shard, int64_t first, int64_t count) {
  push({.start = size_, .count = count, .first = first, .memory = nullptr, .shard = shard});
}

// Appends a part, finding its documents where its file says where they start (a binary search: a shard's index
// is read entry by entry, never whole).
void Tokens::push(Part part) {
  if (part.count <= 0) return;
  const int64_t file_documents = part.memory ? static_cast<int64_t>(part.memory->starts.size())
                                 : part.shard.header.document_index ? part.shard.header.documents : -1;
  if (file_documents >= 0) {
    auto first_starting = [&](auto after) {  // the first document k whose start satisfies `after` (monotone)
      int64_t lo = 0, hi = file_documents;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (after(file_document_start(part, mid))) hi = mid;
        else lo = mid + 1;
      }
      return lo;
    };
    part.next = first_starting([&](int64_t s) { return s > part.first; });
    part.documents = 1 + first_starting([&](int64_t s) { return s >= part.first + part.count; }) - part.next;
  }
  const int64_t before = parts_.empty() ? 0 : first_document_.back() + std::max<int64_t>(parts_.back().documents, 0);
  first_document_.push_back(before);
  size_ += part.count;
  parts_.push_back(std::move(part));
}

int64_t Tokens::file_document_start(const Part& part, int64_t k) {
  if (part.memory) return part.memory->starts[static_cast<size_t>(k)];
  const ShardHeader& h = part.shard.header;
  uint64_t start = 0;
  const off_t at = static_cast<off_t>(kShardHeaderBytes + h.tokens * h.token_bytes + 8 * k);
  CHECK(::pread(*part.shard.fd, &start, 8, at) == 8, "cannot read the document index of token shard '{}' at "
        "document {}: the file is shorter than when it was opened", part.shard.path.string(), k);
  CHECK(start <= static_cast<uint64_t>(h.tokens), "token shard '{}' says document {} starts at token {}, past its {} "
        "tokens: the document index is corrupt", part.shard.path.string(), k, start, h.tokens);
  return static_cast<int64_t>(start);
}

int64_t Tokens::documents() const {
  for (const Part& p : parts_)
    CHECK(p.documents >= 0, "token shard '{}' has format version 1, without the document index that packing=false "
          "needs: prepare it again with `remat data prepare`, or train with packing=true", p.shard.path.string());
  return parts_.empty() ? 0 : first_document_.back() + parts_.back().documents;
}

Tokens::Span Tokens::document(int64_t i) const {
  ASSERT(i >= 0 && i < documents());
  const auto p = static_cast<size_t>(std::upper_bound(first_document_.begin(), first_document_.end(), i) -
                                     first_document_.begin() - 1);
  const Part& part = parts_[p];
  const int64_t j = i - first_document_[p];
  const int64_t from = j == 0 ? part.first : file_document_start(part, part.next + j - 1);
  const int64_t to = j + 1 < part.documents ? file_document_start(part, part.next + j) : part.first + part.count;
  CHECK(part.first <= from && from <= to && to <= part.first + part.count,
        "token shard '{}' has a document index out of order near document {}: the index is corrupt",
        part.shard.path.string(), part.next + j);
  return {.start = part.start + from - part.first, .count = to - from};
}

void Tokens::read(int64_t start, int64_t count, int32_t* out) const {
  ASSERT(start >= 0 && start + count <= size_);
  auto part = std::upper_bound(parts_.begin(), parts_.end(), start, [](int64_t at, const Part& p) { return at < p.start; }) - 1;
  for (int64_t done = 0; done < count; ++part) {
    const int64_t from = start + done - part->start, n = std::min(count - done, part->count - from);
    const int32_t* ids = part->memory ? part->memory->ids.data() + part->first + from : nullptr;
    if (ids != nullptr) std::copy(ids, ids + n, out + done);
    else read_shard(*part, part->first + from, n, out + done);
    done += n;
  }
}

// Reads the shard's tokens [from, from + n) into `out`: the file's bytes into `out` itself, then each widened to
// int32 in place from the last (token i's bytes lie before where its int32 goes).
void Tokens::read_shard(const Part& part, int64_t from, int64_t n, int32_t* out) const {
  const ShardHeader& h = part.shard.header;
  const int64_t width = h.token_bytes, bytes = n * width;
  auto* raw = reinterpret_cast<uint8_t*>(out);
  for (int64_t got = 0; got < bytes;) {
    const ssize_t r = ::pread(*part.shard.fd, raw + got, static_cast<size_t>(bytes - got),
                              static_cast<off_t>(kShardHeaderBytes + from * width + got));
    CHECK(r > 0, "cannot read token shard '{}' at token {}: {}", part.shard.path.string(), from + got / width,
          r == 0 ? "the file is shorter than when it was opened" : std::strerror(errno));
    got += r;
  }
  for (int64_t i = n - 1; i >= 0; --i) {
    uint32_t id = 0;
    if (width == 2) {
      uint16_t narrow = 0;
      std::memcpy(&narrow, raw + 2 * i, 2);
      id = narrow;
    } else {
      std::memcpy(&id, raw + 4 * i, 4);
    }
    CHECK(id < static_cast<uint64_t>(h.vocab_size),
          "token shard '{}' holds token id {} at token {} (byte offset {}), outside its vocabulary of {}: the shard is "
          "corrupt", part.shard.path.string(), id, from + i, kShardHeaderBytes + (from + i) * width, h.vocab_size);
    out[i] = static_cast<int32_t>(id);
  }
}

Dataset load_dataset(const DataConfig& config, const Tokenizer& tokenizer, int64_t vocab_size) {
  const Corpus& corpus = config.corpus;
  CHECK(corpus.type == "text" || corpus.type == "jsonl" || corpus.type == "tokens",
        "config key 'dataset_type' expects text, jsonl or tokens, got '{}'", corpus.type);
  CHECK(config.validation_fraction > 0 && config.validation_fraction < 1, "validation fraction must be in (0, 1), got {}",
        config.validation_fraction);
  Dataset d;
  if (corpus.path.empty() && corpus.type == "text" && !fs::is_directory(kDefaultCorpus)) {
    const std::string text = synthetic_reversal();
    Loaded l;
    l.add_text({text}, tokenizer, config.validation_fraction);
    d.description = fmt::format("synthetic sequence reversal (300 kB) -- note: the default corpus {} is absent", kDefaultCorpus);
    d.train = l.train, d.validation = l.validation, d.validation_bytes_per_token = l.bytes_per_token();
    return d;
  }
  const bool split = config.eval_path.empty();
  const Loaded train = load_files(corpus, "dataset_path", tokenizer, vocab_size, split ? config.validation_fraction : 0);
  d.train = train.train;
  d.validation = train.validation;
  d.validation_bytes_per_token = train.bytes_per_token();
  const std::string shown = corpus.path.empty() ? kDefaultCorpus : corpus.path;
  d.description = fmt::format("{} {} ({} files, {} tokens)", corpus.type, shown, train.files, train.tokens);
  if (!split) {
    Corpus eval = corpus;
    eval.path = config.eval_path;
    const Loaded validation = load_files(eval, "eval_dataset_path", tokenizer, vocab_size, 0);
    d.validation = validation.train;
    d.validation_bytes_per_token = validation.bytes_per_token();
    d.description += fmt::format(", validation {} ({} files, {} tokens)", config.eval_path, validation.files, validation.tokens);
  }
  return d;
}

Batcher::Batcher(Tokens data, int64_t seq, uint64_t seed, const char* split, bool packing)
    : data_(std::move(data)), seq_(seq), packing_(packing), rng_(seed), window_(static_cast<size_t>(seq + 1)) {
  if (!packing) {
    CHECK(data_.documents() > 0, "the {} split of the dataset holds no documents (packing=false)", split);
    return;
  }
  CHECK(data_.size() > seq,
        "max_target_length {} is too long for the {} split of the dataset ({} tokens): it needs at least {} tokens; "
        "use a shorter max_target_length or more data",
        seq, split, data_.size(), seq + 1);
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
  if (!packing_) return next_documents(count, inputs, targets, part, parts);
  std::uniform_int_distribution<int64_t> start(0, data_.size() - seq_ - 1);
  for (int64_t drawn = 0; drawn < parts * count; ++drawn) {
    const int64_t s = start(rng_), i = drawn - part * count;
    if (i < 0 || i >= count) continue;  // another rank's sequence: not read
    data_.read(s, seq_ + 1, window_.data());
    std::copy(window_.begin(), window_.end() - 1, inputs + i * seq_);
    std::copy(window_.begin() + 1, window_.end(), targets + i * seq_);
  }
}

// packing=false: documents drawn uniformly, each from its start; past its end, inputs 0 and targets -1.
void Batcher::next_documents(int64_t count, int32_t* inputs, int32_t* targets, int64_t part, int64_t parts) {
  std::uniform_int_distribution<int64_t> document(0, data_.documents() - 1);
  for (int64_t drawn = 0; drawn < parts * count; ++drawn) {
    const int64_t k = document(rng_), i = drawn - part * count;
    if (i < 0 || i >= count) continue;  // another rank's sequence: not read
    const Tokens::Span d = data_.document(k);
    const int64_t n = std::min(d.count, seq_ + 1);
    data_.read(d.start, n, window_.data());
    for (int64_t t = 0; t < seq_; ++t) {
      inputs[i * seq_ + t] = t < n ? window_[static_cast<size_t>(t)] : 0;
      targets[i * seq_ + t] = t + 1 < n ? window_[static_cast<size_t>(t + 1)] : -1;
    }
  }
}

}  // namespace remat::train
