#include "train/shards.h"

#include "base/check.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>

namespace remat::train {

namespace fs = std::filesystem;

namespace {

static_assert(std::endian::native == std::endian::little, "shards are little-endian: this host reads them as such");

constexpr char kMagic[8] = {'R', 'M', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr uint32_t kVersion = 2;  // 1: no document index

std::vector<char> header_bytes(const ShardHeader& h) {
  std::vector<char> bytes(static_cast<size_t>(kShardHeaderBytes), 0);
  const uint32_t width = static_cast<uint32_t>(h.token_bytes);
  const uint64_t fields[] = {static_cast<uint64_t>(h.vocab_size), static_cast<uint64_t>(h.tokens),
                             static_cast<uint64_t>(h.documents), static_cast<uint64_t>(h.text_bytes)};
  std::memcpy(bytes.data(), kMagic, 8);
  std::memcpy(bytes.data() + 8, &kVersion, 4);
  std::memcpy(bytes.data() + 12, &width, 4);
  std::memcpy(bytes.data() + 16, fields, sizeof fields);
  return bytes;
}

// A progress bar on stderr, redrawn when the percentage changes.
class Progress {
 public:
  explicit Progress(int64_t total) : total_(std::max<int64_t>(total, 1)) {}
  void show(int64_t done, int64_t tokens) {
    const int64_t percent = std::min<int64_t>(100, 100 * done / total_);
    if (percent == shown_) return;
    shown_ = percent;
    constexpr int64_t kWidth = 30;
    const int64_t filled = kWidth * percent / 100;
    const auto mb = [](int64_t bytes) { return fmt::format("{:.2f} MB", static_cast<double>(bytes) / 1e6); };
    fmt::print(stderr, "\rprepare [{}{}] {:3d}%  {} of {}, {} tokens", std::string(static_cast<size_t>(filled), '#'),
               std::string(static_cast<size_t>(kWidth - filled), '.'), percent, mb(done), mb(total_), tokens);
    std::fflush(stderr);
  }
  void end() { fmt::print(stderr, "\n"); }

 private:
  const int64_t total_;
  int64_t shown_ = -1;
};

}  // namespace

ShardWriter::ShardWriter(const fs::path& path, int64_t vocab_size)
    : path_(path), out_(path, std::ios::binary | std::ios::trunc) {
  header_.vocab_size = vocab_size;
  header_.token_bytes = vocab_size <= 65536 ? 2 : 4;
  const std::vector<char> placeholder = header_bytes(header_);
  out_.write(placeholder.data(), static_cast<std::streamsize>(placeholder.size()));
  CHECK(out_.good(), "cannot write token shard '{}'", path.string());
}

void ShardWriter::add(const std::vector<int32_t>& document, int64_t text_bytes) {
  for (int32_t id : document) {
    ASSERT(id >= 0 && id < header_.vocab_size);
    const uint32_t wide = static_cast<uint32_t>(id);
    const uint16_t narrow = static_cast<uint16_t>(id);
    out_.write(header_.token_bytes == 2 ? reinterpret_cast<const char*>(&narrow) : reinterpret_cast<const char*>(&wide),
               header_.token_bytes);
  }
  starts_.push_back(static_cast<uint64_t>(header_.tokens));
  header_.tokens += static_cast<int64_t>(document.size());
  header_.documents += 1;
  header_.text_bytes += text_bytes;
}

void ShardWriter::close() {
  out_.write(reinterpret_cast<const char*>(starts_.data()), static_cast<std::streamsize>(8 * starts_.size()));
  const std::vector<char> header = header_bytes(header_);
  out_.seekp(0);
  out_.write(header.data(), static_cast<std::streamsize>(header.size()));
  out_.close();
  CHECK(out_.good(), "cannot write token shard '{}'", path_.string());
}

Shard open_shard(const fs::path& path, int64_t vocab_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CHECK(fd >= 0, "cannot open token shard '{}': {}", path.string(), std::strerror(errno));
  std::shared_ptr<const int> handle(new int(fd), [](const int* f) {
    ::close(*f);
    delete f;
  });
  struct stat st {};
  const int64_t size = ::fstat(fd, &st) == 0 ? st.st_size : 0;
  uint8_t bytes[kShardHeaderBytes] = {};
  CHECK(size >= kShardHeaderBytes && ::pread(fd, bytes, sizeof bytes, 0) == kShardHeaderBytes,
        "token shard '{}' has {} bytes, fewer than its {}-byte header: not a shard of `remat data prepare`",
        path.string(), size, kShardHeaderBytes);
  uint32_t version = 0, width = 0;
  uint64_t fields[4] = {};
  std::memcpy(&version, bytes + 8, 4);
  std::memcpy(&width, bytes + 12, 4);
  std::memcpy(fields, bytes + 16, sizeof fields);
  CHECK(std::memcmp(bytes, kMagic, 8) == 0, "'{}' is not a token shard (no RMTOKENS header): dataset_type=tokens "
        "reads the shards of `remat data prepare`", path.string());
  CHECK(version == 1 || version == kVersion, "token shard '{}' has format version {}; this remat reads versions 1 "
        "and {}", path.string(), version, kVersion);
  CHECK(width == 2 || width == 4, "token shard '{}' says {} bytes per token; a shard has 2 or 4", path.string(), width);
  const ShardHeader h{.token_bytes = width, .vocab_size = static_cast<int64_t>(fields[0]),
                      .tokens = static_cast<int64_t>(fields[1]), .documents = static_cast<int64_t>(fields[2]),
                      .text_bytes = static_cast<int64_t>(fields[3]), .document_index = version >= 2};
  const int64_t index_bytes = h.document_index ? 8 * h.documents : 0;
  CHECK(h.tokens >= 0 && h.documents >= 0 && size - kShardHeaderBytes == h.tokens * h.token_bytes + index_bytes,
        "token shard '{}' is truncated or padded: its header says {} tokens of {} bytes{}, the file holds {} bytes after "
        "the header", path.string(), h.tokens, h.token_bytes,
        h.document_index ? fmt::format(" and {} documents of 8 index bytes", h.documents) : "", size - kShardHeaderBytes);
  CHECK(h.vocab_size == vocab_size, "token shard '{}' was prepared with a {}-token vocabulary, but vocab_size is {}: "
        "train with the tokenizer that prepared it (vocab_size={})", path.string(), h.vocab_size, vocab_size,
        h.vocab_size);
  return {.path = path, .header = h, .fd = std::move(handle)};
}

std::vector<fs::path> prepare_shards(const Corpus& corpus, const Tokenizer& tokenizer, const fs::path& output) {
  CHECK(corpus.type == "text" || corpus.type == "jsonl", "`remat data prepare` reads dataset_type text or jsonl, got '{}'",
        corpus.type);
  CHECK(!output.empty(), "`remat data prepare` needs output_path=DIR, the folder the shards go to");
  const std::vector<fs::path> files = corpus_files(corpus.path, "dataset_path");
  fs::create_directories(output);
  int64_t total = 0, done = 0, tokens = 0;
  for (const fs::path& f : files) total += static_cast<int64_t>(fs::file_size(f));
  Progress bar(total);
  std::vector<fs::path> shards;
  for (size_t i = 0; i < files.size(); ++i) {
    shards.push_back(output / fmt::format("{:05d}_{}.tokens", i, files[i].filename().string()));
    ShardWriter shard(shards.back(), tokenizer.vocab_size());
    const int64_t file_bytes = static_cast<int64_t>(fs::file_size(files[i]));
    int64_t read = 0;
    for_each_document(corpus, files[i], [&](std::string_view text) {
      const std::vector<int32_t> ids = tokenizer.encode_document(text);
      shard.add(ids, static_cast<int64_t>(text.size()));
      tokens += static_cast<int64_t>(ids.size());
      read = std::min(file_bytes, read + static_cast<int64_t>(text.size()));
      bar.show(done + read, tokens);
    });
    shard.close();
    done += file_bytes;
    bar.show(done, tokens);
  }
  bar.end();
  return shards;
}

}  // namespace remat::train
