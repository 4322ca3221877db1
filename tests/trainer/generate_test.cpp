// Generation with a KV cache (trainer/generate.h) against the full forward it replaces: the logits program run
// over the whole sequence so far, whose last row is the next token's distribution (the old sampling route).
// A small grouped-query model (4 heads, 2 kv heads) with random weights, in f32 and bf16.
#include "support/error_of.h"
#include "support/models.h"
#include "trainer/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>

namespace remat {
namespace {

using trainer::Generator;
using trainer::Runner;
using trainer::Sampling;

constexpr int64_t kMax = 12;  // cache positions; the tests generate up to the last one

nn::ModelConfig model(DType compute) {
  nn::ModelConfig c = testing_support::small_model(2, true, "full");
  c.precision.compute = compute;
  return c;
}

// Random weights, the kernels and embedding 20 times the initialisation's (std 0.4): attention then weighs the
// positions unevenly and the next token depends on the context, so that a wrong position or mask changes it.
void init(const nn::ModelConfig& c, Runner& r) {
  std::vector<exec::Array> params;
  for (size_t i = 0; i < r.signature.args.size(); ++i)
    if (r.signature.args[i].role == ir::Role::parameter) params.push_back(r.args[i]);
  nn::init_params(c, 3, params);
  for (size_t i = 0; i < params.size(); ++i)
    if (r.signature.args[i].name.find("norm") == std::string::npos)  // the norm scales stay ones
      for (int64_t k = 0; k < params[i].type().num_elements(); ++k) params[i].data<float>()[k] *= 20;
}

// The full forward over kMax positions: row t of its logits depends on tokens 0..t only (causal), so one program
// serves every prefix, the positions after it padded.
struct FullForward {
  Runner runner;
  explicit FullForward(const nn::ModelConfig& c)
      : runner(compile::compile({.model = c, .shape = {1, kMax, 1}, .kind = compile::Kind::logits})) {
    init(c, runner);
  }
  // The logits after `tokens` (its last position's row).
  std::vector<float> logits(const std::vector<int32_t>& tokens) {
    int32_t* in = runner.arg("inputs").data<int32_t>();
    for (int64_t t = 0; t < kMax; ++t) in[t] = t < static_cast<int64_t>(tokens.size()) ? tokens[static_cast<size_t>(t)] : 0;
    const exec::Array& out = runner.executable.run()[static_cast<size_t>(runner.signature.result("logits"))];
    const int64_t v = out.type().shape.back();
    const float* row = out.data<float>() + (static_cast<int64_t>(tokens.size()) - 1) * v;
    return {row, row + v};
  }
};

Generator generator(const nn::ModelConfig& c, int64_t prompt, int64_t max_length = kMax) {
  Generator g({.model = c}, prompt, max_length);
  init(c, g.prefill());
  return g;
}

std::vector<int32_t> prompt_of(int64_t n) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((37 * i + 11) % 256));
  return p;
}

int32_t argmax(std::span<const float> row) {  // ties to the lowest id
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

class Greedy : public testing::TestWithParam<std::tuple<DType, int64_t>> {};

// Greedy KV-cache decoding picks, at every step up to the caches' last position, the argmax of the full forward
// over the sequence so far; from a prompt of one token and of five.
TEST_P(Greedy, EqualsTheFullForwardsArgmaxAtEveryStep) {
  const auto [dtype, prompt_length] = GetParam();
  const nn::ModelConfig c = model(dtype);
  FullForward full(c);
  Generator g = generator(c, prompt_length);
  const std::vector<int32_t> prompt = prompt_of(prompt_length);
  const std::vector<int32_t> tokens = g.generate(prompt, kMax - prompt_length, {});
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), kMax);
  for (int64_t n = prompt_length; n < kMax; ++n) {
    const std::vector<int32_t> so_far(tokens.begin(), tokens.begin() + n);
    EXPECT_EQ(tokens[static_cast<size_t>(n)], argmax(full.logits(so_far))) << "position " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Generate, Greedy,
                         testing::Combine(testing::Values(DType::f32, DType::bf16), testing::Values(1, 5)),
                         [](const auto& info) {
                           return fmt::format("{}_prompt{}", dtype_name(std::get<0>(info.param)), std::get<1>(info.param));
                         });

