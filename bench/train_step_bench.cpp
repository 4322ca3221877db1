// Training-step time (forward, backward, AdamW; remat full; the planned arena executor) in f32 and in
// bf16 compute, for the `tiny` config and a ~100M-parameter one. Run: make bench
#include "exec/executable.h"
#include "compile/compile.h"
#include "train/step.h"

#include <benchmark/benchmark.h>

namespace remat {
namespace {

nn::ModelConfig model(int64_t size) {
  nn::ModelConfig c;  // the tiny default: 1.1M parameters
  if (size == 100) {  // 12 layers, d=768, 12 heads, mlp 3072: 114M parameters
    c.emb_dim = 768;
    c.num_decoder_layers = 12;
    c.num_heads = 12;
    c.num_kv_heads = 12;
    c.head_dim = 64;
    c.mlp_dim = 3072;
  }
  return c;
}

void TrainStep(benchmark::State& state) {
  nn::ModelConfig c = model(state.range(0));
  c.precision = nn::parse_precision(state.range(1) ? "p=f32,c=bf16" : "f32");
  const train::StepShape shape{state.range(0) == 100 ? 4 : 16, 128, 1};
  compile::Compiled s = compile::compile({.model = c, .shape = shape});
  exec::Executable step(std::move(s.program), std::move(s.plan));
  std::vector<exec::Array> args = nn::init_params(c, 0);
  const size_t np = args.size();
  for (size_t i = 0; i < 2 * np; ++i) args.push_back(exec::Array::zeros(args[i % np].type()));
  args.push_back(exec::Array::zeros({DType::i32, {}}));
  for (int k = 0; k < 2; ++k) args.push_back(exec::Array::zeros({DType::i32, {1, shape.batch, shape.seq}}));
  step.run(args);  // warm up: primitives, scratch
  for (auto _ : state) benchmark::DoNotOptimize(step.run(args).data());
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(shape.batch * shape.seq),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params(M)"] = static_cast<double>(nn::param_count(c)) / 1e6;
  state.SetLabel(state.range(1) ? "bf16" : "f32");
}

BENCHMARK(TrainStep)->ArgsProduct({{1, 100}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2);

}  // namespace
}  // namespace remat
