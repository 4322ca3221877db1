// Every kernel compiled per instruction set (REMAT_WIDEST_CLONES in exec/kernels/kernels.h) run under each one this
// CPU has (IsaOverride) gives the bits it gives under baseline x86-64: each kernel through its op, on inputs that take
// the parallel and the vector paths (>= 2^14 elements, rows longer than the vectors, odd tails), the elementwise and
// convert inputs (and rope's in f32) with NaNs (payloads, a signalling one), ±inf, ±0 and subnormals; and one
// training step of tiny (dot product attention in f32; flash attention in bf16), so a checkpoint resumed on another
// CPU does not diverge.
#include "cli/config.h"
#include "compile/compile.h"
#include "exec/executable.h"
#include "exec/kernels/kernels.h"
#include "support/step_args.h"

#include <gtest/gtest.h>

#include <fmt/ranges.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <string_view>

namespace remat {
namespace {

using namespace ir;
using exec::Isa;

bool same_bits(const exec::Array& a, const exec::Array& b) {
  return a.type() == b.type() && std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())) == 0;
}

// Runs `run` under baseline x86-64, then under every other ISA available, expecting the same results bit for bit;
// prints a line per kernel, e.g. "softmax_rows (f32): default avx2 x86-64-v4" (the ISAs that ran).
void expect_baseline_bits(const std::vector<std::string>& kernels, std::string_view inputs,
                          const std::function<std::vector<exec::Array>()>& run) {
  std::vector<exec::Array> want;
  {
    exec::IsaOverride baseline(Isa::baseline);
    want = run();
  }
  std::string ran = exec::isa_name(Isa::baseline);
  for (Isa isa : exec::available_isas()) {
    if (isa == Isa::baseline) continue;
    exec::IsaOverride guard(isa);
    const std::vector<exec::Array> got = run();
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k)
      EXPECT_TRUE(same_bits(got[k], want[k])) << fmt::format("{}", fmt::join(kernels, ", ")) << " (" << inputs << ") under " << exec::isa_name(isa) << ": result " << k
                                              << " differs from baseline x86-64";
    ran += std::string(" ") + exec::isa_name(isa);
  }
  for (const std::string& kernel : kernels) std::cout << kernel << " (" << inputs << "): " << ran << "\n";
}

void expect_graph_baseline_bits(const std::vector<std::string>& kernels, std::string_view inputs, const Graph& g,
                                const std::vector<exec::Array>& args) {
  expect_baseline_bits(kernels, inputs, [&] { return exec::run(g, args); });
}

std::vector<exec::Array> params_of(const Graph& g) {
  std::vector<exec::Array> args;
  for (ValueId p : g.params) args.emplace_back(g.type(p));
  return args;
}

void fill(exec::Array& a, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < a.size(); ++i) a.set(i, dist(rng));
}

// f32 values over a wide range, every 1024th from a list of special ones (NaNs with payloads, a signalling NaN,
// ±inf, ±0, a subnormal, f16's overflow boundary, a value that rounds to f16's smallest normal).
void fill_special(exec::Array& a, uint32_t seed) {
  const uint32_t special[] = {0x7FC00000u, 0xFFC12345u, 0x7F800001u, 0x7F800000u, 0xFF800000u, 0x00000000u,
                              0x80000000u, 0x00000123u, 0x477FF000u, 0x477FEFFFu, 0xC77FF000u, 0x387FC000u};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-30, 30);
  for (int64_t i = 0; i < a.size(); ++i) {
    const float v = (i & 1 ? 1.0f : -1.0f) * std::exp2(exponent(rng)) * 1.37f;
    a.data<float>()[i] = i % 1024 < static_cast<int64_t>(std::size(special)) ? std::bit_cast<float>(special[(i / 1024 + i) % std::size(special)]) : v;
  }
}

