// The fusion kernel's compiled loops (exec/kernels/fusion_jit.cpp) give the interpreter's bits: each fused
// graph runs under baseline x86-64 (the interpreter: each op's elementwise loop, the unfused kernels' bits) and
// under every other ISA this CPU has (AVX2: 8 lanes; x86-64-v4: 16), where its fusions must have compiled. Every
// op the compiler takes, in f32 and bf16, on NaNs (payloads, a signalling one), ±inf, ±0, subnormals, bf16
// rounding ties and values that overflow when rounded; i32 and pred values, iotas, fulls and broadcasts of one
// element and of more; lengths that leave a tail in the last tile and a loop shorter than one group.
#include "exec/exec.h"
#include "exec/kernels/kernels.h"
#include "support/training_steps.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

namespace remat {
namespace {

using namespace ir;
using exec::Isa;
using testing_support::same_bits;

// f32 bit patterns every fusion input draws from 1 in 8 times.
constexpr uint32_t kSpecial[] = {
    0x7FC00000u, 0xFFC12345u, 0x7F800001u, 0x7FBF0000u,  // NaNs: quiet, with payloads, signalling
    0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u,  // ±inf, ±0
    0x00000123u, 0x807FFFFFu, 0x00400000u,                // subnormals
    0x3F808000u, 0x3F818000u, 0xBF808001u,                // bf16 ties to even (down, up) and just above a tie
    0x7F7FFFFFu, 0x7F7F8000u,                              // the largest f32 (rounds to bf16 inf), a tie there
    0x42B00000u, 0xC2D00000u, 0xC2AE0000u};               // exp's clamps: 88, -104, -87

// A NaN goes only where i and the seed have the same parity: the params (consecutive seeds) never hold NaNs in one
// element, since which of two NaNs a commutative op returns is the compiler's choice (it differs between the
// release and sanitizer builds of the interpreter, and between its clones).
void fill(exec::Array& a, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-12, 12);
  std::uniform_int_distribution<size_t> pick(0, std::size(kSpecial) - 1);
  for (int64_t i = 0; i < a.size(); ++i) {
    const float v = (rng() & 1 ? 1.0f : -1.0f) * std::exp2(exponent(rng));
    uint32_t bits = rng() % 8 == 0 ? kSpecial[pick(rng)] : std::bit_cast<uint32_t>(v);
    if (std::isnan(std::bit_cast<float>(bits)) && static_cast<uint32_t>(i % 2) != seed % 2) bits = 0x3F800000u;
    switch (a.type().dtype) {
      case DType::f32: a.data<float>()[i] = std::bit_cast<float>(bits); break;
      case DType::bf16: a.data<bf16_t>()[i] = bf16_t{static_cast<uint16_t>(bits >> 16)}; break;
      case DType::i32: a.data<int32_t>()[i] = static_cast<int32_t>(rng() % 2001) - 1000; break;
      case DType::pred: a.data<uint8_t>()[i] = rng() & 1; break;
      default: FAIL() << "no fill for " << dtype_name(a.type().dtype);
    }
  }
}

// Fuses g, then runs it under baseline x86-64 and under each other ISA: the same bits, every fusion compiled.
void expect_compiled_bits(Graph g, uint32_t seed) {
  fuse(g);
  verify(g);
  int fusions = 0;
  for (const Node& n : g.nodes) fusions += n.op == Op::fusion;
  ASSERT_GT(fusions, 0) << print(g);
  std::vector<exec::Array> args;
  for (ValueId p : g.params) {
    args.emplace_back(g.type(p));
    fill(args.back(), seed++);
  }
  std::vector<exec::Array> want;
  {
    exec::IsaOverride baseline(Isa::baseline);
    want = exec::run(g, args);
  }
  for (Isa isa : exec::available_isas()) {
    if (isa == Isa::baseline) continue;
    exec::IsaOverride guard(isa);
    for (const Node& n : g.nodes)
      if (n.op == Op::fusion) {
        EXPECT_NE(exec::fused_loop(n.body), nullptr) << exec::isa_name(isa) << ":\n" << print(*n.body);
      }
    const std::vector<exec::Array> got = exec::run(g, args);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k)
      EXPECT_TRUE(same_bits(got[k], want[k])) << "result " << k << " under " << exec::isa_name(isa) << " of\n" << print(g);
  }
}

TEST(FusionJit, EveryFloatOpGivesTheInterpretersBits) {
  for (DType d : {DType::f32, DType::bf16})
    for (int64_t n : {int64_t{16384 + 37}, int64_t{5}}) {  // a tail in the last tile; less than one group
      Graph g;
      Builder b(g);
      const Type t{d, {n}};
      // Each op reads neg(neg(·)) of the params (the same values; a bf16 NaN made quiet), so that it is fused.
      Tensor x = neg(neg(b.param("x", t))), y = neg(neg(b.param("y", t))), s = b.param("s", {d, {}});
      for (Tensor r : {neg(x), exp(x), logistic(x), sqrt(y), rsqrt(y), x + y, x - y, x * y, x / y, max(x, y),
                       min(x, y), max(y, x), min(y, x), x * broadcast_in_dim(s, {n}, {}),
                       convert(x, d == DType::f32 ? DType::bf16 : DType::f32)})
        b.result(r);
      for (const char* dir : {"eq", "ne", "lt", "le", "gt", "ge"}) b.result(select(compare(x, y, dir), x, y));
      b.result(compare(x, y, "lt"));  // a pred result
      expect_compiled_bits(g, 11);
    }
}

