// Tokenizers and datasets beyond bytes: a SentencePiece model trained and read back, JSONL documents packed
// with BOS and EOS, glob patterns, token shards (their bytes read here by hand, not by the reader), and the
// errors that name a bad file and what is wrong with it.
#include "train/data.h"
#include "train/shards.h"
#include "train/tokenizer.h"

#include "support/error_of.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace remat::train {
namespace {

namespace fs = std::filesystem;
using testing_support::error_of;
using testing_support::TempDir;

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

// A small English-like corpus: 400 lines over a few words, deterministic.
std::string corpus_text() {
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "its", "red", "ball"};
  std::string text;
  for (int i = 0; i < 400; ++i) {
    for (int w = 0; w < 6; ++w) text += std::string(w ? " " : "") + words[(i * 7 + w * 5 + i / 13) % 13];
    text += ".\n";
  }
  return text;
}

std::vector<int32_t> all(const Tokens& t) {
  std::vector<int32_t> out(static_cast<size_t>(t.size()));
  t.read(0, t.size(), out.data());
  return out;
}

// A tokenizer of `pieces` trained on corpus_text(), in `dir`.
TokenizerConfig trained(const fs::path& dir, const std::string& algorithm = "bpe", int64_t pieces = 64) {
  std::ofstream(dir / "corpus.txt") << corpus_text();
  const std::string model = (dir / (algorithm + ".model")).string();
  train_tokenizer({.type = "text", .path = (dir / "corpus.txt").string(), .column = "text"}, pieces, algorithm, model);
  return {.type = "sentencepiece", .path = model};
}

DataConfig data(const std::string& type, const fs::path& path, const std::string& eval = "") {
  DataConfig c;
  c.corpus = {.type = type, .path = path.string(), .column = "text"};
  c.eval_path = eval;
  return c;
}

TEST(Tokenizer, TrainsAModelOfTheAskedSizeWithBosAndEosThatDecodesWhatItEncodes) {
  TempDir d;
  for (const char* algorithm : {"bpe", "unigram"}) {
    const Tokenizer t(trained(d.path, algorithm, 30));
    EXPECT_EQ(t.vocab_size(), 30) << algorithm;
    EXPECT_EQ(t.bos_id(), 1);
    EXPECT_EQ(t.eos_id(), 2);
    const std::string line = "the dog sat on its red mat.";
    const std::vector<int32_t> ids = t.encode(line);
    EXPECT_LT(ids.size(), line.size()) << algorithm << ": pieces longer than a character";
    EXPECT_EQ(t.decode(ids), line);
    std::vector<int32_t> document = {1};
    document.insert(document.end(), ids.begin(), ids.end());
    document.push_back(2);
    EXPECT_EQ(t.encode_document(line), document);
  }
  const Tokenizer bytes({});
  EXPECT_EQ(bytes.vocab_size(), 256);
  EXPECT_EQ(bytes.encode_document("ab"), (std::vector<int32_t>{'a', 'b'})) << "no BOS or EOS: the byte default as it was";
}

TEST(Tokenizer, AMissingOrCorruptModelIsAnErrorNamingTheFile) {
  TempDir d;
  const std::string missing = (d.path / "missing.model").string(), corrupt = (d.path / "corrupt.model").string();
  expect_contains(error_of([&] { Tokenizer({.type = "sentencepiece", .path = missing}); }),
                  "tokenizer_path '" + missing + "' does not exist");
  std::ofstream(corrupt) << "not a protobuf at all";
  expect_contains(error_of([&] { Tokenizer({.type = "sentencepiece", .path = corrupt}); }),
                  "tokenizer_path '" + corrupt + "' is not a SentencePiece model");
}

TEST(Data, JsonlDocumentsComeFromTheirColumnPackedBetweenBosAndEos) {
  TempDir d;
  const Tokenizer t(trained(d.path));
  std::ofstream(d.path / "docs.jsonl") << R"({"id": 1, "body": "the cat sat."})" << "\n\n"
                                       << R"({"body": "a dog ran to its ball.", "text": "ignored"})" << "\n";
  DataConfig c = data("jsonl", d.path / "docs.jsonl", (d.path / "docs.jsonl").string());  // all of it in train
  c.corpus.column = "body";
  const Dataset ds = load_dataset(c, t, 64);
  std::vector<int32_t> want = {1};
  for (int32_t id : t.encode("the cat sat.")) want.push_back(id);
  want.insert(want.end(), {2, 1});
  for (int32_t id : t.encode("a dog ran to its ball.")) want.push_back(id);
  want.push_back(2);
  EXPECT_EQ(all(ds.train), want);
  EXPECT_DOUBLE_EQ(ds.validation_bytes_per_token, 34.0 / static_cast<double>(want.size()));
}

