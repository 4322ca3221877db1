// Executor semantics against values computed by hand.
#include "exec/exec.h"

#include <gtest/gtest.h>

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
