// Generation with a KV cache (docs/generate.md): the prefill program (the prompt into the caches) and the
// one-token decode program, each compiled and planned before anything runs, and the sampling of each next
// token (greedy, or temperature, top-k and top-p from a seeded generator). `remat generate` and the training
// run's end-of-run sample use it.
//
//   trainer::Generator g({.model = m}, prompt.size(), prompt.size() + 20);
//   (fill g.prefill()'s parameters)  fmt::print("{}", g.plan_text());
//   std::vector<int32_t> text = g.generate(prompt, 20, {.temperature = 0.8, .top_p = 0.9, .seed = 1});
#pragma once

#include "trainer/programs.h"

#include <memory>
#include <random>
#include <span>

namespace remat::trainer {

struct Sampling {
  double temperature = 0;  // 0: greedy, the argmax (ties to the lowest id); > 0: softmax(logits / temperature)
  int64_t top_k = 0;       // > 0: only the k most likely tokens are drawn from (ties to the lowest ids)
  double top_p = 1;        // in (0, 1]: only the fewest most likely tokens whose probability reaches top_p
  uint64_t seed = 0;       // of the std::mt19937_64 the draws come from: a seed reproduces the text
};

// CHECKs the sampling keys, naming them (`where`: the command or config that gave them).
void validate(const Sampling& s, const std::string& where);

// The next token from one position's logits. With top_k and top_p at 0 and 1 the draw is the one the run's
// sample always made: std::discrete_distribution over every token's exp((logit - max) / temperature).
int32_t next_token(std::span<const float> logits, const Sampling& s, std::mt19937_64& rng);

struct GenerationTiming {
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // the decode: every token after the prefill's first
};

class Generator {
 public:
  // Compiles and plans both programs for one sequence: a prompt of `prompt_length` tokens, caches of
  // `max_length` positions. `base` gives the model and compile settings (its kind, shape and max_length are
  // set here). With `params_of` (the training step) both programs read its parameter buffers and run in its
  // arenas where they fit; without, the prefill owns the parameters (fill them through prefill().state())
  // and the decode reads them and runs in the prefill's arenas where it fits.
  Generator(compile::Request base, int64_t prompt_length, int64_t max_length, const Runner* params_of = nullptr);

  // The prompt followed by `new_tokens` tokens (prompt_length + new_tokens <= max_length, CHECKed), drawn from
  // the logits start() and next() return.
  std::vector<int32_t> generate(std::span<const int32_t> prompt, int64_t new_tokens, const Sampling& s);
  // The prefill: the prompt's keys and values into the caches; the last position's logits (valid until the next
  // call). Then next(token) for the token at each following position: its logits, its keys and values cached.
  std::span<const float> start(std::span<const int32_t> prompt);
  std::span<const float> next(int32_t token);

  Runner& prefill() { return *prefill_; }
  Runner& decode() { return *decode_; }
  const Runner& prefill() const { return *prefill_; }
  const Runner& decode() const { return *decode_; }
  int64_t max_length() const { return max_length_; }
  // What both allocated (Runner::bytes).
  int64_t bytes() const { return prefill_->bytes() + decode_->bytes(); }
  const GenerationTiming& timing() const { return timing_; }
  // One line per program, from its plan and signature: the arena, the caches, the parameters and the other
  // arguments, and the bytes it allocated (`parameters and arenas shared` where they are another's).
  std::string plan_text() const;

 private:
  const int64_t prompt_length_, max_length_;
  std::unique_ptr<Runner> prefill_, decode_;
  int64_t position_ = 0;  // of the token next() takes
  GenerationTiming timing_;
};

// The training run's end-of-run sample (sample_prompt, sample_length, sample_temperature, seeded by data_seed):
// the KV-cache Generator where it runs (no pipeline, FSDP or tensor split, and the prompt with sample_length
// tokens within max_target_length); else the full forward over the last max_target_length tokens for every
// new token (the logits program; beyond max_target_length a cache would take positions training never saw).
// sample_length 0 compiles neither (the sample is the prompt): at 4096 tokens the logits program alone held
// 750 MiB, more than the step's arenas could lend it.
class RunSample {
 public:
  // `base`: the run's compile settings for this rank (model, fusion, pipeline and stage).
  RunSample(const RunConfig& c, const train::Tokenizer& tokenizer, const Runner& step, compile::Request base);
  std::string text();  // decoded by the tokenizer
  int64_t bytes() const { return generator_ ? generator_->bytes() : logits_ ? logits_->bytes() : 0; }
  bool shares_arenas() const;
  bool kv_cache() const { return generator_ != nullptr; }

 private:
  const RunConfig& c_;
  const train::Tokenizer& tokenizer_;
  std::vector<int32_t> prompt_;  // encoded, after the tokenizer's BOS where it has one
  std::unique_ptr<Generator> generator_;
  std::unique_ptr<Runner> logits_;
};

}  // namespace remat::trainer