TEST(Isa, EveryClonedKernelGivesTheBaselineBits) {
  constexpr int64_t n = (1 << 16) + 7;
  {
    Graph g;
    Builder b(g);
    Tensor x = b.param("x", {DType::f32, {n}}), y = b.param("y", {DType::f32, {n}});
    Tensor xb = convert(x, DType::bf16), yb = convert(y, DType::bf16);
    for (Tensor r : {exp(x), logistic(x), sqrt(y), x / y, x * y + x, log(y), max(x, y), convert(x, DType::bf16),
                     convert(convert(x, DType::f16), DType::f32), exp(xb), xb / yb, xb * yb - xb})
      b.result(r);
    std::vector<exec::Array> args = params_of(g);
    fill_special(args[0], 1);
    fill_special(args[1], 2);
    expect_graph_baseline_bits({"elementwise_range"}, "f32, bf16", g, args);
  }
  {
    Graph g;
    Builder b(g);
    const std::vector<Tensor> xs{b.param("x", {DType::f32, {n}}), b.param("y", {DType::f32, {37, 29}})};
    for (Tensor r : convert_group(xs, DType::bf16)) b.result(r);
    for (Tensor r : convert_group(xs, DType::f16)) b.result(r);
    std::vector<exec::Array> args = params_of(g);
    fill_special(args[0], 3);
    fill_special(args[1], 4);
    expect_graph_baseline_bits({"convert_widest"}, "f32 to bf16, f16", g, args);
  }
  for (DType d : {DType::f32, DType::bf16}) {
    Graph g;
    Builder b(g);
    const Type t{d, {37, 1029}}, s{DType::f32, {}};
    Tensor p = b.param("p", t), m = b.param("m", t), v = b.param("v", t), grad = b.param("g", t);
    Tensor scale = b.param("scale", s), lr = b.param("lr", s), bias1 = b.param("bias1", s), bias2 = b.param("bias2", s);
    Tensor finite = b.param("finite", {DType::pred, {}}), loss_scale = b.param("loss_scale", s);
    for (Tensor r : adamw(p, m, v, grad, scale, lr, bias1, bias2, finite, {0.9, 0.95, 1e-8, 0.1}, loss_scale)) b.result(r);
    std::vector<exec::Array> args = params_of(g);
    std::mt19937 rng(5);
    fill(args[0], rng, -1, 1), fill(args[1], rng, -0.1, 0.1), fill(args[2], rng, 0, 0.01), fill(args[3], rng, -300, 300);
    args[4].set(0, 0.7), args[5].set(0, 3e-4), args[6].set(0, 0.19), args[7].set(0, 0.0975);
    args[8].data<uint8_t>()[0] = 1;
    args[9].set(0, 1024);
    expect_graph_baseline_bits({"adamw_range"}, dtype_name(d), g, args);
  }
  for (DType d : {DType::f32, DType::bf16}) {
    Graph g;
    Builder b(g);
    Tensor x = b.param("x", {d, {67, 333}}), gr = b.param("g", {d, {67, 333}});
    Tensor y = log_softmax(x);
    b.result(softmax(x, d));
    b.result(softmax_grad(x, gr));
    b.result(y);
    b.result(log_softmax_grad(y, gr));
    Tensor mask = compare(iota(b, DType::i32, {67, 333}, 1), iota(b, DType::i32, {67, 333}, 0), "le");  // causal
    Tensor wide = reshape(x, {1, 67, 333});  // [1, S, T] under the [S, T] mask
    b.result(masked_softmax(wide, mask, 0.3, DType::bf16));
    b.result(softmax_grad(wide, reshape(gr, {1, 67, 333}), mask, 0.3));
    std::vector<exec::Array> args = params_of(g);
    std::mt19937 rng(6);
    fill(args[0], rng, -20, 20), fill(args[1], rng, -3, 3);
    for (int64_t j = 100; j < 333; ++j) args[0].set(333 + j, -std::numeric_limits<double>::infinity());  // masked
    args[0].set(2 * 333 + 5, std::numeric_limits<double>::quiet_NaN());
    expect_graph_baseline_bits({"softmax_rows", "softmax_grad_rows", "log_softmax_rows", "log_softmax_grad_rows"},
                               dtype_name(d), g, args);
  }
  for (DType d : {DType::f32, DType::bf16}) {  // their compositions' fusions: compiled loops against the interpreter
    Graph g;
    Builder b(g);
    const Type type{d, {n}};
    Tensor gate = b.param("gate", type), up = b.param("up", type), gr = b.param("g", type);
    b.result(swiglu(gate, up));
    for (Tensor r : swiglu_grad(gate, up, gr)) b.result(r);
    std::vector<exec::Array> args = params_of(g);
    std::mt19937 rng(12);
    for (uint32_t k = 0; k < 3; ++k) {
      if (d == DType::f32) fill_special(args[k], 20 + k);
      else fill(args[k], rng, k == 0 ? -100 : -3, k == 0 ? 100 : 3);
    }
    expect_graph_baseline_bits({"swiglu", "swiglu_grad"}, dtype_name(d), g, args);
  }
  for (DType d : {DType::f32, DType::bf16}) {
    Graph g;
    Builder b(g);
    Tensor x = b.param("x", {d, {67, 333}}), t = b.param("t", {DType::i32, {67}}), gr = b.param("g", {DType::f32, {67}});
    const auto [y, stats] = target_log_prob(x, t, DType::f32);
    b.result(y);
    b.result(stats);
    b.result(target_log_prob_grad(x, t, stats, gr, DType::f32));
    std::vector<exec::Array> args = params_of(g);
    std::mt19937 rng(11);
    fill(args[0], rng, -20, 20), fill(args[2], rng, -3, 3);
    for (int64_t r = 0; r < 67; ++r) args[1].data<int32_t>()[r] = static_cast<int32_t>(r * 37 % 340) - 3;  // some outside
    expect_graph_baseline_bits({"target_log_prob_rows", "target_log_prob_grad_rows"}, dtype_name(d), g, args);
  }
  for (DType d : {DType::f32, DType::bf16}) {
    Graph g;
    Builder b(g);
    // 2 x 31 x 5 heads of 74 (pairs of 37: vectors and an odd tail), 22940 elements
    const Type table{d, {31, 37}};
    Tensor x = b.param("x", {d, {2, 31, 5, 74}}), cos = b.param("cos", table), sin = b.param("sin", table);
    b.result(rope(x, cos, sin));
    std::vector<exec::Array> args = params_of(g);
    std::mt19937 rng(9);
    if (d == DType::f32) fill_special(args[0], 9);  // f32 bit patterns
    else fill(args[0], rng, -300, 300);
    fill(args[1], rng, -1, 1), fill(args[2], rng, -1, 1);
    expect_graph_baseline_bits({"rope_rows"}, dtype_name(d), g, args);
  }
  for (DType d : {DType::f32, DType::bf16}) {
    Graph g;
    Builder b(g);
    // 61 rows of 333 (vectors and an odd tail), 20313 elements; a bf16 scale read as f32
    Tensor x = b.param("x", {d, {61, 333}}), w = b.param("w", {DType::bf16, {333}}), gr = b.param("g", {d, {61, 333}});
    b.result(rms_norm(x, w, 1e-5));
    for (Tensor r : rms_norm_grad(x, w, gr, 1e-5)) b.result(r);
    std::vector<exec::Array> args = params_of(g);
    std::mt19937 rng(10);
    if (d == DType::f32) {  // f32 bit patterns but NaNs: a row's NaN payloads meet in its sum, in lane order
      fill_special(args[0], 10);
      for (int64_t i = 0; i < args[0].size(); ++i)
        if (std::isnan(args[0].get(i))) args[0].set(i, std::numeric_limits<double>::infinity());
    } else {
      fill(args[0], rng, -300, 300);
    }
    fill(args[1], rng, 0.5, 2), fill(args[2], rng, -3, 3);
    expect_graph_baseline_bits({"rms_norm_rows", "rms_norm_grad_rows", "rms_norm_dw_columns"}, dtype_name(d), g, args);
  }
  for (DType d : {DType::f32, DType::bf16, DType::f64}) {  // f64: its sums show any change of order
    Graph g;
    Builder b(g);
    Tensor x = b.param("x", {d, {37, 29, 23}});
    for (const IntList& axes : {IntList{0}, IntList{1}, IntList{2}, IntList{0, 2}}) {
      b.result(reduce_sum(x, axes));
      b.result(reduce_max(x, axes));
      b.result(sum_of_squares(x, axes));
    }
    std::vector<exec::Array> args = params_of(g);
    std::mt19937 rng(7);
    fill(args[0], rng, -3000, 3000);
    expect_graph_baseline_bits({"reduce_range"}, dtype_name(d), g, args);
  }
  for (DType d : {DType::f32, DType::bf16}) {
    Graph g;
    Builder b(g);
    // B=2, T=S=133 (a block of 64 keys and an odd tail), H=4 over KV=2, Dh=40 (not a multiple of the vectors)
    Tensor q = b.param("q", {d, {2, 133, 4, 40}}), k = b.param("k", {d, {2, 133, 2, 40}});
    Tensor v = b.param("v", {d, {2, 133, 2, 40}}), dout = b.param("dout", {d, {2, 133, 4, 40}});
    const auto [context, lse] = attention(q, k, v, true, 0.158);
    b.result(context);
    b.result(lse);
    for (Tensor r : attention_grad(q, k, v, context, lse, dout, true, 0.158)) b.result(r);
    std::vector<exec::Array> args = params_of(g);
    std::mt19937 rng(8);
    for (exec::Array& a : args) fill(a, rng, -2, 2);
    expect_graph_baseline_bits({"attention_heads", "attention_grad_heads"}, dtype_name(d), g, args);
  }
}

// One training step of tiny from the same initial state and batch: loss, gradient norm, parameters and moments.
std::vector<exec::Array> train_one_step(const compile::Compiled& s, const cli::Config& c) {
  std::vector<exec::Array> args = testing_support::step_args(s, c.run.model);
  exec::Executable step(s.program, s.plan, {});
  std::vector<exec::Array> results;
  for (const exec::Array& a : step.run(args)) results.push_back(a.clone());
  return results;
}

TEST(Isa, ATrainingStepGivesTheBaselineBits) {
  for (const std::vector<std::string>& overrides :
       {std::vector<std::string>{}, std::vector<std::string>{"attention=flash", "dtype=bf16"}}) {
    std::vector<std::string> small = overrides;
    small.insert(small.end(), {"per_device_batch_size=2", "max_target_length=64"});  // a short step
    const cli::Config c = cli::load_config("", small);
    const compile::Compiled s = compile::compile(
        {.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer, .fuse = c.run.fusion});
    expect_baseline_bits({"training step"}, fmt::format("{}", fmt::join(small, " ")), [&] { return train_one_step(s, c); });
  }
}

}  // namespace
}  // namespace remat
