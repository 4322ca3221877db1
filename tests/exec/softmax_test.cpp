// The softmax kernels (exec/kernels/softmax.cpp) against plain loops in f64 (an independent route: libm's exp,
// one accumulator, no lanes): probabilities and the VJP p·(g − Σ g·p), for rows shorter and longer than the 8 lanes,
// with masked (−inf) entries, a NaN row, in f32, f64 and bf16 (probabilities rounded to bf16, a bf16 cotangent), and
// one row per thread or many. log_softmax and its VJP g − exp(y)·Σ g likewise.
#include "exec/exec.h"
#include "ir/ir.h"

#include <gtest/gtest.h>

#include "support/error_of.h"

#include <cmath>
#include <limits>
#include <random>

namespace remat {
namespace {

using namespace ir;

struct Reference {
  std::vector<double> p, dx;
  std::vector<double> scale;  // per row: Σ |g_j|·p_j, the size of the sum d = Σ g_j·p_j before it cancels
};

// softmax and its VJP of rows of length w, in f64, exactly as the formulas read.
Reference reference(const exec::Array& x, const exec::Array& g, int64_t w) {
  Reference r{std::vector<double>(static_cast<size_t>(x.size())), std::vector<double>(static_cast<size_t>(x.size())),
              std::vector<double>(static_cast<size_t>(x.size() / w))};
  for (int64_t row = 0; row < x.size() / w; ++row) {
    double m = -std::numeric_limits<double>::infinity(), s = 0, d = 0, &scale = r.scale[static_cast<size_t>(row)];
    bool nan = false;
    for (int64_t j = 0; j < w; ++j) nan = nan || std::isnan(x.get(row * w + j)), m = std::max(m, x.get(row * w + j));
    if (nan) m = std::numeric_limits<double>::quiet_NaN();
    for (int64_t j = 0; j < w; ++j) s += std::exp(x.get(row * w + j) - m);
    for (int64_t j = 0; j < w; ++j) r.p[static_cast<size_t>(row * w + j)] = std::exp(x.get(row * w + j) - m) / s;
    for (int64_t j = 0; j < w; ++j) d += g.get(row * w + j) * r.p[static_cast<size_t>(row * w + j)];
    for (int64_t j = 0; j < w; ++j) scale += std::abs(g.get(row * w + j)) * r.p[static_cast<size_t>(row * w + j)];
    for (int64_t j = 0; j < w; ++j)
      r.dx[static_cast<size_t>(row * w + j)] = r.p[static_cast<size_t>(row * w + j)] * (g.get(row * w + j) - d);
  }
  return r;
}

void expect_near(double got, double want, double rel, double abs, const std::string& where) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << where;
    return;
  }
  EXPECT_NEAR(got, want, abs + rel * std::abs(want)) << where;
}

// x: softmax's input dtype; p: the probabilities' (and the cotangent's).
void check(DType x_type, DType p_type, int64_t rows, int64_t w, double rel) {
  Graph gr;
  Builder b(gr);
  Tensor x = b.param("x", {x_type, {rows, w}}), g = b.param("g", {p_type, {rows, w}});
  b.result(softmax(x, p_type));
  b.result(softmax_grad(x, g));
  std::mt19937 rng(static_cast<unsigned>(rows * 131 + w));
  std::uniform_real_distribution<double> dist(-6, 6);
  std::vector<exec::Array> args{exec::Array(gr.type(gr.params[0])), exec::Array(gr.type(gr.params[1]))};
  for (int64_t i = 0; i < rows * w; ++i) {
    const int64_t row = i / w, j = i % w;
    // Row 1 is causal-masked (entries past the diagonal −inf), row 2 holds a NaN, the others are dense.
    args[0].set(i, row == 1 && j > row ? -std::numeric_limits<double>::infinity()
                   : row == 2 && j == w / 2 ? std::numeric_limits<double>::quiet_NaN()
                                            : dist(rng));
    args[1].set(i, dist(rng));
  }
  const std::vector<exec::Array> out = exec::run(gr, args);
  const Reference want = reference(args[0], args[1], w);
  const std::string label = fmt::format("{} -> {}, {} rows of {}", dtype_name(x_type), dtype_name(p_type), rows, w);
  for (int64_t i = 0; i < rows * w; ++i) {
    expect_near(out[0].get(i), want.p[static_cast<size_t>(i)], rel, 1e-300, fmt::format("{}: p[{}]", label, i));
    // dx_i = p_i·(g_i − d), d = Σ g_j·p_j: rel of p_i carries into dx_i, and d's rounding is rel of Σ |g_j|·p_j,
    // times p_i. So the bound rel·(|dx_i| + p_i·(|g_i| + Σ |g_j|·p_j)) shrinks with p_i: a dx of zeros fails
    // wherever |g_i − d| is more than about rel·(|g_i| + 6).
    const double p = want.p[static_cast<size_t>(i)], bound = p * (std::abs(args[1].get(i)) + want.scale[static_cast<size_t>(i / w)]);
    expect_near(out[1].get(i), want.dx[static_cast<size_t>(i)], rel, rel * bound, fmt::format("{}: dx[{}]", label, i));
  }
}

