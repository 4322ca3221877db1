#include "train/tokenizer.h"

#include "base/check.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <unordered_map>

// Exported by libsentencepiece (declared in its common.h, which Debian does not install): the trainer logs a
// line per step at level 0 (INFO); 1 keeps its warnings and errors.
namespace sentencepiece::logging {
void SetMinLogLevel(int level);
}

namespace remat::train {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kByteVocabulary = 256;

// The training sentences: every non-empty line of the corpus's documents, file after file. SentencePiece's
// trainer skips sentences longer than its max_sentence_length, so a text file goes in line by line.
class Lines : public sentencepiece::SentenceIterator {
 public:
  explicit Lines(const Corpus& corpus) {
    for (const fs::path& file : corpus_files(corpus.path, "dataset_path"))
      for_each_document(corpus, file, [&](std::string_view doc) {
        for (size_t at = 0; at < doc.size();) {
          const size_t end = std::min(doc.find('\n', at), doc.size());
          if (end > at) lines_.emplace_back(doc.substr(at, end - at));
          at = end + 1;
        }
      });
    CHECK(!lines_.empty(), "dataset_path '{}' holds no text to train a tokenizer on", corpus.path);
  }
  bool done() const override { return at_ >= lines_.size(); }
  void Next() override { ++at_; }
  const std::string& value() const override { return lines_[at_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> lines_;
  size_t at_ = 0;
};

}  // namespace

Tokenizer::Tokenizer(const TokenizerConfig& config) {
  CHECK(config.type == "byte" || config.type == "sentencepiece",
        "config key 'tokenizer_type' expects byte or sentencepiece, got '{}'", config.type);
  if (config.type == "byte") {
    description_ = "byte-level (256 tokens)";
    return;
  }
  std::error_code ec;
  CHECK(!config.path.empty(), "tokenizer_type=sentencepiece needs tokenizer_path (a .model file; `remat tokenizer train` "
        "makes one)");
  CHECK(fs::is_regular_file(config.path, ec), "tokenizer_path '{}' does not exist or is not a file", config.path);
  sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const sentencepiece::util::Status status = sp_->Load(config.path);
  CHECK(status.ok(), "tokenizer_path '{}' is not a SentencePiece model ({}): give a .model file written by `remat "
        "tokenizer train` or SentencePiece's spm_train", config.path, status.ToString());
  description_ = fmt::format("SentencePiece {} ({} tokens, BOS {}, EOS {})", config.path, vocab_size(), bos_id(), eos_id());
}

Tokenizer::~Tokenizer() = default;

int64_t Tokenizer::vocab_size() const { return sp_ ? sp_->GetPieceSize() : kByteVocabulary; }
int32_t Tokenizer::bos_id() const { return sp_ ? sp_->bos_id() : -1; }
int32_t Tokenizer::eos_id() const { return sp_ ? sp_->eos_id() : -1; }

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (!sp_) {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::vector<int> ids;
  const sentencepiece::util::Status status = sp_->Encode(text, &ids);
  CHECK(status.ok(), "the tokenizer could not encode a text of {} bytes: {}", text.size(), status.ToString());
  return {ids.begin(), ids.end()};
}

std::vector<int32_t> Tokenizer::encode_document(std::string_view text) const {
  std::vector<int32_t> ids;
  if (bos_id() >= 0) ids.push_back(bos_id());
  const std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (eos_id() >= 0) ids.push_back(eos_id());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (!sp_) {
    std::string text;
    for (int32_t id : ids) text += static_cast<char>(id);  // a byte model's ids past 255 keep their low byte
    return text;
  }
  std::string text;
  const sentencepiece::util::Status status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  CHECK(status.ok(), "the tokenizer could not decode {} tokens: {}", ids.size(), status.ToString());
  return text;
}

void train_tokenizer(const Corpus& corpus, int64_t vocab_size, const std::string& algorithm, const std::string& output) {
  CHECK(algorithm == "bpe" || algorithm == "unigram", "config key 'tokenizer_algorithm' expects bpe or unigram, got '{}'",
        algorithm);
  CHECK(!output.empty(), "`remat tokenizer train` needs tokenizer_path=FILE.model, where the model is written");
  Lines lines(corpus);
  // character_coverage 1: every character of the corpus gets a piece (the default, 0.9995, maps rare ones to
  // unknown); the ids: unknown 0, BOS 1, EOS 2 (SentencePiece's and Llama's).
  const std::unordered_map<std::string, std::string> spec = {
      {"vocab_size", std::to_string(vocab_size)}, {"model_type", algorithm}, {"character_coverage", "1.0"}};
  std::string model;
  sentencepiece::logging::SetMinLogLevel(1);
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(spec, &lines, &model);
  CHECK(status.ok(), "training a {}-token {} tokenizer on '{}' failed: {}", vocab_size, algorithm, corpus.path,
        status.ToString());
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  out << model;
  out.close();
  CHECK(out.good(), "cannot write the tokenizer to '{}' (tokenizer_path)", output);
}

}  // namespace remat::train
