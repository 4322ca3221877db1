// Tokenizers (MaxText's keys tokenizer_type and tokenizer_path): the built-in byte-level one (a byte is a token,
// vocabulary 256, no BOS or EOS) or a SentencePiece model read with Debian's libsentencepiece; and training a
// SentencePiece model on a corpus (`remat tokenizer train`) with the library's own trainer.
#pragma once

#include "train/corpus.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace remat::train {

struct TokenizerConfig {
  std::string type = "byte";  // byte | sentencepiece
  std::string path;           // the SentencePiece .model file (tokenizer_type=sentencepiece)
};

class Tokenizer {
 public:
  // The byte-level tokenizer, or the model at config.path: a missing or unreadable file is an error naming it.
  explicit Tokenizer(const TokenizerConfig& config);
  ~Tokenizer();

  int64_t vocab_size() const;
  int32_t bos_id() const;  // -1: the tokenizer has none (byte-level)
  int32_t eos_id() const;  // -1: none
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // A document as training sees it: BOS (where there is one), its tokens, EOS (where there is one). Packed one
  // after another, EOS separates documents (MaxText's add_bos, add_eos and packing).
  std::vector<int32_t> encode_document(std::string_view text) const;
  const std::string& description() const { return description_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;  // null: byte-level
  std::string description_;
};

// `remat tokenizer train`: a SentencePiece model (algorithm bpe or unigram) of `vocab_size` pieces trained on
// the lines of the corpus's documents, written to `output`.
void train_tokenizer(const Corpus& corpus, int64_t vocab_size, const std::string& algorithm, const std::string& output);

}  // namespace remat::train
