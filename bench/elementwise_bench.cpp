// The elementwise and row-reduction loops the fusion and reduce kernels run, on one thread over a cache-resident
// tile (what a fusion tile sees), in elements per second: exp and logistic through the kernels' loop, against
// the same loop over libm's expf (what they ran before exec/kernels/exp.h); a row max and sum over 512-element
// rows (the attention's softmax) through the kernel, against one accumulator per row; softmax and its VJP over
// the medium config's attention scores (4 x 12 heads x 512 x 512) on all threads, in GB/s of their operands and
// results, their buffers allocated (and faulted in) once; a layer's weight casts, the gradient norm's sum of
// squares, RMSNorm's VJP and the loss (target_log_prob and its VJP over bf16 logits) at the medium config's shapes,
// through planned executables.
// Run: build/remat_bench --benchmark_filter='Exp|Logistic|Row|Softmax|ConvertGroup|SumOfSquares|RmsNormGrad|TargetLogProb'
#include "bench/compiled.h"
#include "exec/exec.h"
#include "exec/kernels/kernels.h"

#include <benchmark/benchmark.h>

#include <cmath>
#include <random>

namespace remat {
namespace {

constexpr int64_t kTile = 16384;  // 64 KiB of f32 in, 64 KiB out: in L2

std::vector<float> random_floats(int64_t n, float lo, float hi) {
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

void run_op(benchmark::State& state, ir::Op op) {
  const std::vector<float> x = random_floats(kTile, -20, 0);
  std::vector<float> y(kTile);
  ir::Node n;
  n.op = op;
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(x.data())};
  for (auto _ : state) {
    exec::elementwise_range(n, DType::f32, DType::f32, in, reinterpret_cast<std::byte*>(y.data()), kTile);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kTile);
}

void ExpKernel(benchmark::State& state) { run_op(state, ir::Op::exp); }
void LogisticKernel(benchmark::State& state) { run_op(state, ir::Op::logistic); }

void ExpLibm(benchmark::State& state) {
  const std::vector<float> x = random_floats(kTile, -20, 0);
  std::vector<float> y(kTile);
  for (auto _ : state) {
    for (int64_t i = 0; i < kTile; ++i) y[static_cast<size_t>(i)] = std::exp(x[static_cast<size_t>(i)]);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kTile);
}

// Rows of 512 through reduce_max / reduce_sum (the executor, all threads) against one accumulator per row.
void RowReduce(benchmark::State& state, ir::Op op) {
  const int64_t rows = 4096, cols = 512;
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("x", {DType::f32, {rows, cols}});
  b.result(op == ir::Op::reduce_max ? reduce_max(x, {1}) : reduce_sum(x, {1}));
  const std::vector<float> v = random_floats(rows * cols, -5, 5);
  std::vector<exec::Array> args{exec::Array::from<float>({rows, cols}, v)};
  exec::Executable e = compiled(g);
  e.run(args);  // warm up
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  state.SetItemsProcessed(state.iterations() * rows * cols);
}

// The global norm's sum_of_squares of the medium config's embedding gradient (32000 x 768 f32, on all threads),
// in GB/s: over the rows, one partial sum per column (the fsdp dimension: train/grad_norm.cpp), or (arg 1) over
// the whole table.
void SumOfSquares(benchmark::State& state) {
  const int64_t rows = 32000, cols = 768;
  const bool narrow = state.range(1) == 1;  // a bf16 gradient read widened (sum_of_squares with dtype f32)
  ir::Graph g;
  ir::Builder b(g);
  const ir::IntList axes = state.range(0) == 0 ? ir::IntList{0} : ir::IntList{0, 1};
  ir::Attrs attrs = ir::Attrs().set("axes", axes);
  if (narrow) attrs.set("dtype", DType::f32);
  const ir::Tensor x = b.param("gradient", {narrow ? DType::bf16 : DType::f32, {rows, cols}});
  b.result(b.emit1(ir::Op::sum_of_squares, std::array{x}, attrs));
  std::vector<exec::Array> args{exec::Array(g.type(x.id))};
  const std::vector<float> values = random_floats(rows * cols, -1e-3f, 1e-3f);
  for (int64_t i = 0; i < rows * cols; ++i) args[0].set(i, values[static_cast<size_t>(i)]);
  exec::Executable e = compiled(g);
  e.run(args);
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  state.SetBytesProcessed(state.iterations() * rows * cols * (narrow ? 2 : 4));
}
BENCHMARK(SumOfSquares)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

// The weight casts of one medium layer (its seven kernels, f32 to bf16, as one convert_group: what the bf16 step
// runs before a layer's matmuls, forward and backward), on all threads, in GB/s of the f32 read and bf16 written.
void ConvertGroup(benchmark::State& state) {
  const int64_t d = 768, f = 3072;
  const std::vector<ir::Shape> shapes = {{d, d}, {d, d}, {d, d}, {d, d}, {d, f}, {d, f}, {f, d}};
  const char* names[] = {"query", "key", "value", "out", "wi_0", "wi_1", "wo"};
  ir::Graph g;
  ir::Builder b(g);
  std::vector<ir::Tensor> kernels;
  std::vector<exec::Array> args;
  int64_t elements = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    kernels.push_back(b.param(names[i], {DType::f32, shapes[i]}));
    args.push_back(exec::Array::from<float>(shapes[i], random_floats(ir::num_elements(shapes[i]), -1, 1)));
    elements += ir::num_elements(shapes[i]);
  }
  for (ir::Tensor t : convert_group(kernels, DType::bf16)) b.result(t);
  exec::Executable e = compiled(g);
  e.run(args);
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  state.SetBytesProcessed(state.iterations() * elements * 6);
}
BENCHMARK(ConvertGroup)->Unit(benchmark::kMillisecond)->UseRealTime();

// RMSNorm's VJP over the medium config's 4 x 512 rows of 768, x and the cotangent f32 (arg 0) or bf16 (1), on all
// threads: a pass over rows (dx), then one over each thread's columns (dw), in GB/s of x, g and dx.
void RmsNormGrad(benchmark::State& state) {
  const int64_t rows = 2048, d = 768;
  const DType t = state.range(0) == 0 ? DType::f32 : DType::bf16;
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("x", {t, {rows, d}}), w = b.param("w", {DType::f32, {d}}), dy = b.param("g", {t, {rows, d}});
  for (ir::Tensor r : rms_norm_grad(x, w, dy, 1e-6)) b.result(r);
  std::vector<exec::Array> args;
  for (ir::ValueId p : g.params) {
    args.emplace_back(g.type(p));
    const std::vector<float> v = random_floats(args.back().size(), -1, 1);
    for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, v[static_cast<size_t>(i)]);
  }
  exec::Executable e = compiled(g);
  e.run(args);
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  state.SetBytesProcessed(state.iterations() * 3 * rows * d * static_cast<int64_t>(dtype_size(t)));
}
BENCHMARK(RmsNormGrad)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The loss's forward over `logits` and `targets`: its log-probabilities and row statistics.
std::vector<exec::Array> target_log_prob_forward(std::vector<exec::Array> args) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("logits", args[0].type());  // the params in the arguments' order
  const auto [y, stats] = target_log_prob(x, b.param("targets", args[1].type()), DType::f32);
  b.result(y);
  b.result(stats);
  return compiled(g).run(args);
}