TEST(Softmax, EqualsTheFormulaInF64) {
  for (int64_t w : {1, 3, 8, 13, 40, 2051}) {
    check(DType::f32, DType::f32, 5, w, 1e-5);
    check(DType::f64, DType::f64, 5, w, 1e-13);
    check(DType::f32, DType::bf16, 5, w, 1.0 / 128);  // bf16 probabilities and cotangent, f32 input and dx
    check(DType::bf16, DType::bf16, 5, w, 1.0 / 128);
  }
  check(DType::f32, DType::f32, 300, 64, 1e-5);  // many rows: every thread gets some
}

// log_softmax of rows of length w (dtype t) against (x − max) − log Σ exp(x − max) in f64, and its VJP against
// g − p·Σ g with p the exact f64 softmax of x (the kernel reads its rounded y: in bf16 that costs up to
// |y|·2⁻⁹ of p, ops.h, the tolerance's (1 + |y|) factor). Row 1 is causal-masked (its −inf entries stay −inf, their gradient is
// g), row 2 holds a NaN (the whole row NaN).
void check_log_softmax(DType t, int64_t rows, int64_t w, double rel) {
  Graph gr;
  Builder b(gr);
  Tensor x = b.param("x", {t, {rows, w}}), g = b.param("g", {t, {rows, w}});
  Tensor y = log_softmax(x);
  b.result(y);
  b.result(log_softmax_grad(y, g));
  std::mt19937 rng(static_cast<unsigned>(rows * 17 + w));
  std::uniform_real_distribution<double> dist(-6, 6);
  std::vector<exec::Array> args{exec::Array(gr.type(gr.params[0])), exec::Array(gr.type(gr.params[1]))};
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < rows * w; ++i) {
    const int64_t row = i / w, j = i % w;
    args[0].set(i, row == 1 && j > row ? -inf : row == 2 && j == w / 2 ? std::numeric_limits<double>::quiet_NaN()
                                                                       : dist(rng));
    args[1].set(i, dist(rng));
  }
  const std::vector<exec::Array> out = exec::run(gr, args);
  const std::string label = fmt::format("log_softmax {}, {} rows of {}", dtype_name(t), rows, w);
  for (int64_t row = 0; row < rows; ++row) {
    double m = -inf, s = 0, sum_g = 0;
    bool nan = false;
    for (int64_t j = 0; j < w; ++j) nan = nan || std::isnan(args[0].get(row * w + j)), m = std::max(m, args[0].get(row * w + j));
    for (int64_t j = 0; j < w; ++j) s += std::exp(args[0].get(row * w + j) - m), sum_g += args[1].get(row * w + j);
    for (int64_t j = 0; j < w; ++j) {
      const int64_t i = row * w + j;
      const double want_y = nan ? std::numeric_limits<double>::quiet_NaN() : (args[0].get(i) - m) - std::log(s);
      if (std::isinf(want_y)) {
        EXPECT_EQ(out[0].get(i), want_y) << label << ": y[" << i << "]";
      } else {
        expect_near(out[0].get(i), want_y, rel, rel * (std::abs(m) + 1), fmt::format("{}: y[{}]", label, i));
      }
      const double p = std::exp((args[0].get(i) - m) - std::log(s)), want_dx = args[1].get(i) - p * sum_g;
      if (nan) {
        EXPECT_TRUE(std::isnan(out[1].get(i))) << label << ": dx[" << i << "]";
      } else {
        // dx_i = g_i − p_i·Σ g_j, Σ g_j summed from the exact g (its rounding: rel·|Σ g_j| on the rows here, whose
        // sums do not cancel to near zero). p_i is exp of the rounded y_i: its absolute error rel·|y_i| becomes a
        // relative one of p_i. So the bound rel·(|dx_i| + p_i·(|g_i| + (1 + |y_i|)·|Σ g_j|)) (0 where p_i is 0)
        // shrinks with p_i: without the p_i·Σ g_j term, dx_i = g_i fails wherever p_i·|Σ g_j| is above it.
        const double bound = p == 0 ? 0 : p * (std::abs(args[1].get(i)) + (1 + std::abs(want_y)) * std::abs(sum_g));
        expect_near(out[1].get(i), want_dx, rel, rel * bound, fmt::format("{}: dx[{}]", label, i));
      }
    }
  }
}

TEST(LogSoftmax, EqualsTheFormulaInF64) {
  for (int64_t w : {1, 3, 8, 13, 40, 2051}) {
    check_log_softmax(DType::f32, 5, w, 1e-5);
    check_log_softmax(DType::f64, 5, w, 1e-13);
    check_log_softmax(DType::bf16, 5, w, 1.0 / 128);
  }
  check_log_softmax(DType::f32, 300, 64, 1e-5);  // many rows: every thread gets some
}

TEST(Softmax, RefusesAnIntegerOperandNamingTheOp) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::i32, {2, 3}});
  const std::string error = testing_support::error_of([&] { softmax(x, DType::f32); });
  EXPECT_NE(error.find("softmax takes a floating-point x of rank >= 1 and optionally its mask, got (i32[2,3])"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace remat
