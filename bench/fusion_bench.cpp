// The SwiGLU ops of the medium config (4 x 512 tokens x 3072), which run as the fusions of their compositions:
// swiglu, silu(a) · b (three ops, one exp), and swiglu_grad (eleven ops: the logistic and silu recomputed, then
// the cotangents of a and of b), bf16 in f32 between converts, in GB/s of their operands and results, bf16 and f32,
// on all threads, the arrays and workspace allocated (and faulted in) once. The Cold ones take 8 sets of arrays in
// turn (300-500 MB), so that each call reads its operands from DRAM, as the step does: in-step the SwiGLU VJP ran
// 1.3-1.7x its warm time here, but cold it ran as warm (3.03 against 3.01 ms; 3.70 against 3.44 in a slower
// minute): the kernels are bound by their arithmetic, not by the caches.
// Run: build/remat_bench --benchmark_filter=Fusion
#include "exec/exec.h"
#include "exec/kernels/kernels.h"

#include <benchmark/benchmark.h>

namespace remat {
namespace {

using namespace ir;

void SwiGlu(benchmark::State& state, DType dtype, bool backward, int sets = 1) {
  const Type t{dtype, {4, 512, 3072}};
  Graph g;
  Builder b(g);
  Tensor x = b.param("a", t), y = b.param("b", t);
  if (backward) {
    for (Tensor r : swiglu_grad(x, y, b.param("g", t))) b.result(r);
  } else {
    b.result(swiglu(x, y));
  }
  const Node& n = g.nodes.back();
  std::vector<std::vector<exec::Array>> args(static_cast<size_t>(sets)), out(args.size());
  std::vector<Type> types;
  for (ValueId p : n.inputs) types.push_back(g.type(p));
  for (size_t s = 0; s < args.size(); ++s) {
    for (ValueId p : n.inputs) {
      exec::Array& a = args[s].emplace_back(exec::Array::zeros(g.type(p)));
      for (int64_t i = 0; i < a.size(); ++i) a.set(i, static_cast<double>(i % 17) / 8 - 1);
    }
    for (ValueId r : n.outputs) out[s].push_back(exec::Array::zeros(g.type(r)));
  }
  size_t set = 0;
  std::vector<std::byte> workspace(static_cast<size_t>(exec::workspace_swiglu(n, types)), std::byte{1});
  const exec::Options options;
  const exec::KernelContext ctx{options, workspace};
  auto run = [&] {
    set = (set + 1) % args.size();
    if (backward) exec::kernel_swiglu_grad(n, args[set], out[set], ctx);
    else exec::kernel_swiglu(n, args[set], out[set], ctx);
  };
  run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(out[set][0].bytes());
  }
  int64_t bytes = 0;
  for (const std::vector<exec::Array>* v : {&args[0], &out[0]})
    for (const exec::Array& a : *v) bytes += a.size() * dtype_size(a.type().dtype);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void FusionSwiGluBf16(benchmark::State& s) { SwiGlu(s, DType::bf16, false); }
void FusionSwiGluF32(benchmark::State& s) { SwiGlu(s, DType::f32, false); }
void FusionSwiGluGradBf16(benchmark::State& s) { SwiGlu(s, DType::bf16, true); }
void FusionSwiGluGradF32(benchmark::State& s) { SwiGlu(s, DType::f32, true); }
void FusionSwiGluColdBf16(benchmark::State& s) { SwiGlu(s, DType::bf16, false, 8); }
void FusionSwiGluGradColdBf16(benchmark::State& s) { SwiGlu(s, DType::bf16, true, 8); }

BENCHMARK(FusionSwiGluBf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FusionSwiGluF32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FusionSwiGluGradBf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FusionSwiGluGradF32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FusionSwiGluColdBf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FusionSwiGluGradColdBf16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace remat
