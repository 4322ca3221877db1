// End to end on real text (Debian's fortunes-min): a SentencePiece tokenizer trained by `remat tokenizer train`,
// the corpus tokenized by `remat data prepare`, a small model trained on the shards (validation loss per token
// and per byte, the bytes per token read from the validation shard's header by hand), a vocab_size that does not
// fit the tokenizer refused, a run killed after a checkpoint and resumed ending bit-identical, its checkpoint
// exported to a Hugging Face folder, and greedy generation from the checkpoint and from the reloaded folder giving
// the same text.
#include "support/command.h"
#include "support/remat_process.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

namespace remat {
namespace {

namespace fs = std::filesystem;
using testing_support::finish;
using testing_support::metrics;

const fs::path kFortunes = "/usr/share/games/fortunes";

// The model and the run, on the prepared shards: fortunes to train on, riddles to validate with.
std::vector<std::string> train_args(const std::string& run_name) {
  return {
      "train", "base_emb_dim=32", "base_num_decoder_layers=1", "base_num_query_heads=2", "base_num_kv_heads=2",
      "head_dim=16", "base_mlp_dim=64", "per_device_batch_size=2", "max_target_length=32", "steps=8",
      "eval_interval=4", "eval_steps=2", "sample_length=8", "enable_checkpointing=true", "checkpoint_period=2",
      "tokenizer_type=sentencepiece", "tokenizer_path=fortunes.model", "vocab_size=200", "dataset_type=tokens",
      "dataset_path=shards", "eval_dataset_path=eval", "run_name=" + run_name};
}

// What `remat generate` printed as the text: between its plan (the decode program's line) and its rates.
std::string generated(const std::string& out) {
  const size_t plan = out.find("decode: arena"), rates = out.rfind("\nprefill: ");
  if (plan == std::string::npos || rates == std::string::npos) return "(no text in: " + out + ")";
  const size_t text = out.find('\n', plan) + 1;
  return text <= rates ? out.substr(text, rates - text) : "(no text in: " + out + ")";
}

// A header field of a shard (uint64 at `offset`), read from its bytes.
uint64_t header_field(const fs::path& shard, int offset) {
  std::ifstream in(shard, std::ios::binary);
  char bytes[64] = {};
  in.read(bytes, 64);
  uint64_t v = 0;
  std::memcpy(&v, bytes + offset, 8);
  return v;
}

TEST(RealText, TokenizerShardsTrainingAndAKilledRunResumedBitIdentically) {
  if (!fs::exists(kFortunes / "fortunes")) GTEST_SKIP() << kFortunes << " is absent: scripts/setup.sh installs fortunes-min";
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  const std::string cd = fmt::format("cd '{}' && '{}'", dir.string(), REMAT_BINARY);
  testing_support::Output o = testing_support::run_command(
      cd + fmt::format(" tokenizer train dataset_path={} vocab_size=200 tokenizer_path=fortunes.model 2>&1", (kFortunes / "fortunes").string()));
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("(200 tokens, BOS 1, EOS 2)"), std::string::npos) << o.text;
  for (const auto& [file, out] : {std::pair{"fortunes", "shards"}, std::pair{"riddles", "eval"}}) {
    o = testing_support::run_command(cd + fmt::format(" data prepare dataset_path={} tokenizer_type=sentencepiece "
                                                      "tokenizer_path=fortunes.model output_path={} 2>&1", (kFortunes / file).string(), out));
    ASSERT_EQ(o.status, 0) << o.text;
    EXPECT_NE(o.text.find("prepare [##############################] 100%"), std::string::npos) << "the progress bar: " << o.text;
  }
  const fs::path eval_shard = dir / "eval" / "00000_riddles.tokens";
  ASSERT_TRUE(fs::exists(eval_shard));
  EXPECT_EQ(header_field(eval_shard, 40), fs::file_size(kFortunes / "riddles")) << "bytes of text";
  const double bytes_per_token = static_cast<double>(header_field(eval_shard, 40)) / static_cast<double>(header_field(eval_shard, 24));