// Each step's logits equal the full forward's last row. They come out bit-identical on AVX-512 CPUs (f32 and
// bf16): the cached attention sums the same terms, each masked cache position adding an exact zero. The bounds
// leave room for kernels that sum otherwise for one row than for t rows — a dot over S keys blocked otherwise than
// over t, AVX2's oneDNN GEMMs (another kernel for a one-row product): 1e-5 of the logits' scale in f32 (a few
// roundings in each of the model's matmuls; a wrong cache entry or mask moves logits by their own scale), 2^-8 in
// bf16 (one rounding of a bf16 value feeding the logits).
TEST(Generate, EveryStepsLogitsAreTheFullForwardsLastRow) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const nn::ModelConfig c = model(dtype);
    const double tolerance = dtype == DType::f32 ? 1e-5 : 1.0 / 256;
    FullForward full(c);
    Generator g = generator(c, 3);
    std::vector<int32_t> tokens = prompt_of(3);
    std::span<const float> got = g.start(tokens);
    for (int64_t n = 3;; ++n) {
      const std::vector<float> want = full.logits(tokens);
      double scale = 0, worst = 0;
      for (float w : want) scale = std::max(scale, std::abs(double(w)));
      for (size_t v = 0; v < want.size(); ++v) {
        const double d = std::abs(double(got[v]) - want[v]);
        if (!(d <= worst)) worst = d;  // a NaN too
      }
      EXPECT_LE(worst, tolerance * std::max(scale, 1.0)) << dtype_name(dtype) << " position " << n - 1;
      if (n == kMax) break;
      tokens.push_back(argmax(got));
      got = g.next(tokens.back());
    }
  }
}

// What plan_text prints is what the executables hold: each program's arena as planned, the caches (2 x L x S x
// KV x Dh floats, counted here from the model's shape) and the bytes each allocated; a run's measured peak is the
// planned one.
TEST(Generate, PrintedPlanIsWhatTheExecutablesHold) {
  const nn::ModelConfig c = model(DType::f32);
  Generator g = generator(c, 4);
  g.generate(prompt_of(4), kMax - 4, {});
  const std::string text = g.plan_text();
  const std::regex line(R"((\w+): arena [^(]+\((\d+) bytes\), (caches in the arena|caches [^(]+\((\d+) bytes, arguments\)), .*allocated [^(]+\((\d+) bytes\))");
  int lines = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it, ++lines) {
    const std::smatch& m = *it;
    const Runner& r = m[1] == "prefill" ? g.prefill() : g.decode();
    const plan::Plan& p = r.executable.plan();
    EXPECT_EQ(std::stoll(m[2]), p.arena[0] + p.arena[1]) << m[0];
    EXPECT_EQ(std::stoll(m[5]), r.executable.owned_bytes()) << m[0];
    EXPECT_EQ(r.executable.measured_peak(plan::Space::device), p.lower_bound[0]) << m[0];
    if (m[1] == "decode") {
      EXPECT_EQ(std::stoll(m[4]), 2 * c.num_decoder_layers * kMax * c.num_kv_heads * c.head_dim * 4);
    }
  }
  EXPECT_EQ(lines, 2) << text;
}

