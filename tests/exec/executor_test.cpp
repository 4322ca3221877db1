// Executor semantics against values computed by hand.
#include "exec/executable.h"
#include "exec/kernels/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace remat {
namespace {

using namespace ir;

TEST(Executor, ScanRunsBodyOverSlicesAndStacksYs) {
  // carry c, xs x_t: c' = c + x_t, y_t = c' * 2  (a running sum)
  Graph g;
  Builder b(g);
  Tensor c0 = b.param("c0", {DType::f32, {2}});
  Tensor xs = b.param("xs", {DType::f32, {3, 2}});
  auto body = [](Builder&, std::span<const Tensor>, std::span<const Tensor> hs, std::span<const Tensor> x) {
    Tensor c = hs[0] + x[0];
    return std::vector<Tensor>{c, c * 2.0};
  };
  for (bool reverse : {false, true}) {
    Graph gi = g.clone();
    Builder bi(gi);
    auto outs = scan(bi, 3, {}, std::array{bi.wrap(c0.id)}, std::array{bi.wrap(xs.id)}, body, "sum", reverse);
    bi.result(outs[0]);
    bi.result(outs[1]);
    std::vector<exec::Array> args{exec::Array::from<float>({2}, {1, 10}),
                                  exec::Array::from<float>({3, 2}, {1, 2, 3, 4, 5, 6})};
    auto r = exec::run(gi, args);
    EXPECT_EQ(r[0].to_vector<float>(), (std::vector<float>{10, 22}));
    if (!reverse) EXPECT_EQ(r[1].to_vector<float>(), (std::vector<float>{4, 24, 10, 32, 20, 44}));
    else EXPECT_EQ(r[1].to_vector<float>(), (std::vector<float>{20, 44, 18, 40, 12, 32}));
  }
}

TEST(Executor, LayoutOps) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {2, 3}});
  b.result(transpose(x, {1, 0}));
  b.result(slice(x, {0, 1}, {2, 3}));
  b.result(broadcast_in_dim(reduce_sum(x, {1}), {2, 2}, {0}));
  b.result(reduce_max(x, {0}));
  b.result(concatenate(std::array{x, x}, 0));
  std::vector<exec::Array> args{exec::Array::from<float>({2, 3}, {1, 5, 3, 4, 2, 6})};
  auto r = exec::run(g, args);
  EXPECT_EQ(r[0].to_vector<float>(), (std::vector<float>{1, 4, 5, 2, 3, 6}));
  EXPECT_EQ(r[1].to_vector<float>(), (std::vector<float>{5, 3, 2, 6}));
  EXPECT_EQ(r[2].to_vector<float>(), (std::vector<float>{9, 9, 12, 12}));
  EXPECT_EQ(r[3].to_vector<float>(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(r[4].to_vector<float>(), (std::vector<float>{1, 5, 3, 4, 2, 6, 1, 5, 3, 4, 2, 6}));
}

// Transposes that swap the innermost dim with one contiguous in the source copy in blocks (transpose_blocks),
// with and without dims outside the pair, sizes no multiple of the blocks, and 2-, 4- and 8-byte elements: each
// element where the permutation puts it.
TEST(Executor, BlockedTransposesPutEveryElementInPlace) {
  // {0,2,1}: the pair with an outer dim; {1,2,0} of [9,10,45]: the pair alone (merged to [450,9]); {2,1,0}: rows.
  for (const auto& [shape, perm] : {std::pair{Shape{3, 70, 45}, IntList{0, 2, 1}}, std::pair{Shape{9, 10, 45}, IntList{1, 2, 0}},
                                    std::pair{Shape{3, 70, 45}, IntList{2, 1, 0}}})
    for (DType dtype : {DType::bf16, DType::f32, DType::f64}) {
      Graph g;
      Builder b(g);
      b.result(transpose(b.param("x", {dtype, shape}), perm));
      std::vector<exec::Array> x{exec::Array({dtype, shape})};
      for (int64_t i = 0; i < x[0].size(); ++i) x[0].set(i, static_cast<double>(i % 251));
      const exec::Array y = exec::run(g, x)[0];
      const Shape& out = y.type().shape;
      int64_t at = 0;
      for (int64_t i = 0; i < out[0]; ++i)
        for (int64_t j = 0; j < out[1]; ++j)
          for (int64_t k = 0; k < out[2]; ++k, ++at) {
            int64_t src[3];
            src[perm[0]] = i, src[perm[1]] = j, src[perm[2]] = k;
            const int64_t from = (src[0] * shape[1] + src[1]) * shape[2] + src[2];
            ASSERT_EQ(y.get(at), static_cast<double>(from % 251)) << dtype_name(dtype) << " at " << i << "," << j << "," << k;
          }
    }
}

// Row reductions over windows of 1 to 40 (whole groups of the kernel's 8 lanes and every tail) against a plain
// loop: f32 sums (accumulated in f64, so any order rounds to the same f32 here) and maxima, with a NaN and -inf
// in some rows (a NaN anywhere makes the row's max NaN).
TEST(Executor, RowReductionsEqualAPlainLoopForEveryWindowLength) {
  for (int64_t n = 1; n <= 40; ++n) {
    Graph g;
    Builder b(g);
    Tensor x = b.param("x", {DType::f32, {3, n}});
    b.result(reduce_sum(x, {1}));
    b.result(reduce_max(x, {1}));
    exec::Array a(g.type(x.id));
    for (int64_t i = 0; i < a.size(); ++i) a.set(i, std::sin(static_cast<double>(i * 7 + n)) * 100);
    a.set(n + n / 2, -std::numeric_limits<double>::infinity());
    if (n > 2) a.set(2 * n + n - 2, std::numeric_limits<double>::quiet_NaN());
    const std::vector<exec::Array> r = exec::run(g, std::vector<exec::Array>{a});
    for (int64_t row = 0; row < 3; ++row) {
      double sum = 0, max = -std::numeric_limits<double>::infinity();
      bool nan = false;
      for (int64_t j = 0; j < n; ++j) {
        const double v = a.get(row * n + j);
        sum += v;
        nan |= std::isnan(v);
        max = std::max(max, v);
      }
      if (nan) {
        EXPECT_TRUE(std::isnan(r[0].get(row)) && std::isnan(r[1].get(row))) << "n " << n << " row " << row;
      } else {
        EXPECT_EQ(r[0].get(row), static_cast<double>(static_cast<float>(sum))) << "n " << n << " row " << row;
        EXPECT_EQ(r[1].get(row), max) << "n " << n << " row " << row;
      }
    }
  }
}

// iota over each dim of a few shapes, written range by range as unfused kernels' threads and fusion tiles ask for it
// (every start and length), in i32, f32 and bf16: each element holds its coordinate along that dim, computed
// from its flat index by dividing through the shape; elements outside the range keep their sentinel.
TEST(Executor, IotaRangesHoldTheirCoordinate) {
  for (const Shape& shape : {Shape{7}, Shape{3, 4, 5}, Shape{2, 1, 6}}) {
    for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim) {
      for (DType dt : {DType::i32, DType::f32, DType::bf16}) {
        Graph g;
        Builder b(g);
        b.result(iota(b, dt, shape, dim));
        const Type& t = g.type(g.results[0]);
        const int64_t n = t.num_elements();
        for (int64_t lo = 0; lo < n; ++lo) {
          for (int64_t len = 0; lo + len <= n; ++len) {
            exec::Array out(t);
            for (int64_t i = 0; i < n; ++i) out.set(i, -3);
            exec::constant_range(g.nodes.back(), t, lo, len, out.bytes() + lo * dtype_size(dt));
            for (int64_t i = 0; i < n; ++i) {
              if (i < lo || i >= lo + len) {
                ASSERT_EQ(out.get(i), -3) << "range [" << lo << ", " << lo + len << ") wrote " << i;
              }
            }
            for (int64_t i = lo; i < lo + len; ++i) {
              int64_t coordinate = i;
              for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d > dim; --d) coordinate /= shape[d];
              coordinate %= shape[dim];
              ASSERT_EQ(out.get(i), static_cast<double>(coordinate))
                  << "dim " << dim << " range [" << lo << ", " << lo + len << ") element " << i;
            }
          }
        }
      }
    }
  }
}

