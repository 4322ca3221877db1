// dot_product attention's probabilities, the medium config's shapes (f32 scores, bf16 probabilities, causal):
// 4 x 12 heads x 512 x 512 (/512), and for the masked op 1 x 12 x 4096 x 4096 (/4096: 0.8 GB of scores, rows
// read from memory). The masked softmax op (scale and mask its own) against the composition it replaced,
// select(mask, scores·scale, −inf) then softmax, fused as the step fuses it; forward, and backward (softmax_grad
// and, for the composition, the VJPs of select and mul). In ms and GB/s of the scores read; a planned executable
// built once, run again and again.
// Run: build/remat_bench --benchmark_filter=Softmax
#include "exec/executable.h"
#include "exec/kernels/kernels.h"
#include "ir/ir.h"
#include "plan/plan.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace remat {
namespace {

using namespace ir;

void Probabilities(benchmark::State& state, bool op, bool backward) {
  const int64_t t = state.range(0);
  const Shape shape{std::max<int64_t>(1, 2048 / t), 12, t, t};  // 4 x 512 or 1 x 4096
  Graph g;
  Builder b(g);
  Tensor x = b.param("scores", {DType::f32, shape}), mask = b.param("mask", {DType::pred, {t, t}});
  const double scale = 0.125;
  if (op) {
    b.result(backward ? softmax_grad(x, b.param("g", {DType::bf16, shape}), mask, scale)
                      : masked_softmax(x, mask, scale, DType::bf16));
  } else {
    Tensor visible = broadcast_in_dim(mask, shape, {2, 3});
    Tensor hidden = full(b, x.type(), -std::numeric_limits<double>::infinity());
    Tensor masked = select(visible, x * scale, hidden);
    if (backward) {
      Tensor d = softmax_grad(masked, b.param("g", {DType::bf16, shape}));
      b.result(select(visible, d, full(b, x.type(), 0.0)) * scale);
    } else {
      b.result(softmax(masked, DType::bf16));
    }
    fuse(g);
  }
  std::vector<exec::Array> args;
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-4, 4);
  for (ValueId p : g.params) {
    args.push_back(exec::Array::zeros(g.type(p)));
    exec::Array& a = args.back();
    if (a.type().dtype == DType::pred)
      for (int64_t i = 0; i < a.size(); ++i) a.set(i, i % t <= i / t);  // causal
    else
      for (int64_t i = 0; i < a.size(); ++i) a.set(i, dist(rng));
  }
  exec::Executable e(g, plan::build(g, {.workspace = exec::workspace_of(exec::cpu())}));
  e.run(args);  // faults the arenas in
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  state.SetBytesProcessed(state.iterations() * args[0].size() * 4);
}

void SoftmaxMaskedOp(benchmark::State& s) { Probabilities(s, true, false); }
void SoftmaxMaskedPrimitives(benchmark::State& s) { Probabilities(s, false, false); }
void SoftmaxMaskedOpGrad(benchmark::State& s) { Probabilities(s, true, true); }
void SoftmaxMaskedPrimitivesGrad(benchmark::State& s) { Probabilities(s, false, true); }

BENCHMARK(SoftmaxMaskedOp)->Arg(512)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(SoftmaxMaskedPrimitives)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(SoftmaxMaskedOpGrad)->Arg(512)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(SoftmaxMaskedPrimitivesGrad)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace remat