TEST(Data, AJsonlLineThatIsNotJsonOrLacksTheFieldIsAnErrorNamingFileAndLine) {
  TempDir d;
  const fs::path bad = d.path / "bad.jsonl", lacking = d.path / "lacking.jsonl";
  std::ofstream(bad) << R"({"text": "fine"})" << "\n{not json\n";
  std::ofstream(lacking) << R"({"text": "fine"})" << "\n" << R"({"text": "fine"})" << "\n" << R"({"content": "x"})" << "\n";
  expect_contains(error_of([&] { load_dataset(data("jsonl", bad), Tokenizer({}), 256); }),
                  "'" + bad.string() + "' line 2 is not JSON");
  expect_contains(error_of([&] { load_dataset(data("jsonl", lacking), Tokenizer({}), 256); }),
                  "'" + lacking.string() + "' line 3 has no string field 'text' (config key train_data_columns)");
}

TEST(Data, AGlobPatternReadsTheFilesItMatches) {
  TempDir d;
  std::ofstream(d.path / "a.txt") << std::string(100, 'a');
  std::ofstream(d.path / "b.txt") << std::string(100, 'b');
  std::ofstream(d.path / "c.md") << std::string(100, 'c');
  const Dataset ds = load_dataset(data("text", d.path / "*.txt"), Tokenizer({}), 256);
  expect_contains(ds.description, "(2 files, 200 tokens)");
  EXPECT_EQ(ds.train.size(), 180);
  expect_contains(error_of([&] { load_dataset(data("text", d.path / "*.json"), Tokenizer({}), 256); }),
                  "is a pattern that matches no file");
}

// The shard of one text file, read by hand: the header's fields and the uint16 tokens after it.
TEST(Shards, APreparedShardIsItsHeaderThenTheDocumentsTokensAndReadsAsTheTextDoes) {
  TempDir d;
  const Tokenizer t(trained(d.path));
  fs::create_directories(d.path / "text");
  std::ofstream(d.path / "text" / "one.txt") << corpus_text().substr(0, 3000);
  std::ofstream(d.path / "text" / "two.txt") << corpus_text().substr(5000, 2000);
  const std::vector<fs::path> shards = prepare_shards(data("text", d.path / "text").corpus, t, d.path / "shards");
  ASSERT_EQ(shards.size(), 2u);
  std::ifstream in(shards[0], std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_GE(bytes.size(), 64u);
  uint32_t version = 0, width = 0;
  uint64_t fields[4] = {};
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&width, bytes.data() + 12, 4);
  std::memcpy(fields, bytes.data() + 16, sizeof fields);
  EXPECT_EQ(bytes.substr(0, 8), "RMTOKENS");
  EXPECT_EQ(version, 2u);
  EXPECT_EQ(width, 2u);
  const std::vector<int32_t> want = t.encode_document(corpus_text().substr(0, 3000));
  EXPECT_EQ(fields[0], 64u);                // vocabulary
  EXPECT_EQ(fields[1], want.size());        // tokens
  EXPECT_EQ(fields[2], 1u);                 // documents
  EXPECT_EQ(fields[3], 3000u);              // bytes of text
  ASSERT_EQ(bytes.size(), 64 + 2 * want.size() + 8);  // the tokens, then the document index: document 0 at 0
  EXPECT_EQ(bytes.substr(64 + 2 * want.size()), std::string(8, '\0'));
  for (size_t i = 0; i < want.size(); ++i) {
    uint16_t id = 0;
    std::memcpy(&id, bytes.data() + 64 + 2 * i, 2);
    ASSERT_EQ(id, want[i]) << "token " << i;
  }
  const Dataset text = load_dataset(data("text", d.path / "text"), t, 64);
  const Dataset tokens = load_dataset(data("tokens", d.path / "shards"), t, 64);
  EXPECT_EQ(all(tokens.train), all(text.train));
  EXPECT_EQ(all(tokens.validation), all(text.validation));
  EXPECT_DOUBLE_EQ(tokens.validation_bytes_per_token, text.validation_bytes_per_token);
}