// A seed reproduces the text and another seed changes it; top_k = 1 is greedy at any temperature.
TEST(Generate, SeededSamplingIsReproducibleAndTopK1IsGreedy) {
  const nn::ModelConfig c = model(DType::f32);
  Generator g = generator(c, 2);
  const std::vector<int32_t> prompt = prompt_of(2);
  const Sampling hot{.temperature = 2, .seed = 5};
  const std::vector<int32_t> a = g.generate(prompt, kMax - 2, hot), b = g.generate(prompt, kMax - 2, hot);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, g.generate(prompt, kMax - 2, {.temperature = 2, .seed = 6}));
  EXPECT_EQ(g.generate(prompt, kMax - 2, {.temperature = 2, .top_k = 1, .seed = 5}), g.generate(prompt, kMax - 2, {}));
}

// The draw's distribution, counted: probabilities 0.1, 0.2, 0.3, 0.4 (logits their logs at temperature 1). top_k = 2
// keeps {3, 2}; top_p = 0.75 keeps {3, 2, 1} (0.4 + 0.3 < 0.75 <= 0.9); top_p = 0.35 keeps {3}. Each kept token
// comes at its renormalised probability within 0.02 over 20000 draws (4.5 standard deviations at most).
TEST(Generate, TopKAndTopPDrawFromTheRenormalisedHead) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  struct Case {
    Sampling s;
    std::vector<double> want;
  };
  const std::vector<Case> cases = {{{.temperature = 1}, {0.1, 0.2, 0.3, 0.4}},
                                   {{.temperature = 1, .top_k = 2}, {0, 0, 3 / 7.0, 4 / 7.0}},
                                   {{.temperature = 1, .top_p = 0.75}, {0, 2 / 9.0, 3 / 9.0, 4 / 9.0}},
                                   {{.temperature = 1, .top_p = 0.35}, {0, 0, 0, 1}}};
  for (const Case& k : cases) {
    std::mt19937_64 rng(1);
    std::vector<double> seen(4);
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) seen[static_cast<size_t>(trainer::next_token(logits, k.s, rng))] += 1.0 / draws;
    for (size_t v = 0; v < 4; ++v)
      EXPECT_NEAR(seen[v], k.want[v], k.want[v] == 0 ? 0 : 0.02) << "top_k " << k.s.top_k << " top_p " << k.s.top_p << " token " << v;
  }
}

TEST(Generate, BadInputsAreClearErrors) {
  const nn::ModelConfig c = model(DType::f32);
  auto error = [](const std::function<void()>& f) { return testing_support::error_of(f); };
  EXPECT_NE(error([&] { generator(c, kMax + 1); }).find("at most the cache's 12 positions"), std::string::npos);
  Generator g = generator(c, 4);
  EXPECT_NE(error([&] { g.generate(prompt_of(4), kMax - 3, {}); }).find("do not fit the 12 positions"), std::string::npos);
  EXPECT_NE(error([&] { g.start(prompt_of(3)); }).find("a prompt of 3 tokens, the programs were planned for 4"),
            std::string::npos);
  g.start(prompt_of(4));
  for (int64_t n = 4; n < kMax; ++n) g.next(1);
  EXPECT_NE(error([&] { g.next(1); }).find("past the 12 positions"), std::string::npos);
  EXPECT_NE(error([] { trainer::validate({.top_p = 0}, "here"); }).find("here: top_p=0 must be in (0, 1]"), std::string::npos);
  EXPECT_NE(error([] { trainer::validate({.top_p = 1.5}, "here"); }).find("top_p=1.5 must be in (0, 1]"), std::string::npos);
  EXPECT_NE(error([] { trainer::validate({.top_k = -1}, "here"); }).find("top_k=-1 must be >= 0"), std::string::npos);
  EXPECT_NE(error([] { trainer::validate({.temperature = -1}, "here"); }).find("temperature=-1 must be >= 0"), std::string::npos);
  nn::ModelConfig split = c;
  split.mesh = nn::Mesh{{{"tensor", 2}}};
  EXPECT_NE(error([&] { generator(split, 4); }).find("runs the whole model on one device"), std::string::npos);
}

}  // namespace
}  // namespace remat
