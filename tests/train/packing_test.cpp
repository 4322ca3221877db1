// packing=false: each sequence is one document from its start, cut to seq+1 tokens or padded (inputs 0, targets
// -1). Documents are known here by construction (each made of one letter), not by the reader's index: a drawn
// sequence names its document by its first token. Shards carry a document index (format version 2) and give the
// sequences the text gives; a version-1 shard still reads packed and is refused unpacked, naming the file.
#include "train/data.h"
#include "train/shards.h"
#include "train/tokenizer.h"

#include "support/error_of.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace remat::train {
namespace {

namespace fs = std::filesystem;
using testing_support::error_of;
using testing_support::TempDir;

constexpr int64_t kSeq = 16;
const std::vector<int64_t> kLengths = {3, 10, 25, 1, 40, 17};  // document k: kLengths[k] times the letter 'a' + k

void write_documents(const fs::path& path) {
  std::ofstream out(path);
  for (size_t k = 0; k < kLengths.size(); ++k)
    out << R"({"text": ")" << std::string(static_cast<size_t>(kLengths[k]), static_cast<char>('a' + k)) << "\"}\n";
}

DataConfig jsonl(const fs::path& path, const fs::path& eval, const std::string& type = "jsonl") {
  DataConfig c;
  c.corpus = {.type = type, .path = path.string(), .column = "text"};
  c.eval_path = eval.string();
  c.packing = false;
  return c;
}

TEST(Packing, AnUnpackedSequenceIsOneDocumentFromItsStartCutOrPadded) {
  TempDir d;
  write_documents(d.path / "docs.jsonl");
  const Dataset ds = load_dataset(jsonl(d.path / "docs.jsonl", d.path / "docs.jsonl"), Tokenizer({}), 256);
  EXPECT_EQ(ds.train.documents(), static_cast<int64_t>(kLengths.size()));
  constexpr int64_t kRows = 300;
  std::vector<int32_t> in(kRows * kSeq), tg(kRows * kSeq);
  Batcher(ds.train, kSeq, 5, "train", false).next(kRows, in.data(), tg.data());
  std::set<int64_t> seen;
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t k = in[static_cast<size_t>(r * kSeq)] - 'a';
    ASSERT_TRUE(k >= 0 && k < static_cast<int64_t>(kLengths.size())) << "row " << r << " starts with no document";
    seen.insert(k);
    const int64_t n = std::min(kLengths[static_cast<size_t>(k)], kSeq + 1);  // the tokens it holds
    for (int64_t t = 0; t < kSeq; ++t) {
      const auto at = static_cast<size_t>(r * kSeq + t);
      ASSERT_EQ(in[at], t < n ? 'a' + k : 0) << "row " << r << " (document " << k << ") input " << t;
      ASSERT_EQ(tg[at], t + 1 < n ? 'a' + k : -1) << "row " << r << " (document " << k << ") target " << t;
    }
  }
  EXPECT_EQ(seen.size(), kLengths.size()) << "every document is drawn";
}

TEST(Packing, TheSplitCutsADocumentAndTheValidationStartsWithItsTail) {
  TempDir d;
  write_documents(d.path / "docs.jsonl");
  DataConfig c = jsonl(d.path / "docs.jsonl", "");
  c.validation_fraction = 0.5;
  const Dataset ds = load_dataset(c, Tokenizer({}), 256);
  int64_t total = 0;
  for (int64_t n : kLengths) total += n;
  const auto cut = static_cast<int64_t>(static_cast<double>(total) * 0.5);
  int64_t start = 0, k = 0;
  while (start + kLengths[static_cast<size_t>(k)] <= cut) start += kLengths[static_cast<size_t>(k++)];
  ASSERT_LT(start, cut) << "the cut falls inside document " << k;
  EXPECT_EQ(ds.train.documents(), k + 1);
  EXPECT_EQ(ds.validation.documents(), static_cast<int64_t>(kLengths.size()) - k);
  const Tokens::Span head = ds.train.document(k), tail = ds.validation.document(0);
  EXPECT_EQ(head.start, start);
  EXPECT_EQ(head.count, cut - start);
  EXPECT_EQ(tail.start, 0);
  EXPECT_EQ(tail.count, start + kLengths[static_cast<size_t>(k)] - cut);
  EXPECT_EQ(ds.validation.document(1).start, tail.count);
}

// The shard's bytes after its tokens: one uint64 per document, where it starts.
std::vector<uint64_t> index_of(const fs::path& shard, const ShardHeader& h) {
  std::ifstream in(shard, std::ios::binary);
  in.seekg(kShardHeaderBytes + h.tokens * h.token_bytes);
  std::vector<uint64_t> starts(static_cast<size_t>(h.documents));
  in.read(reinterpret_cast<char*>(starts.data()), static_cast<std::streamsize>(8 * starts.size()));
  EXPECT_TRUE(in.good()) << shard;
  return starts;
}