// The loss of the medium config's bf16 step: each of 4 x 512 rows of 32000 bf16 logits to its target's f32
// log-probability and the row's statistics (arg 0), or that op's VJP (arg 1: dx from the forward's statistics), on
// all threads, in GB/s of the logits read (and, for the VJP, written).
void TargetLogProb(benchmark::State& state) {
  const int64_t rows = 2048, vocab = 32000;
  const bool grad = state.range(0) == 1;
  std::vector<exec::Array> args{exec::Array({DType::bf16, {rows, vocab}}), exec::Array({DType::i32, {rows}})};
  const std::vector<float> v = random_floats(rows * vocab, -8, 8);
  for (int64_t i = 0; i < args[0].size(); ++i) args[0].set(i, v[static_cast<size_t>(i)]);
  for (int64_t r = 0; r < rows; ++r) args[1].set(r, static_cast<double>(r * 7919 % vocab));
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("logits", args[0].type()), t = b.param("targets", args[1].type());
  if (grad) {
    args.push_back(target_log_prob_forward(args)[1]);
    args.emplace_back(ir::Type{DType::f32, {rows}});
    for (int64_t r = 0; r < rows; ++r) args[3].set(r, -1.0 / static_cast<double>(rows));
    ir::Tensor stats = b.param("stats", args[2].type());
    b.result(target_log_prob_grad(x, t, stats, b.param("g", args[3].type()), DType::f32));
  } else {
    const auto [y, stats] = target_log_prob(x, t, DType::f32);
    b.result(y);
    b.result(stats);
  }
  exec::Executable e = compiled(g);
  e.run(args);
  for (auto _ : state) benchmark::DoNotOptimize(e.run(args));
  state.SetBytesProcessed(state.iterations() * (grad ? 2 : 1) * rows * vocab * 2);
}
BENCHMARK(TargetLogProb)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void RowMaxKernel(benchmark::State& state) { RowReduce(state, ir::Op::reduce_max); }
void RowSumKernel(benchmark::State& state) { RowReduce(state, ir::Op::reduce_sum); }

