// Training data: token streams from a corpus (dataset_type text or jsonl, tokenized as it loads) or from token
// shards (dataset_type tokens, read window by window: see train/shards.h), split into train and validation (each file
// gives its first tokens to train and the last validation_fraction to validation, unless eval_dataset_path
// names the validation files), and batches of windows drawn at random from a seeded generator.
#pragma once

#include "train/corpus.h"
#include "train/shards.h"
#include "train/tokenizer.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace remat::train {

// A file's tokens in memory (a tokenized text), and where its documents start (ascending, the first at 0).
struct FileTokens {
  std::vector<int32_t> ids;
  std::vector<int64_t> starts;
};

// Files laid end to end as one stream of token ids, and the documents in it. A part is one file's tokens
// [first, first + count): in memory, or a shard's, read from its file as a batch asks for them and CHECKed
// against the vocabulary. A part's documents are its tokens cut where a document of its file starts; the
// first may be the tail of a document that starts before the part (the train/validation split cuts files by
// tokens).
class Tokens {
 public:
  Tokens() = default;
  // Bytes as tokens (the byte-level tokenizer's ids), one document.
  Tokens(const std::vector<uint8_t>& bytes);  // NOLINT(google-explicit-constructor): a byte string is a token stream
  // Appends tokens [first, first + count) of a file in memory.
  void add(std::shared_ptr<const FileTokens> file, int64_t first, int64_t count);
  // Appends tokens [first, first + count) of `shard`.
  void add(const Shard& shard, int64_t first, int64_t count);
  int64_t size() const { return size_; }
  // Copies tokens [start, start + count) to `out`. A shard's id >= its vocabulary is an error naming the file
  // and the token's position in it.
  void read(int64_t start, int64_t count, int32_t* out) const;
  // The documents in the stream. A shard without a document index (format version 1) is an error naming it.
  int64_t documents() const;
  // Document i: where it starts in the stream, and its tokens.
  struct Span {
    int64_t start, count;
  };
  Span document(int64_t i) const;

 private:
  struct Part {
    int64_t start, count;  // in the stream
    int64_t first;         // the file's token where the part starts
    std::shared_ptr<const FileTokens> memory;  // the file in memory (else null)
    Shard shard;           // else
    // Documents: 1 + the file's documents starting inside the part, the first of which is `next`; -1: unknown.
    int64_t documents = -1, next = 0;
  };
  void push(Part part);
  // Where the file's document k starts (memory, or the shard's index read with pread).
  static int64_t file_document_start(const Part& part, int64_t k);
  void read_shard(const Part& part, int64_t from, int64_t n, int32_t* out) const;
  std::vector<Part> parts_;
  std::vector<int64_t> first_document_;  // per part: the documents of the parts before it
  int64_t size_ = 0;
};

struct DataConfig {
  Corpus corpus;                     // dataset_type, dataset_path, train_data_columns
  std::string eval_path;             // eval_dataset_path: validation files (same type); "" = the split
  double validation_fraction = 0.1;  // without eval_path, each file's tail held out
  bool packing = true;               // false: a sequence is one document from its start (Batcher)
};

struct Dataset {
  std::string description;  // what was loaded, for the log
  Tokens train, validation;
  // Bytes of text per token in the validation data (converts loss per token to loss per byte); 0 = unknown.
  double validation_bytes_per_token = 0;
};

// Loads the config's data, tokenized by `tokenizer` (for text and jsonl) or checked against it (shards must have
// its vocabulary, `vocab_size` the model's). An empty dataset_path of type text means the default corpus or,
// when that is absent, a synthetic sequence-reversal task (said in the description). Errors name the file and
// the key.
Dataset load_dataset(const DataConfig& config, const Tokenizer& tokenizer, int64_t vocab_size);

// Sequences drawn at random: packed, windows of seq+1 tokens starting anywhere (inputs are the first seq, targets
// the last seq); unpacked (packing=false), whole documents from their start, the first seq+1 tokens of each,
// inputs padded with 0 and targets with -1 (the loss skips them: nn::ModelConfig::padded_targets).
class Batcher {
 public:
  Batcher(Tokens data, int64_t seq, uint64_t seed, const char* split, bool packing = true);
  // Draws a global batch of `parts` x `count` sequences and fills part `part`'s `count` into inputs/targets
  // (count * seq int32 each). Every data-parallel rank draws the same windows, so the sampler's state is the
  // same on all of them, and rank r's part is what one process's sequences r*count.. of the batch hold; a rank
  // reads only its own windows' tokens.
  void next(int64_t count, int32_t* inputs, int32_t* targets, int64_t part = 0, int64_t parts = 1);
  // Where the sampler is, as text (for checkpoints), and back: a restored sampler draws what the saved one
  // would have drawn next.
  std::string state() const;
  void restore(const std::string& state);

 private:
  void next_documents(int64_t count, int32_t* inputs, int32_t* targets, int64_t part, int64_t parts);
  Tokens data_;
  int64_t seq_;
  bool packing_;
  std::mt19937_64 rng_;
  std::vector<int32_t> window_;  // seq+1 tokens
};

}  // namespace remat::train
