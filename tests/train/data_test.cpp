// The data pipeline under the byte-level tokenizer: deterministic split and batches, and clear errors for bad input.
#include "train/data.h"

#include "base/check.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace remat::train {
namespace {

namespace fs = std::filesystem;

using testing_support::TempDir;

using testing_support::error_of;

// A text dataset under the byte-level tokenizer, each file's last tenth held out.
Dataset load_dataset(const std::string& path, double validation_fraction) {
  DataConfig config;
  config.corpus.path = path;
  config.validation_fraction = validation_fraction;
  return train::load_dataset(config, Tokenizer({}), 256);
}

std::vector<int32_t> all(const Tokens& t) {
  std::vector<int32_t> out(static_cast<size_t>(t.size()));
  t.read(0, t.size(), out.data());
  return out;
}

TEST(Data, SplitsEachFileAndBatchesDeterministically) {
  TempDir d;
  std::ofstream(d.path / "a.txt") << std::string(100, 'a');
  std::ofstream(d.path / "b.txt") << std::string(50, 'b');
  Dataset ds = load_dataset(d.path.string(), 0.1);
  EXPECT_EQ(ds.train.size(), 90 + 45);
  EXPECT_EQ(ds.validation.size(), 10 + 5);
  EXPECT_EQ(all(ds.train).front(), 'a');
  EXPECT_EQ(all(ds.train).back(), 'b');
  std::vector<int32_t> in1(32), tg1(32), in2(32), tg2(32);
  Batcher(ds.train, 8, 3, "train").next(4, in1.data(), tg1.data());
  Batcher(ds.train, 8, 3, "train").next(4, in2.data(), tg2.data());
  EXPECT_EQ(in1, in2);
  EXPECT_EQ(tg1, tg2);
}

TEST(Data, TargetsAreInputsShiftedByOne) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 200; ++i) text += static_cast<char>('A' + i % 26);
  std::ofstream(d.path / "abc.txt") << text;
  Dataset ds = load_dataset((d.path / "abc.txt").string(), 0.1);
  std::vector<int32_t> in(16), tg(16);
  Batcher(ds.train, 16, 1, "train").next(1, in.data(), tg.data());
  for (int t = 0; t < 15; ++t) EXPECT_EQ(tg[static_cast<size_t>(t)], in[static_cast<size_t>(t + 1)]);
  EXPECT_EQ(tg[15], (in[15] - 'A' + 1) % 26 + 'A');
}

TEST(Data, ErrorsForBadPathEmptyDataAndLongSequences) {
  TempDir d;
  EXPECT_NE(error_of([&] { load_dataset((d.path / "missing").string(), 0.1); })
                .find("dataset_path '" + (d.path / "missing").string() + "' does not exist"),
            std::string::npos);
  std::ofstream(d.path / "empty.txt").close();
  EXPECT_NE(error_of([&] { load_dataset(d.path.string(), 0.1); }).find("holds no data (1 files, all empty)"),
            std::string::npos);
  std::ofstream(d.path / "short.txt") << "just a few bytes of text";
  Dataset ds = load_dataset((d.path / "short.txt").string(), 0.1);
  std::string e = error_of([&] { Batcher(ds.train, 64, 0, "train"); });
  EXPECT_NE(e.find("max_target_length 64 is too long for the train split"), std::string::npos) << e;
}

TEST(Data, DefaultCorpusIsTheDebianLicenses) {
  if (!fs::is_directory(kDefaultCorpus)) GTEST_SKIP() << kDefaultCorpus << " is absent on this machine";
  Dataset ds = load_dataset("", 0.1);
  EXPECT_NE(ds.description.find(kDefaultCorpus), std::string::npos);
  EXPECT_GT(ds.train.size(), 100000);
}

}  // namespace
}  // namespace remat::train
