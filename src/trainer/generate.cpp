#include "trainer/generate.h"

#include "plan/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

namespace remat::trainer {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void copy(const exec::Array& from, exec::Array& to) {
  ASSERT(from.type() == to.type());
  std::memcpy(to.bytes(), from.bytes(), static_cast<size_t>(to.type().bytes()));
}

// The result's logits as a row of the vocabulary (batch 1).
std::span<const float> logits_row(Runner& r, const std::vector<exec::Array>& out) {
  const exec::Array& logits = out[static_cast<size_t>(r.signature.result("logits"))];
  return {logits.data<float>(), static_cast<size_t>(logits.type().shape.back())};
}

}  // namespace

void validate(const Sampling& s, const std::string& where) {
  CHECK(s.temperature >= 0 && std::isfinite(s.temperature),
        "{}: temperature={} must be >= 0 (0: greedy)", where, s.temperature);
  CHECK(s.top_k >= 0, "{}: top_k={} must be >= 0 (0: every token)", where, s.top_k);
  CHECK(s.top_p > 0 && s.top_p <= 1, "{}: top_p={} must be in (0, 1] (1: every token)", where, s.top_p);
}

int32_t next_token(std::span<const float> logits, const Sampling& s, std::mt19937_64& rng) {
  if (s.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> w(logits.size());
  for (size_t v = 0; v < w.size(); ++v) w[v] = std::exp((logits[v] - top) / s.temperature);
  const size_t k = s.top_k > 0 ? std::min(w.size(), static_cast<size_t>(s.top_k)) : w.size();
  if (k < w.size() || s.top_p < 1) {  // keep the most likely: the first k, then the fewest reaching top_p
    std::vector<size_t> order(w.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return w[a] > w[b]; });
    double total = 0;
    for (size_t i = 0; i < k; ++i) total += w[order[i]];
    size_t kept = 0;
    for (double sum = 0; kept < k && sum < s.top_p * total; ++kept) sum += w[order[kept]];
    for (size_t i = kept; i < order.size(); ++i) w[order[i]] = 0;
  }
  return std::discrete_distribution<int32_t>(w.begin(), w.end())(rng);
}

Generator::Generator(compile::Request base, int64_t prompt_length, int64_t max_length, const Runner* params_of)
    : prompt_length_(prompt_length), max_length_(max_length) {
  base.pipeline = nullptr;
  base.max_length = max_length;
  base.kind = compile::Kind::prefill;
  base.shape = {1, prompt_length, 1};
  prefill_ = std::make_unique<Runner>(compile::compile(base), params_of);
  base.kind = compile::Kind::decode;
  base.shape = {1, 1, 1};
  decode_ = std::make_unique<Runner>(compile::compile(base), params_of ? params_of : prefill_.get());
}

std::span<const float> Generator::start(std::span<const int32_t> prompt) {
  CHECK(static_cast<int64_t>(prompt.size()) == prompt_length_, "generation: a prompt of {} tokens, the programs were "
        "planned for {}", prompt.size(), prompt_length_);
  std::copy(prompt.begin(), prompt.end(), prefill_->arg("inputs").data<int32_t>());
  const std::vector<exec::Array>& out = prefill_->executable.run();
  for (const char* cache : {"cache/key", "cache/value"})
    copy(out[static_cast<size_t>(prefill_->signature.result(cache))], decode_->arg(cache));
  position_ = prompt_length_;
  return logits_row(*prefill_, out);
}

std::span<const float> Generator::next(int32_t token) {
  CHECK(position_ >= prompt_length_ && position_ < max_length_, "generation: position {} is {}", position_,
        position_ < prompt_length_ ? "before the prompt's end: start() first"
                                   : fmt::format("past the {} positions the caches hold", max_length_));
  decode_->arg("inputs").set(0, token);
  decode_->arg("position").set(0, static_cast<double>(position_++));
  const std::vector<exec::Array>& out = decode_->executable.run();
  for (const char* cache : {"cache/key", "cache/value"})
    copy(out[static_cast<size_t>(decode_->signature.result(std::string("new_") + cache))], decode_->arg(cache));
  return logits_row(*decode_, out);
}