void RowMaxOneAccumulator(benchmark::State& state) {
  const int64_t rows = 4096, cols = 512;
  const std::vector<float> v = random_floats(rows * cols, -5, 5);
  std::vector<float> out(static_cast<size_t>(rows));
  for (auto _ : state) {
    for (int64_t r = 0; r < rows; ++r) {
      float m = -INFINITY;
      for (int64_t c = 0; c < cols; ++c) {
        const float e = v[static_cast<size_t>(r * cols + c)];
        m = (e > m || e != e) ? e : m;
      }
      out[static_cast<size_t>(r)] = m;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * cols);
}

// softmax (x in `in`, p in `out`) or softmax_grad (x and g in `in`, dx in `in`) through its kernel.
void Softmax(benchmark::State& state, DType in, DType out, bool grad) {
  const ir::Type x{in, {4 * 12 * 512, 512}}, y{grad ? in : out, x.shape};
  ir::Node n;
  n.op = grad ? ir::Op::softmax_grad : ir::Op::softmax;
  std::vector<exec::Array> args{exec::Array::zeros(x)};
  if (grad) args.push_back(exec::Array::zeros({out, x.shape}));
  for (exec::Array& a : args)
    for (int64_t i = 0; i < a.size(); i += 7) a.set(i, static_cast<double>(i % 13) - 6);
  std::vector<exec::Array> result{exec::Array::zeros(y)};
  std::vector<std::byte> workspace(static_cast<size_t>(exec::workspace_softmax(n, {&x, 1})));
  const exec::Options options;
  const exec::KernelContext ctx{options, workspace};
  auto kernel = grad ? exec::kernel_softmax_grad : exec::kernel_softmax;
  for (auto _ : state) {
    kernel(n, args, result, ctx);
    benchmark::DoNotOptimize(result[0].bytes());
  }
  int64_t bytes = ir::Type(y).num_elements() * dtype_size(y.dtype);
  for (const exec::Array& a : args) bytes += a.size() * dtype_size(a.type().dtype);
  state.SetBytesProcessed(state.iterations() * bytes);
}

void SoftmaxF32(benchmark::State& s) { Softmax(s, DType::f32, DType::f32, false); }
void SoftmaxBf16(benchmark::State& s) { Softmax(s, DType::bf16, DType::bf16, false); }
void SoftmaxGradF32(benchmark::State& s) { Softmax(s, DType::f32, DType::f32, true); }
void SoftmaxGradBf16(benchmark::State& s) { Softmax(s, DType::bf16, DType::bf16, true); }

BENCHMARK(ExpKernel);
BENCHMARK(ExpLibm);
BENCHMARK(LogisticKernel);
BENCHMARK(RowMaxKernel)->UseRealTime();
BENCHMARK(RowSumKernel)->UseRealTime();
BENCHMARK(RowMaxOneAccumulator);
BENCHMARK(SoftmaxF32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(SoftmaxBf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(SoftmaxGradF32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(SoftmaxGradBf16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace remat