  const fs::path log = dir / "whole.log";
  ASSERT_EQ(finish(testing_support::start_remat(dir, train_args("whole"), log)), 0);
  const auto want = metrics(dir / "runs" / "whole");
  ASSERT_EQ(want.size(), 8u);
  std::ifstream rows(dir / "runs" / "whole" / "metrics.jsonl");
  int evaluations = 0;
  for (std::string line; std::getline(rows, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (!row.contains("validation_loss")) continue;
    ++evaluations;
    EXPECT_NEAR(row.at("validation_loss_per_byte").get<double>(), row.at("validation_loss").get<double>() / bytes_per_token, 1e-12);
  }
  EXPECT_EQ(evaluations, 2);
  std::ifstream whole_log(log);
  const std::string whole_text{std::istreambuf_iterator<char>(whole_log), std::istreambuf_iterator<char>()};
  EXPECT_NE(whole_text.find(" nats/token, "), std::string::npos) << whole_text;
  EXPECT_NE(whole_text.find(" nats/byte\n"), std::string::npos) << whole_text;

  o = testing_support::run_command(cd + " train tokenizer_type=sentencepiece tokenizer_path=fortunes.model steps=1 2>&1");
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.text.find("vocab_size is 256 but the tokenizer 'fortunes.model' has 200 tokens"), std::string::npos) << o.text;
  o = testing_support::run_command(cd + " train vocab_size=200 steps=1 2>&1");  // the byte-level tokenizer
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.text.find("vocab_size is 200 but the byte-level tokenizer has 256 tokens"), std::string::npos) << o.text;

  const pid_t killed = testing_support::start_remat(dir, train_args("killed"));
  while (!fs::exists(dir / "runs" / "killed" / "checkpoints" / "4" / "state.safetensors") && testing_support::running(killed))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  kill(killed, SIGKILL);
  finish(killed);
  const fs::path resumed_log = dir / "resumed.log";
  ASSERT_EQ(finish(testing_support::start_remat(dir, train_args("killed"), resumed_log)), 0);
  EXPECT_GE(testing_support::resumed_step(resumed_log), 4) << "continued from a checkpoint";
  EXPECT_EQ(metrics(dir / "runs" / "killed"), want) << "losses and gradient norms, every step";
  testing_support::expect_same_tensors(train::read_safetensors(dir / "runs" / "whole" / "checkpoints" / "8" / "state.safetensors"),
                                       dir / "runs" / "killed" / "checkpoints" / "8" / "state.safetensors", "killed");

  o = testing_support::run_command(cd + " convert to=hf load_parameters_path=runs/killed/checkpoints/8 output_path=hf 2>&1");
  ASSERT_EQ(o.status, 0) << o.text;
  ASSERT_TRUE(fs::exists(dir / "hf" / "config.json") && fs::exists(dir / "hf" / "model.safetensors")) << o.text;
  const std::string generate = " generate 'prompt=Q: What' max_new_tokens=8 tokenizer_type=sentencepiece tokenizer_path=fortunes.model";
  const testing_support::Output from_checkpoint =
      testing_support::run_command(cd + generate + " load_parameters_path=runs/killed/checkpoints/8 2>&1");
  ASSERT_EQ(from_checkpoint.status, 0) << from_checkpoint.text;
  const testing_support::Output from_hf = testing_support::run_command(cd + generate + " load_parameters_path=hf 2>&1");
  ASSERT_EQ(from_hf.status, 0) << from_hf.text;
  EXPECT_TRUE(generated(from_checkpoint.text).starts_with("Q: What")) << from_checkpoint.text;
  EXPECT_EQ(generated(from_hf.text), generated(from_checkpoint.text)) << from_hf.text;
}

}  // namespace
}  // namespace remat