std::vector<int32_t> Generator::generate(std::span<const int32_t> prompt, int64_t new_tokens, const Sampling& s) {
  CHECK(new_tokens >= 0 && prompt_length_ + new_tokens <= max_length_,
        "generation: {} new tokens after a prompt of {} do not fit the {} positions the programs were planned for",
        new_tokens, prompt_length_, max_length_);
  std::mt19937_64 rng(s.seed);
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  timing_ = {.prompt_tokens = prompt_length_, .new_tokens = new_tokens};
  if (new_tokens == 0) return tokens;
  auto clock = std::chrono::steady_clock::now();
  tokens.push_back(next_token(start(prompt), s, rng));
  timing_.prefill_seconds = seconds_since(clock);
  clock = std::chrono::steady_clock::now();
  while (static_cast<int64_t>(tokens.size()) < prompt_length_ + new_tokens)
    tokens.push_back(next_token(next(tokens.back()), s, rng));
  timing_.decode_seconds = seconds_since(clock);
  return tokens;
}

std::string Generator::plan_text() const {
  auto str = [](int64_t bytes) { return plan::bytes_str(static_cast<double>(bytes)); };
  std::string out;
  for (const Runner* r : {prefill_.get(), decode_.get()}) {
    int64_t params = 0, caches = 0, inputs = 0;
    for (size_t i = 0; i < r->signature.args.size(); ++i) {
      const ir::Slot& a = r->signature.args[i];
      (a.role == ir::Role::parameter ? params : a.name.starts_with("cache/") ? caches : inputs) += r->args[i].type().bytes();
    }
    const plan::Plan& p = r->executable.plan();
    const int64_t arena = p.arena[0] + p.arena[1];
    // The prefill's caches are results in its arena; the decode's are arguments, their new values in its arena.
    out += fmt::format("{}: arena {} ({} bytes), {}, parameters {} ({} bytes), inputs {} bytes; allocated {} ({} "
                       "bytes){}\n",
                       r->executable.graph().name, str(arena), arena,
                       caches > 0 ? fmt::format("caches {} ({} bytes, arguments)", str(caches), caches)
                                  : "caches in the arena",
                       str(params), params, inputs, str(r->bytes()), r->bytes(),
                       r->executable.shares_arenas() ? ", arenas shared" : "");
  }
  return out;
}

RunSample::RunSample(const RunConfig& c, const train::Tokenizer& tokenizer, const Runner& step, compile::Request base)
    : c_(c), tokenizer_(tokenizer), prompt_(tokenizer.encode(c.sample_prompt.empty() ? "\n" : c.sample_prompt)) {
  if (tokenizer.bos_id() >= 0) prompt_.insert(prompt_.begin(), tokenizer.bos_id());  // as documents start in training
  const int64_t length = static_cast<int64_t>(prompt_.size()) + c.sample_length;
  const bool one_device = c.model.mesh.size("fsdp") == 1 && c.model.mesh.size("tensor") == 1 && !base.pipeline;
  if (c.sample_length == 0) return;
  if (one_device && length <= c.shape.seq) {
    generator_ = std::make_unique<Generator>(base, static_cast<int64_t>(prompt_.size()), length, &step);
  } else {
    base.kind = compile::Kind::logits;
    base.shape = {1, c.shape.seq, 1};
    logits_ = std::make_unique<Runner>(compile::compile(base), &step);
  }
}

std::string RunSample::text() {
  if (c_.sample_length == 0) return tokenizer_.decode(prompt_);  // BOS decodes to nothing
  if (!generator_) return sample(c_, tokenizer_, *logits_);
  const Sampling s{.temperature = c_.sample_temperature, .seed = c_.data_seed + 7};
  return tokenizer_.decode(generator_->generate(prompt_, c_.sample_length, s));  // BOS and EOS decode to nothing
}

bool RunSample::shares_arenas() const {
  if (c_.sample_length == 0) return true;  // nothing of its own
  if (!generator_) return logits_->executable.shares_arenas();
  return generator_->prefill().executable.shares_arenas() && generator_->decode().executable.shares_arenas();
}

}  // namespace remat::trainer
