// Token shards: a corpus tokenized once by `remat data prepare`, one shard per corpus file, read back by
// dataset_type=tokens window by window (pread: a shard of any size costs the process only the windows it reads;
// a memory map would count every page the kernel maps around a read, up to a 2 MiB folio per window, in RSS).
//
// The format (little-endian), after llm.c's .bin shards:
//   bytes  0..7   magic "RMTOKENS"
//   bytes  8..11  uint32 format version (2; version 1, without the document index, is read too)
//   bytes 12..15  uint32 bytes per token: 2 (uint16, vocabularies up to 65536) or 4 (uint32)
//   bytes 16..23  uint64 vocabulary size of the tokenizer that wrote it
//   bytes 24..31  uint64 tokens in the shard
//   bytes 32..39  uint64 documents in the shard
//   bytes 40..47  uint64 bytes of text the tokens encode (for loss per byte)
//   bytes 48..63  zero
//   bytes 64..    the tokens: each document as BOS, its tokens, EOS (where the tokenizer has them), packed
//   then          the document index (version 2): uint64 per document, the token where it starts (ascending)
#pragma once

#include "train/corpus.h"
#include "train/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

namespace remat::train {

inline constexpr int64_t kShardHeaderBytes = 64;

struct ShardHeader {
  int64_t token_bytes = 2, vocab_size = 0, tokens = 0, documents = 0, text_bytes = 0;
  bool document_index = true;  // version 2: the index follows the tokens
};

// Writes one shard: documents appended one after another, the header completed by close().
class ShardWriter {
 public:
  ShardWriter(const std::filesystem::path& path, int64_t vocab_size);
  void add(const std::vector<int32_t>& document, int64_t text_bytes);
  void close();

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  ShardHeader header_;
  std::vector<uint64_t> starts_;  // the document index
};

// A shard open for reading: its header, and its file descriptor (closed when the last copy goes).
struct Shard {
  std::filesystem::path path;
  ShardHeader header;
  std::shared_ptr<const int> fd;
};

// Opens `path`, CHECKing the header (magic, version, width, the file's length against its token and document
// counts) and that
// the shard's vocabulary is `vocab_size` (the model's): errors name the file and what is wrong.
Shard open_shard(const std::filesystem::path& path, int64_t vocab_size);

// `remat data prepare`: every file of `corpus` (text or jsonl) tokenized into a shard of `output` (a folder,
// created), named after its index and file name, with a progress bar on stderr. Returns the shards' paths.
std::vector<std::filesystem::path> prepare_shards(const Corpus& corpus, const Tokenizer& tokenizer,
                                                  const std::filesystem::path& output);

}  // namespace remat::train
