#include "trainer/programs.h"

#include "trainer/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace remat::trainer {

exec::Array* arg_if(const ir::Signature& sig, std::vector<exec::Array>& args, std::string_view name) {
  for (size_t i = 0; i < sig.args.size(); ++i)
    if (sig.args[i].name == name) return &args[i];
  return nullptr;
}

Evaluator::Evaluator(const RunConfig& c, const train::Dataset& d, const Runner& step, compile::Compiled loss,
                     int64_t batch)
    : program_(std::move(loss), &step) {
  train::Batcher batcher(d.validation, c.shape.seq, c.data_seed + 1, "validation", c.data.packing);
  tokens_ = static_cast<size_t>(batch * c.shape.seq);
  batches_.assign(static_cast<size_t>(c.eval_steps), std::vector<int32_t>(2 * tokens_));
  for (std::vector<int32_t>& b : batches_) batcher.next(batch, b.data(), b.data() + tokens_);
}

double Evaluator::loss() {
  double sum = 0;
  exec::Array* inputs = arg_if(program_.signature, program_.args, "inputs");
  exec::Array* targets = arg_if(program_.signature, program_.args, "targets");
  const auto tokens = static_cast<std::ptrdiff_t>(tokens_);
  for (const std::vector<int32_t>& b : batches_) {
    if (inputs) std::copy(b.begin(), b.begin() + tokens, inputs->data<int32_t>());
    if (targets) std::copy(b.begin() + tokens, b.end(), targets->data<int32_t>());
    sum += program_.executable.run()[static_cast<size_t>(program_.signature.result("loss"))].get(0);
  }
  return sum / static_cast<double>(batches_.size());
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n' || c == '\t' || (c >= 32 && c < 127)) out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

std::string sample(const RunConfig& c, const train::Tokenizer& tokenizer, Runner& logits_program) {
  const int64_t seq = c.shape.seq;
  std::vector<int32_t> tokens = tokenizer.encode(c.sample_prompt.empty() ? "\n" : c.sample_prompt);
  if (tokenizer.bos_id() >= 0) tokens.insert(tokens.begin(), tokenizer.bos_id());  // as documents start in training
  std::mt19937_64 rng(c.data_seed + 7);
  std::vector<int32_t> none(static_cast<size_t>(seq));  // a pipeline rank without the embedding: not read
  exec::Array* inputs = arg_if(logits_program.signature, logits_program.args, "inputs");
  int32_t* window = inputs ? inputs->data<int32_t>() : none.data();
  const size_t logits_result = static_cast<size_t>(logits_program.signature.result("logits"));
  for (int64_t n = 0; n < c.sample_length; ++n) {
    int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - seq);
    int64_t len = static_cast<int64_t>(tokens.size()) - start;
    for (int64_t t = 0; t < seq; ++t)  // causal: tokens after the prompt's end do not affect its logits
      window[t] = t < len ? tokens[static_cast<size_t>(start + t)] : 0;
    const exec::Array& logits = logits_program.executable.run()[logits_result];
    const float* row = logits.data<float>() + (len - 1) * c.model.vocab_size;
    tokens.push_back(next_token({row, static_cast<size_t>(c.model.vocab_size)}, {.temperature = c.sample_temperature}, rng));
  }
  return tokenizer.decode(tokens);  // BOS and EOS decode to nothing
}

}  // namespace remat::trainer
