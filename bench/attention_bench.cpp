// Flash attention's kernels through the executor, as GFLOP/s of their products: forward 4·B·H·T·S·D (q kᵀ and
// p v); "backward" runs the forward and attention_grad, 4 + 10·B·H·T·S·D (q kᵀ again, dout vᵀ, dv, dk, dq);
// halved, causal. The medium config's shape (12 heads of 64, 4 x 512 tokens) and long sequences (4096, 8192).
// Run: build/remat_bench --benchmark_filter=Attention. REMAT_BENCH_ISA=avx2 (or default, x86-64-v4) runs the
// kernels for that ISA (exec::IsaOverride): e.g. the bf16 kernels' FMA path on a CPU with AVX512_BF16.
#include "bench/compiled.h"
#include "exec/exec.h"
#include "exec/kernels/kernels.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>

namespace remat {
namespace {

using namespace ir;

// Runs the kernels for the ISA REMAT_BENCH_ISA names while it lives (none: the widest); false if it names none.
bool override_isa(std::optional<exec::IsaOverride>& isa) {
  const char* name = std::getenv("REMAT_BENCH_ISA");
  if (!name) return true;
  for (exec::Isa i : exec::available_isas())
    if (std::string(name) == exec::isa_name(i)) return isa.emplace(i), true;
  return false;
}

// Uniform in [-1, 1), one array per param of g.
std::vector<exec::Array> random_args(const Graph& g) {
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<exec::Array> args;
  for (ValueId p : g.params) {
    args.push_back(exec::Array::zeros(g.type(p)));
    for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, dist(rng));
  }
  return args;
}

void Attention(benchmark::State& state, DType dtype, bool backward) {
  std::optional<exec::IsaOverride> isa;
  if (!override_isa(isa)) return state.SkipWithError("REMAT_BENCH_ISA names no ISA this build and CPU run");
  const int64_t B = state.range(0), T = state.range(1), H = state.range(2), D = state.range(3);
  Graph g;
  Builder b(g);
  const Type t{dtype, {B, T, H, D}};
  Tensor q = b.param("q", t), k = b.param("k", t), v = b.param("v", t);
  const double scale = 1.0 / 8.0;
  auto [context, lse] = attention(q, k, v, true, scale);
  if (backward) {
    for (Tensor r : attention_grad(q, k, v, context, lse, b.param("dcontext", t), true, scale)) b.result(r);
  } else {
    b.result(context);
  }
  const std::vector<exec::Array> args = random_args(g);
  exec::Executable e = compiled(g);
  e.run(args);  // warm up: oneDNN's primitives made
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  const double flops = (backward ? 14.0 : 4.0) * static_cast<double>(B * H * T * T * D) / 2;  // causal: half
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// What flash's rate is measured against: oneDNN's batched products of the same heads, q·kᵀ then p·v, each head's
// operands as [B,H,T,D], over at most 1024 positions (exec::matmul_floor's attention rate), at 4·B·H·T·T·D (no
// causal half: the products compute every score). Run interleaved with the flash benches, so that both rates come
// from the same minutes of a noisy machine:
//   build/remat_bench --benchmark_filter='Attention.*Bf16/4/512' --benchmark_repetitions=5
//   --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
void Products(benchmark::State& state, DType dtype) {
  const int64_t B = state.range(0), H = state.range(2), D = state.range(3);
  const int64_t T = std::min<int64_t>(state.range(1), 1024);
  Graph g;
  Builder b(g);
  const Type heads{dtype, {B, H, T, D}};
  Tensor scores = dot_general(b.param("q", heads), b.param("k", heads), {{3}, {3}, {0, 1}, {0, 1}});
  b.result(dot_general(scores, b.param("v", heads), {{3}, {2}, {0, 1}, {0, 1}}));
  const std::vector<exec::Array> args = random_args(g);
  exec::Executable e = compiled(g);
  e.run(args);
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * static_cast<double>(B * H * T * T * D),
                                                 benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void AttentionForwardF32(benchmark::State& s) { Attention(s, DType::f32, false); }
void AttentionBackwardF32(benchmark::State& s) { Attention(s, DType::f32, true); }
void AttentionForwardBf16(benchmark::State& s) { Attention(s, DType::bf16, false); }
void AttentionBackwardBf16(benchmark::State& s) { Attention(s, DType::bf16, true); }

#define ATTENTION_SHAPES \
  Args({4, 512, 12, 64})->Args({1, 4096, 12, 64})->Args({1, 8192, 12, 64})->Unit(benchmark::kMillisecond)->UseRealTime()
BENCHMARK(AttentionForwardF32)->ATTENTION_SHAPES;
BENCHMARK(AttentionBackwardF32)->ATTENTION_SHAPES;
BENCHMARK(AttentionForwardBf16)->ATTENTION_SHAPES;
BENCHMARK(AttentionBackwardBf16)->ATTENTION_SHAPES;
void AttentionProductsOneDnnF32(benchmark::State& s) { Products(s, DType::f32); }
void AttentionProductsOneDnnBf16(benchmark::State& s) { Products(s, DType::bf16); }
BENCHMARK(AttentionProductsOneDnnF32)->ATTENTION_SHAPES;
BENCHMARK(AttentionProductsOneDnnBf16)->ATTENTION_SHAPES;

}  // namespace
}  // namespace remat
