// Generation: tokens/s of the KV-cache prefill and decode (trainer::Generator) against the full forward per
// token that sampling ran before (the logits program over the whole window, its last row read), for the `tiny`
// default and a TinyLlama-1.1B-shaped model (GQA 32/4 heads, random weights), f32, caches of 64 positions.
// Run: make bench (or build/remat_bench --benchmark_filter=Generate)
#include "cli/config.h"
#include "trainer/generate.h"

#include <benchmark/benchmark.h>

namespace remat {
namespace {

constexpr int64_t kPrompt = 16, kLength = 64;

// The tiny default (1.1M parameters), or TinyLlama 1.1B's preset (configs/models/tinyllama-1.1b.yml).
nn::ModelConfig model(int64_t size) {
  return size == 1100 ? cli::load_config("", {"model=tinyllama-1.1b"}).run.model : nn::ModelConfig{};
}

void init(const nn::ModelConfig& c, trainer::Runner& r) {
  std::vector<exec::Array> params;
  for (size_t i = 0; i < r.signature.args.size(); ++i)
    if (r.signature.args[i].role == ir::Role::parameter) params.push_back(r.args[i]);
  nn::init_params(c, 0, params);
}

// The prefill of a kPrompt-token prompt, per iteration.
void GeneratePrefill(benchmark::State& state) {
  const nn::ModelConfig c = model(state.range(0));
  trainer::Generator g({.model = c}, kPrompt, kLength);
  init(c, g.prefill());
  const std::vector<int32_t> prompt(kPrompt, 1);
  for (auto _ : state) benchmark::DoNotOptimize(g.start(prompt).data());
  state.counters["tokens/s"] = benchmark::Counter(kPrompt, benchmark::Counter::kIsIterationInvariantRate);
}

// Every decode step after the prompt up to the caches' end, per iteration.
void GenerateDecode(benchmark::State& state) {
  const nn::ModelConfig c = model(state.range(0));
  trainer::Generator g({.model = c}, kPrompt, kLength);
  init(c, g.prefill());
  const std::vector<int32_t> prompt(kPrompt, 1);
  for (auto _ : state) {
    g.start(prompt);
    for (int64_t n = kPrompt; n < kLength; ++n) benchmark::DoNotOptimize(g.next(1).data());
  }
  state.counters["tokens/s"] = benchmark::Counter(kLength - kPrompt, benchmark::Counter::kIsIterationInvariantRate);
}

// The route sampling took before: one full forward over the kLength-token window per new token.
void GenerateFullForwardPerToken(benchmark::State& state) {
  const nn::ModelConfig c = model(state.range(0));
  trainer::Runner r(compile::compile({.model = c, .shape = {1, kLength, 1}, .kind = compile::Kind::logits}));
  init(c, r);
  for (auto _ : state) benchmark::DoNotOptimize(r.executable.run().data());
  state.counters["tokens/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

// The 1.1B model (4.4 GB of f32 weights) runs each a few times only: seconds per iteration on two cores.
BENCHMARK(GeneratePrefill)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(GeneratePrefill)->Arg(1100)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);
BENCHMARK(GenerateDecode)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(GenerateDecode)->Arg(1100)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(GenerateFullForwardPerToken)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(GenerateFullForwardPerToken)->Arg(1100)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);

}  // namespace
}  // namespace remat
