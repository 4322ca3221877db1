// The fusion kernel over the medium config's SwiGLU bodies (4 x 512 tokens x 3072): the forward
// silu(a) · b (three ops, one exp) and its VJP as the step fuses it (eight ops: the cotangents of a and of b
// summed as the autodiff writes them), in GB/s of their operands and results, bf16 and f32, on all threads, the
// arrays and workspace allocated (and faulted in) once.
// Run: build/remat_bench --benchmark_filter=Fusion
#include "exec/exec.h"
#include "exec/kernels/kernels.h"

#include <benchmark/benchmark.h>

namespace remat {
namespace {

using namespace ir;

void SwiGlu(benchmark::State& state, DType dtype, bool backward) {
  const Shape shape{4, 512, 3072};
  const Type t{dtype, shape};
  Graph g;
  Builder b(g);
  Tensor x = b.param("a", t), y = b.param("b", t);
  if (backward) {  // the step's fused VJP: d = g · b · σ + g · a · σ(1 − σ)... in the autodiff's order
    Tensor dh = b.param("g", t), s = b.param("s", t), one = b.param("one", {dtype, {}});
    Tensor gb = dh * y;
    b.result(gb * s + gb * x * (s * (broadcast_in_dim(one, shape, {}) - s)));
  } else {
    b.result(x * logistic(x) * y);
  }
  fuse(g);
  ASSERT(g.nodes.size() == 1 && g.nodes[0].op == Op::fusion);
  const Node& n = g.nodes[0];
  std::vector<exec::Array> args, out{exec::Array::zeros(t)};
  std::vector<Type> types;
  for (ValueId p : n.inputs) {  // the fusion's operands in its order (not the graph's params')
    types.push_back(g.type(p));
    args.push_back(exec::Array::zeros(g.type(p)));
    for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, static_cast<double>(i % 17) / 8 - 1);
  }
  std::vector<std::byte> workspace(static_cast<size_t>(exec::workspace_fusion(n, types)), std::byte{1});
  const exec::Options options;
  const exec::KernelContext ctx{options, workspace};
  exec::kernel_fusion(n, args, out, ctx);
  for (auto _ : state) {
    exec::kernel_fusion(n, args, out, ctx);
    benchmark::DoNotOptimize(out[0].bytes());
  }
  int64_t bytes = out[0].size() * dtype_size(dtype);
  for (const exec::Array& a : args) bytes += a.size() * dtype_size(a.type().dtype);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void FusionSwiGluBf16(benchmark::State& s) { SwiGlu(s, DType::bf16, false); }
void FusionSwiGluF32(benchmark::State& s) { SwiGlu(s, DType::f32, false); }
void FusionSwiGluGradBf16(benchmark::State& s) { SwiGlu(s, DType::bf16, true); }
void FusionSwiGluGradF32(benchmark::State& s) { SwiGlu(s, DType::f32, true); }

BENCHMARK(FusionSwiGluBf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FusionSwiGluF32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FusionSwiGluGradBf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(FusionSwiGluGradF32)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace remat