// A shard written by hand: the RMTOKENS header, then `ids` as uint16, saying `vocab` and `count` tokens.
void write_shard(const fs::path& path, const std::vector<uint16_t>& ids, uint64_t vocab, uint64_t count, const char* magic = "RMTOKENS") {
  std::string header(64, '\0');
  const uint32_t version = 1, width = 2;
  const uint64_t fields[4] = {vocab, count, 1, count};
  std::memcpy(header.data(), magic, 8);
  std::memcpy(header.data() + 8, &version, 4);
  std::memcpy(header.data() + 12, &width, 4);
  std::memcpy(header.data() + 16, fields, sizeof fields);
  std::ofstream out(path, std::ios::binary);
  out << header;
  out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(2 * ids.size()));
}

TEST(Shards, ABadShardIsAnErrorNamingTheFileAndWhatIsWrong) {
  TempDir d;
  std::vector<uint16_t> ids(100, 7);
  ids[37] = 300;  // outside a 256-token vocabulary, in the training part
  const fs::path bad_id = d.path / "bad_id.tokens";
  write_shard(bad_id, ids, 256, ids.size());
  const Dataset ds = load_dataset(data("tokens", bad_id), Tokenizer({}), 256);
  std::vector<int32_t> out(90);
  expect_contains(error_of([&] { ds.train.read(0, 90, out.data()); }),
                  "token shard '" + bad_id.string() + "' holds token id 300 at token 37 (byte offset 138)");
  EXPECT_EQ(error_of([&] { ds.train.read(0, 37, out.data()); }), "") << "the tokens before it read";

  const fs::path truncated = d.path / "truncated.tokens", foreign = d.path / "foreign.tokens";
  write_shard(truncated, std::vector<uint16_t>(10, 7), 256, 11);
  write_shard(foreign, std::vector<uint16_t>(10, 7), 256, 10, "GPT2BIN!");
  expect_contains(error_of([&] { load_dataset(data("tokens", truncated), Tokenizer({}), 256); }),
                  "token shard '" + truncated.string() + "' is truncated or padded: its header says 11 tokens");
  expect_contains(error_of([&] { load_dataset(data("tokens", foreign), Tokenizer({}), 256); }),
                  "'" + foreign.string() + "' is not a token shard");
  expect_contains(error_of([&] { load_dataset(data("tokens", bad_id), Tokenizer({}), 512); }),
                  "token shard '" + bad_id.string() + "' was prepared with a 256-token vocabulary, but vocab_size is 512");
}

// Under data parallelism each rank reads only its own part's windows. A shard whose token i is i shows where each
// window of the global batch starts; in a copy of it every token of part 0's windows is made invalid. Part 1
// reads the copy as it read the original; part 0 fails on it.
TEST(Shards, ADataParallelRankReadsOnlyItsOwnWindows) {
  TempDir d;
  constexpr int64_t kTokens = 20000, kSeq = 8, kCount = 2;
  std::vector<uint16_t> ids(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) ids[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
  write_shard(d.path / "clean.tokens", ids, kTokens, kTokens);
  const Dataset clean = load_dataset(data("tokens", d.path / "clean.tokens"), Tokenizer({}), kTokens);
  std::vector<int32_t> in(2 * kCount * kSeq), tg(2 * kCount * kSeq);
  Batcher(clean.train, kSeq, 11, "train").next(2 * kCount, in.data(), tg.data());  // the global batch, one process
  std::vector<bool> part1(kTokens);
  for (int64_t w = kCount; w < 2 * kCount; ++w)
    for (int64_t t = 0; t <= kSeq; ++t) part1[static_cast<size_t>(in[static_cast<size_t>(w * kSeq)] + t)] = true;
  for (int64_t w = 0; w < kCount; ++w)
    for (int64_t t = 0; t <= kSeq; ++t) {
      const auto at = static_cast<size_t>(in[static_cast<size_t>(w * kSeq)] + t);
      ASSERT_FALSE(part1[at]) << "the parts' windows overlap: choose another seed";
      ids[at] = 65535;
    }
  write_shard(d.path / "poisoned.tokens", ids, kTokens, kTokens);
  const Dataset poisoned = load_dataset(data("tokens", d.path / "poisoned.tokens"), Tokenizer({}), kTokens);
  std::vector<int32_t> in1(kCount * kSeq), tg1(kCount * kSeq);
  Batcher(poisoned.train, kSeq, 11, "train").next(kCount, in1.data(), tg1.data(), 1, 2);
  EXPECT_EQ(in1, std::vector<int32_t>(in.begin() + kCount * kSeq, in.end()));
  EXPECT_EQ(tg1, std::vector<int32_t>(tg.begin() + kCount * kSeq, tg.end()));
  expect_contains(error_of([&] { Batcher(poisoned.train, kSeq, 11, "train").next(kCount, in1.data(), tg1.data(), 0, 2); }),
                  "holds token id 65535");
}

}  // namespace
}  // namespace remat::train
