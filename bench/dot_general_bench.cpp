// dot_general throughput through the executor (oneDNN for f32), reported as GFLOP/s.
// Run: make bench   (or build/remat_bench --benchmark_filter=DotGeneral)
#include "bench/compiled.h"
#include "exec/exec.h"

#include <benchmark/benchmark.h>

#include <cmath>

namespace remat {
namespace {

using namespace ir;

// g's arguments, filled with sin(0.37 i).
std::vector<exec::Array> filled_arguments(const Graph& g) {
  std::vector<exec::Array> args;
  for (ValueId p : g.params) {
    args.emplace_back(g.type(p));
    for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, std::sin(0.37 * static_cast<double>(i)));
  }
  return args;
}

// Times the one matmul of g (its primitives made by a first run), counting `flops` a run.
void time_matmul(benchmark::State& state, const Graph& g, double flops) {
  std::vector<exec::Array> args = filled_arguments(g);
  exec::Executable e = compiled(g);
  e.run(args);  // warm up: oneDNN's primitives made
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void DotGeneralF32(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  Graph g;
  Builder b(g);
  b.result(matmul(b.param("x", {DType::f32, {m, k}}), b.param("w", {DType::f32, {k, n}})));
  time_matmul(state, g, 2.0 * static_cast<double>(m * k * n));
}

BENCHMARK(DotGeneralF32)->Args({4096, 768, 3072})->Args({1024, 1024, 1024})->Unit(benchmark::kMillisecond)->UseRealTime();

// A weight gradient, [tokens, m]^T x [tokens, n]: in bf16 as fixed output tiles (thread-count invariant; grown
// with the output, tile_shape), in f32 so where the contraction is longer than both output sides, else as one oneDNN
// matmul; m = 3072 f32: the lhs rows 12 KiB apart, read from a copy; 4096 tokens: the medium config's at 1 x 4096,
// n = 32000: the logits'. Args: tokens, m, n, dtype (0 f32,
// 1 bf16), cold (1: 64 MiB written between runs, untimed, so that the operands come from memory as in a step, not
// from the caches as in the step's floor).
void WeightGradient(benchmark::State& state) {
  const int64_t t = state.range(0), m = state.range(1), n = state.range(2);
  const DType dtype = state.range(3) ? DType::bf16 : DType::f32;
  Graph g;
  Builder b(g);
  b.result(dot_general(b.param("x", {dtype, {t, m}}), b.param("dy", {dtype, {t, n}}), {{0}, {0}, {}, {}}));
  std::vector<exec::Array> args = filled_arguments(g);
  exec::Executable e = compiled(g);
  e.run(args);  // warm up: oneDNN's primitives made
  std::vector<float> evict(state.range(4) ? (64 << 20) / sizeof(float) : 0);
  for (auto _ : state) {
    if (!evict.empty()) {
      state.PauseTiming();
      for (float& v : evict) v += 1;
      benchmark::DoNotOptimize(evict.data());
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(e.run(args));
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(t * m * n), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

BENCHMARK(WeightGradient)
    ->ArgsProduct({{2048}, {768, 3072}, {768, 2048}, {0, 1}, {0}})
    ->ArgsProduct({{2048}, {768}, {3072}, {1}, {0, 1}})
    ->ArgsProduct({{2048}, {3072}, {768}, {1}, {0, 1}})
    ->ArgsProduct({{4096}, {768, 3072}, {768}, {1}, {0}})
    ->ArgsProduct({{2048}, {768}, {32000}, {1}, {0}})
    ->Args({32768, 16, 24, 0, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// An input gradient, [tokens, k] x W with W stored [k, n] (0) or [n, k] (1: a projection's weight read
// transposed, W^T; f32 long contractions read it from a copy in order, transposes_rhs). Args: tokens, k, n, dtype
// (0 f32, 1 bf16), W stored transposed.
void InputGradient(benchmark::State& state) {
  const int64_t t = state.range(0), k = state.range(1), n = state.range(2);
  const DType dtype = state.range(3) ? DType::bf16 : DType::f32;
  Graph g;
  Builder b(g);
  const Tensor x = b.param("x", {dtype, {t, k}});
  if (state.range(4))
    b.result(dot_general(x, b.param("w", {dtype, {n, k}}), {{1}, {1}, {}, {}}));
  else
    b.result(dot_general(x, b.param("w", {dtype, {k, n}}), {{1}, {0}, {}, {}}));
  time_matmul(state, g, 2.0 * static_cast<double>(t * k * n));
}

BENCHMARK(InputGradient)
    ->ArgsProduct({{2048}, {3072}, {768}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace remat