TEST(Executor, GatherOutOfRangeNamesNodeAndScope) {
  Graph g;
  Builder b(g);
  Tensor table = b.param("table", {DType::f32, {4, 2}});
  Tensor ids = b.param("ids", {DType::i32, {3}});
  auto s = b.scope("embed");
  b.result(gather(table, ids));
  std::vector<exec::Array> args{exec::Array::zeros(table.type()), exec::Array::from<int32_t>({3}, {0, 7, 1})};
  try {
    exec::run(g, args);
    FAIL() << "expected an index error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("gather in graph @main (scope 'embed')"), std::string::npos) << m;
    EXPECT_NE(m.find("index 7 at position 1 is outside the table's 4 rows"), std::string::npos) << m;
  }
}

TEST(Executor, ArgumentTypeMismatchIsAClearError) {
  Graph g;
  Builder b(g);
  b.result(neg(b.param("x", {DType::f32, {2}})));
  std::vector<exec::Array> args{exec::Array::zeros({DType::f32, {3}})};
  EXPECT_THROW(
      {
        try {
          exec::run(g, args);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("argument 0 (%x) is f32[3] but the graph expects f32[2]"),
                    std::string::npos);
          throw;
        }
      },
      Error);
}

// Evaluation runs in the training step's arenas: a second executable in the first's arenas, on the first's
// owned (donated) argument buffer. Each run, poisoned, gives the values computed by hand; the second's run
// overwrites the first's arena result but never its arguments. A plan that does not fit gets its own arena.
TEST(Executable, RunsInAnotherExecutablesArenas) {
  Graph step, eval, big;
  {
    Builder b(step);
    Tensor w = b.param("w", {DType::f32, {64}}), x = b.param("x", {DType::f32, {64}});
    Tensor h = tanh(x) * 2.0;
    b.result(h * 3.0);           // an arena result
    b.result(w + h * 0.5);       // w' = w + tanh(x), written into w
  }
  {
    Builder b(eval);
    Tensor w = b.param("w", {DType::f32, {64}});
    b.result(w * w);
  }
  {
    Builder b(big);
    Tensor w = b.param("w", {DType::f32, {4096}});
    b.result(exp(exp(w)) + w);
  }
  const exec::Options o{.poison = true, .separate_buffers = false};
  auto ws = exec::workspace_of(exec::cpu());
  exec::Executable train(step.clone(), plan::build(step, {.donate = {{1, 0}}, .workspace = ws}), o);
  std::vector<exec::Array>& args = train.own_arguments();
  exec::Executable evaluate(eval.clone(), plan::build(eval, {.workspace = ws}), o, &train);
  std::vector<exec::Array>& eval_args = evaluate.own_arguments({{0, args[0]}});
  EXPECT_TRUE(evaluate.shares_arenas());
  EXPECT_EQ(evaluate.owned_bytes(), 0) << "arguments shared, arenas shared";
  exec::Executable separate(big.clone(), plan::build(big, {.workspace = ws}), o, &train);
  EXPECT_FALSE(separate.shares_arenas()) << "its plan does not fit in the step's arena";
  std::vector<float> w(64, 0.25f);
  for (int64_t i = 0; i < 64; ++i) args[1].data<float>()[i] = static_cast<float>(i) / 64.0f;
  std::copy(w.begin(), w.end(), args[0].data<float>());
  for (int step_index = 0; step_index < 3; ++step_index) {
    const exec::Array h3 = train.run()[0];  // a view into the shared arena
    for (int64_t i = 0; i < 64; ++i) {
      const float t = std::tanh(static_cast<float>(i) / 64.0f) * 2.0f;
      w[static_cast<size_t>(i)] = w[static_cast<size_t>(i)] + t * 0.5f;
      ASSERT_EQ(h3.data<float>()[i], t * 3.0f);
      ASSERT_EQ(args[0].data<float>()[i], w[static_cast<size_t>(i)]) << "w' written in place";
    }
    EXPECT_EQ(eval_args[0].bytes(), args[0].bytes()) << "evaluation reads the step's buffer";
    const exec::Array sq = evaluate.run()[0];
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(sq.data<float>()[i], w[static_cast<size_t>(i)] * w[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(args[0].data<float>()[i], w[static_cast<size_t>(i)]) << "arguments untouched";
  }
}

TEST(Dtype, Bf16AndF16RoundToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: the even one is 1 + 2^-6.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);  // above half: up
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(INFINITY)), INFINITY);
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 0x1p-11f)), 1.0f);                    // tie to even
  EXPECT_EQ(f16_to_float(float_to_f16(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);      // tie to even (up)
  EXPECT_EQ(f16_to_float(float_to_f16(70000.0f)), INFINITY);                       // overflow
}

}  // namespace
}  // namespace remat