TEST(Packing, ShardsGiveTheSequencesTheTextGives) {
  TempDir d;
  write_documents(d.path / "docs.jsonl");
  const Tokenizer bytes({});
  const std::vector<fs::path> shards =
      prepare_shards({.type = "jsonl", .path = (d.path / "docs.jsonl").string(), .column = "text"}, bytes, d.path / "shards");
  ASSERT_EQ(shards.size(), 1u);
  const ShardHeader h = open_shard(shards[0], 256).header;
  std::vector<uint64_t> want(1, 0);
  for (int64_t n : kLengths) want.push_back(want.back() + static_cast<uint64_t>(n));
  want.pop_back();
  EXPECT_EQ(index_of(shards[0], h), want);
  for (double fraction : {0.1, 0.5}) {
    DataConfig text = jsonl(d.path / "docs.jsonl", ""), tokens = jsonl(shards[0], "", "tokens");
    text.validation_fraction = tokens.validation_fraction = fraction;
    const Dataset a = load_dataset(text, bytes, 256), b = load_dataset(tokens, bytes, 256);
    for (const char* split : {"train", "validation"}) {
      const bool train = std::string(split) == "train";
      std::vector<int32_t> in_a(8 * kSeq), tg_a(8 * kSeq), in_b(8 * kSeq), tg_b(8 * kSeq);
      Batcher(train ? a.train : a.validation, kSeq, 3, split, false).next(8, in_a.data(), tg_a.data());
      Batcher(train ? b.train : b.validation, kSeq, 3, split, false).next(8, in_b.data(), tg_b.data());
      EXPECT_EQ(in_a, in_b) << split << ", fraction " << fraction;
      EXPECT_EQ(tg_a, tg_b) << split << ", fraction " << fraction;
    }
  }
}

// Rewrites `shard` in place: format version 1 (no index), or an index entry past the tokens.
void rewrite(const fs::path& shard, bool as_version_1) {
  const ShardHeader h = open_shard(shard, 256).header;
  std::fstream f(shard, std::ios::binary | std::ios::in | std::ios::out);
  if (as_version_1) {
    const uint32_t one = 1;
    f.seekp(8);
    f.write(reinterpret_cast<const char*>(&one), 4);
    f.close();
    fs::resize_file(shard, static_cast<uintmax_t>(kShardHeaderBytes + h.tokens * h.token_bytes));
    return;
  }
  const uint64_t past = static_cast<uint64_t>(h.tokens) + 5;
  f.seekp(kShardHeaderBytes + h.tokens * h.token_bytes + 8 * 2);  // document 2
  f.write(reinterpret_cast<const char*>(&past), 8);
}

TEST(Packing, AVersion1ShardReadsPackedAndIsRefusedUnpackedACorruptIndexIsAnError) {
  TempDir d;
  write_documents(d.path / "docs.jsonl");
  const Corpus corpus{.type = "jsonl", .path = (d.path / "docs.jsonl").string(), .column = "text"};
  const fs::path old = prepare_shards(corpus, Tokenizer({}), d.path / "old").at(0);
  const fs::path corrupt = prepare_shards(corpus, Tokenizer({}), d.path / "corrupt").at(0);
  rewrite(old, true);
  rewrite(corrupt, false);
  const Dataset v1 = load_dataset(jsonl(old, old, "tokens"), Tokenizer({}), 256);
  std::vector<int32_t> in(kSeq), tg(kSeq);
  EXPECT_EQ(error_of([&] { Batcher(v1.train, kSeq, 1, "train", true).next(1, in.data(), tg.data()); }), "");
  const std::string e = error_of([&] { Batcher(v1.train, kSeq, 1, "train", false); });
  EXPECT_NE(e.find("token shard '" + old.string() + "' has format version 1, without the document index that "
                   "packing=false needs"), std::string::npos) << e;
  const std::string c = error_of([&] {
    const Dataset ds = load_dataset(jsonl(corrupt, corrupt, "tokens"), Tokenizer({}), 256);
    std::vector<int32_t> rows_in(50 * kSeq), rows_tg(50 * kSeq);
    Batcher(ds.train, kSeq, 1, "train", false).next(50, rows_in.data(), rows_tg.data());
  });
  EXPECT_NE(c.find("token shard '" + corrupt.string() + "' says document 2 starts at token"), std::string::npos) << c;
}

TEST(Packing, ADataParallelRankDrawsWhatOneProcessDrawsForItsPart) {
  TempDir d;
  write_documents(d.path / "docs.jsonl");
  const Dataset ds = load_dataset(jsonl(d.path / "docs.jsonl", d.path / "docs.jsonl"), Tokenizer({}), 256);
  std::vector<int32_t> in(6 * kSeq), tg(6 * kSeq), in1(3 * kSeq), tg1(3 * kSeq);
  Batcher(ds.train, kSeq, 9, "train", false).next(6, in.data(), tg.data());
  Batcher(ds.train, kSeq, 9, "train", false).next(3, in1.data(), tg1.data(), 1, 2);
  EXPECT_EQ(in1, std::vector<int32_t>(in.begin() + 3 * kSeq, in.end()));
  EXPECT_EQ(tg1, std::vector<int32_t>(tg.begin() + 3 * kSeq, tg.end()));
}

}  // namespace
}  // namespace remat::train