// y = select(mask[j,k] & (iota_j cmp i[..]), x · r[k], -inf) and friends, over [3,999,7]: gathered broadcasts
// and iotas cut by tiles, scalar broadcasts of every held dtype, i32 compares, converts from pred and i32.
TEST(FusionJit, BroadcastsIotasFullsIntsAndPredsGiveTheInterpretersBits) {
  const Shape shape{3, 999, 7};
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::bf16, shape}), r = b.param("r", {DType::f32, {7}});
  Tensor i = b.param("i", {DType::i32, shape}), mask = b.param("mask", {DType::pred, {999, 7}});
  Tensor on = b.param("on", {DType::pred, {}}), k = b.param("k", {DType::i32, {}});
  Tensor row = iota(b, DType::i32, shape, 1);
  Tensor xr = convert(x, DType::f32) * broadcast_in_dim(r, shape, {2});
  Tensor masked = select(broadcast_in_dim(mask, shape, {1, 2}), xr, full(b, {DType::f32, shape}, -INFINITY));
  b.result(masked);
  for (const char* dir : {"eq", "ne", "lt", "le", "gt", "ge"})
    b.result(select(compare(row, i, dir), convert(row, DType::f32), convert(broadcast_in_dim(on, shape, {}), DType::f32)));
  b.result(select(broadcast_in_dim(on, shape, {}), i, broadcast_in_dim(k, shape, {})));
  b.result(convert(masked, DType::bf16));
  expect_compiled_bits(g, 21);
}

// The fusion kernel over arrays followed by guard elements, for every length of a last tile from 1 to 2 x 16 + 1
// lanes past a whole tile: the results as the interpreter's, and nothing read or written past the arrays' ends
// (the compiled loop is not instrumented by AddressSanitizer; the guards are checked instead).
TEST(FusionJit, WritesNothingPastItsResults) {
  constexpr int64_t kGuard = 64;
  for (int64_t n = 2048 + 1; n <= 2048 + 33; ++n) {
    Graph g;
    Builder b(g);
    Tensor x = b.param("x", {DType::bf16, {n}}), y = b.param("y", {DType::f32, {n}});
    b.result(convert(logistic(convert(x, DType::f32)) * y, DType::bf16));
    fuse(g);
    ASSERT_EQ(g.nodes.size(), 1u) << print(g);
    const Node& fusion = g.nodes[0];
    auto guarded = [&](const Type& t, double fill) {  // n elements, then kGuard more set to `fill`
      exec::Array whole = exec::Array::zeros({t.dtype, {n + kGuard}});
      for (int64_t i = 0; i < n + kGuard; ++i) whole.set(i, i < n ? std::sin(static_cast<double>(i)) * 3 : fill);
      return whole;
    };
    std::vector<exec::Array> storage, args;
    for (ValueId p : fusion.inputs) {
      storage.push_back(guarded(g.type(p), 7));
      args.push_back(storage.back().view(g.type(p)));
    }
    std::vector<exec::Array> want;
    for (Isa isa : exec::available_isas()) {
      exec::IsaOverride guard(isa);
      exec::Array result_storage = guarded(g.type(fusion.outputs[0]), -5);
      std::vector<exec::Array> out{result_storage.view(g.type(fusion.outputs[0]))};
      std::vector<Type> types;
      for (const exec::Array& a : args) types.push_back(a.type());
      std::vector<std::byte> workspace(static_cast<size_t>(exec::workspace_fusion(fusion, types)));
      const exec::Options options;
      exec::kernel_fusion(fusion, args, out, exec::KernelContext{options, workspace});
      for (int64_t i = n; i < n + kGuard; ++i) ASSERT_EQ(result_storage.get(i), -5) << "n " << n << " under " << exec::isa_name(isa);
      if (isa == Isa::baseline) want.push_back(out[0].clone());
      else EXPECT_TRUE(same_bits(out[0], want[0])) << "n " << n << " under " << exec::isa_name(isa);
    }
  }
}

// A loop of one element (a scalar fusion, as the optimizer's): the padded tail alone.
TEST(FusionJit, AScalarLoopGivesTheInterpretersBits) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {}}), y = b.param("y", {DType::f32, {}});
  b.result(exp(x) * y + x);
  b.result(convert(logistic(y) / x, DType::bf16));
  expect_compiled_bits(g, 31);
}

}  // namespace
}  // namespace remat
