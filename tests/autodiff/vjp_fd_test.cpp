// Every VJP rule against central finite differences in f64. One case (or more) per op of the op table;
// the coverage test fails when an op appears in no case.
#include "autodiff/autodiff.h"
#include "exec/exec.h"
#include "remat/remat.h"

#include <gtest/gtest.h>

#include "support/error_of.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <set>

namespace remat {
namespace {

using namespace ir;

// The policies of the cases' remat regions: names saved, offloaded, recomputed (everything else).
constexpr const char* kRegionPolicies[] = {"nothing_saveable", "everything_saveable",
                                           "save_and_offload_only_these_names(save=[mlpwi_0], offload=[mlpwo])"};

constexpr DType F = DType::f64;

// An i32 constant vector built from primitives.
Tensor const_i32(Builder& b, const std::vector<int32_t>& values) {
  std::vector<Tensor> parts;
  for (int32_t v : values) parts.push_back(reshape(scalar(b, DType::i32, v), {1}));
  return concatenate(parts, 0);
}

struct Case {
  std::string label;
  std::function<Tensor(Builder&)> build;  // declares f64 params, returns the f64 output
  double lo = -1.0, hi = 1.0;             // range of random inputs
  double eps = 1e-6, tol = 1e-7;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

std::vector<Case> cases() {
  std::vector<Case> c;
  auto p = [](Builder& b, const char* name, Shape s) { return b.param(name, Type{F, std::move(s)}); };
  c.push_back({"dot_general_matmul", [=](Builder& b) { return matmul(p(b, "x", {3, 4}), p(b, "w", {4, 5})); }});
  c.push_back({"dot_general_batch", [=](Builder& b) {
                 return dot_general(p(b, "q", {2, 3, 4}), p(b, "k", {2, 5, 4}), DotDims{{2}, {2}, {0}, {0}});
               }});
  c.push_back({"dot_general_transposed_multi_contract", [=](Builder& b) {
                 // lhs [k1, m, k0] . rhs [n, k0, k1]: contract lhs (2, 0) with rhs (1, 2)
                 return dot_general(p(b, "a", {3, 2, 4}), p(b, "c", {5, 4, 3}), DotDims{{2, 0}, {1, 2}, {}, {}});
               }});
  c.push_back({"dot_general_batch_not_leading", [=](Builder& b) {
                 return dot_general(p(b, "a", {3, 2, 4}), p(b, "c", {4, 5, 2}), DotDims{{2}, {0}, {1}, {2}});
               }});
  auto binary = [&](const char* label, std::function<Tensor(Tensor, Tensor)> f, double lo, double hi) {
    c.push_back({label, [=](Builder& b) { return f(p(b, "a", {2, 3}), p(b, "b", {2, 3})); }, lo, hi});
  };
  binary("add", [](Tensor a, Tensor b) { return a + b; }, -1, 1);
  binary("sub", [](Tensor a, Tensor b) { return a - b; }, -1, 1);
  binary("mul", [](Tensor a, Tensor b) { return a * b; }, -1, 1);
  binary("div", [](Tensor a, Tensor b) { return a / b; }, 0.5, 1.5);
  binary("max", [](Tensor a, Tensor b) { return max(a, b); }, -1, 1);
  binary("min", [](Tensor a, Tensor b) { return min(a, b); }, -1, 1);
  binary("pow", [](Tensor a, Tensor b) { return pow(a, b); }, 0.5, 1.5);
  auto unary = [&](const char* label, Tensor (*f)(Tensor), double lo, double hi) {
    c.push_back({label, [=](Builder& b) { return f(p(b, "x", {2, 3})); }, lo, hi});
  };
  unary("neg", &neg, -1, 1);
  unary("exp", &exp, -1, 1);
  unary("log", &log, 0.5, 2);
  unary("tanh", &tanh, -1, 1);
  unary("logistic", &logistic, -2, 2);
  unary("sqrt", &sqrt, 0.5, 2);
  unary("rsqrt", &rsqrt, 0.5, 2);
  unary("sin", &sin, -3, 3);
  unary("cos", &cos, -3, 3);
  c.push_back({"compare_select", [=](Builder& b) {
                 Tensor x = p(b, "x", {2, 3}), y = p(b, "y", {2, 3});
                 return select(compare(x, y, "lt"), x * 2.0, y * 3.0);
               }});
  c.push_back({"broadcast_in_dim", [=](Builder& b) { return broadcast_in_dim(p(b, "x", {3, 1}), {2, 3, 4}, {1, 2}); }});
  c.push_back({"reshape", [=](Builder& b) { return reshape(p(b, "x", {2, 6}), {3, 4}); }});
  c.push_back({"transpose", [=](Builder& b) { return transpose(p(b, "x", {2, 3, 4}), {2, 0, 1}); }});
  c.push_back({"slice", [=](Builder& b) { return slice(p(b, "x", {4, 5}), {1, 2}, {3, 5}); }});
  c.push_back({"dynamic_slice_clamped", [=](Builder& b) {
                 std::vector<Tensor> starts{scalar(b, DType::i32, 1), scalar(b, DType::i32, 9)};  // 9 clamps to 2
                 return dynamic_slice(p(b, "x", {4, 5}), starts, {2, 3});
               }});
  c.push_back({"dynamic_update_slice", [=](Builder& b) {
                 std::vector<Tensor> starts{scalar(b, DType::i32, 2), scalar(b, DType::i32, 1)};
                 return dynamic_update_slice(p(b, "x", {4, 5}), p(b, "u", {2, 3}), starts);
               }});
  c.push_back({"concatenate", [=](Builder& b) {
                 std::vector<Tensor> xs{p(b, "a", {2, 3}), p(b, "b", {2, 1}), p(b, "c", {2, 2})};
                 return concatenate(xs, 1);
               }});
  c.push_back({"reduce_sum", [=](Builder& b) { return reduce_sum(p(b, "x", {2, 3, 4}), {0, 2}); }});
  c.push_back({"reduce_max", [=](Builder& b) { return reduce_max(p(b, "x", {3, 4}), {1}); }});
  c.push_back({"sum_of_squares", [=](Builder& b) { return sum_of_squares(p(b, "x", {3, 4}), {1}); }});
  // softmax over the last axis (its VJP is softmax_grad), rows of 5 and a row with a masked (-inf) entry.
  c.push_back({"softmax", [=](Builder& b) { return softmax(p(b, "x", {3, 5})) * p(b, "w", {3, 5}); }, -2, 2});
  c.push_back({"softmax_masked", [=](Builder& b) {
                 Tensor x = p(b, "x", {2, 4});
                 Tensor visible = compare(iota(b, DType::i32, {2, 4}, 1), iota(b, DType::i32, {2, 4}, 0), "le");
                 return softmax(select(visible, x, full(b, x.type(), -std::numeric_limits<double>::infinity())));
               }, -2, 2});
  // Megatron's scaled masked softmax (the op with a mask: its VJP is softmax_grad with the mask and scale), scores
  // [2, 3, 4] under a causal mask [3, 4] (rows of 1, 2 and 3 visible keys) and a scale.
  c.push_back({"softmax_scaled_masked", [=](Builder& b) {
                 Tensor x = p(b, "x", {2, 3, 4});
                 Tensor visible = compare(iota(b, DType::i32, {3, 4}, 1), iota(b, DType::i32, {3, 4}, 0), "le");
                 return masked_softmax(x, visible, 0.7, x.dtype()) * p(b, "w", {2, 3, 4});
               }, -2, 2});
  // log_softmax over the last axis (its VJP is log_softmax_grad): rows of 6, and a row with masked (-inf) entries
  // whose log-probabilities are -inf (weighted by zero: their cotangent is zero, as the loss's one-hot gives).
  c.push_back({"log_softmax", [=](Builder& b) { return log_softmax(p(b, "x", {3, 6})) * p(b, "w", {3, 6}); }, -2, 2});
  c.push_back({"log_softmax_masked", [=](Builder& b) {
                 Tensor x = p(b, "x", {2, 4});
                 Tensor visible = compare(iota(b, DType::i32, {2, 4}, 1), iota(b, DType::i32, {2, 4}, 0), "le");
                 Tensor y = log_softmax(select(visible, x, full(b, x.type(), -std::numeric_limits<double>::infinity())));
                 return select(visible, y, zeros_like(y));
               }, -2, 2});
  // The loss's target log-probabilities (its VJP is target_log_prob_grad), rows of 5, one target outside them.
  c.push_back({"target_log_prob", [=](Builder& b) {
                 Tensor targets = reshape(const_i32(b, {4, 0, 2, -1, 3, 1}), {2, 3});
                 return target_log_prob(p(b, "x", {2, 3, 5}), targets, F)[0] * p(b, "u", {2, 3});
               }, -2, 2});
  // RMSNorm (its VJP is rms_norm_grad: dx and dw in one op), rows of 5, the scale a param too; eps large enough
  // to matter.
  c.push_back({"rms_norm", [=](Builder& b) {
                 return rms_norm(p(b, "x", {2, 3, 5}), p(b, "w", {5}), 0.1) * p(b, "u", {2, 3, 5});
               }, -2, 2});
  // SwiGLU's product (its VJP is swiglu_grad: dgate and dup in one op), gates across the logistic's bend.
  c.push_back({"swiglu", [=](Builder& b) {
                 return swiglu(p(b, "gate", {2, 3, 5}), p(b, "up", {2, 3, 5})) * p(b, "w", {2, 3, 5});
               }, -3, 3});
  // RoPE (its VJP is rope with −sin), tables as params too: their cotangents sum over batch and heads.
  c.push_back({"rope", [=](Builder& b) {
                 return rope(p(b, "x", {2, 3, 2, 6}), p(b, "cos", {3, 3}), p(b, "sin", {3, 3})) * p(b, "w", {2, 3, 2, 6});
               }, -2, 2});
  // Flash attention, grouped-query (4 query heads over 2 kv heads), causal and not; its VJP is attention_grad.
  for (bool causal : {true, false})
    c.push_back({causal ? "attention_causal" : "attention", [=](Builder& b) {
                   return attention(p(b, "q", {2, 5, 4, 3}), p(b, "k", {2, 5, 2, 3}), p(b, "v", {2, 5, 2, 3}), causal, 0.7)[0];
                 }});
  c.push_back({"convert_element_type_roundtrip",
               [=](Builder& b) { return convert(convert(p(b, "x", {2, 3}), DType::f32) * 2.0f, F); }, -1, 1, 1e-3,
               1e-4});
  c.push_back({"convert_group", [=](Builder& b) {
                 std::vector<Tensor> xs{p(b, "x", {2, 3}), p(b, "y", {2, 3})};
                 std::vector<Tensor> ys = convert_group(xs, DType::f32);
                 return convert(ys[0] * 2.0f, F) + convert(ys[1] * ys[1], F);
               }, -1, 1, 1e-3, 1e-4});
  c.push_back({"iota_full", [=](Builder& b) {
                 Tensor x = p(b, "x", {2, 3});
                 return x * convert(iota(b, DType::i32, {2, 3}, 1), F) + full(b, x.type(), 0.5);
               }});
  c.push_back({"gather", [=](Builder& b) { return gather(p(b, "table", {5, 3}), const_i32(b, {1, 3, 1, 0})); }});
  c.push_back({"scatter_add", [=](Builder& b) {
                 return scatter_add(p(b, "x", {5, 3}), const_i32(b, {4, 0, 4}), p(b, "u", {3, 3}));
               }});
  c.push_back({"name", [=](Builder& b) { return checkpoint_name(p(b, "x", {2, 3}) * 3.0, "mlpwo"); }});
  c.push_back({"check_finite", [=](Builder& b) { return tanh(check_finite(p(b, "x", {2, 3}) * 3.0)); }});
  // One rank: the sum over the axis is the operand itself (several ranks: tests/trainer/data_parallel_test.cpp).
  c.push_back({"all_reduce", [=](Builder& b) { return tanh(all_reduce(p(b, "x", {2, 3}) * 3.0, "data", 1)); }});
  // pvary's transpose sums over the axis (one rank here); axis_index is rank 0 of one.
  c.push_back({"pvary_axis_index", [=](Builder& b) {
                 Tensor x = p(b, "x", {2, 3});
                 return tanh(pvary(x * 3.0, "tensor", 1)) + x * convert(axis_index(b, "tensor", 1), F);
               }});
  c.push_back({"all_gather_reduce_scatter", [=](Builder& b) {
                 return tanh(reduce_scatter(all_gather(p(b, "x", {2, 3}) * 3.0, "fsdp", 1, 1), "fsdp", 1, 0));
               }});
  c.push_back({"offload_reload", [=](Builder& b) {
                 Tensor x = p(b, "x", {2, 3});
                 return b.emit1(Op::reload, std::array{b.emit1(Op::offload, std::array{tanh(x)})}) * x;
               }});
  // A remat region under each kind of decision: names saved, offloaded, recomputed (everything else).
  auto block = [](Builder&, std::span<const Tensor> a) {
    Tensor h = checkpoint_name(tanh(matmul(a[0], a[1])), "mlpwi_0");
    Tensor g = checkpoint_name(exp(h) * a[0], "mlpwo");
    return std::vector<Tensor>{logistic(matmul(g, a[1])) * h};
  };
  for (const char* policy : kRegionPolicies) {
    c.push_back({std::string("remat_") + (policy[0] == 's' ? "save_offload" : policy), [=](Builder& b) {
                   Tensor x = p(b, "x", {3, 3}), w = p(b, "w", {3, 3});
                   return checkpoint(b, std::array{x, w}, block, policy)[0];
                 }});
  }
  auto rnn = [](Builder&, std::span<const Tensor> cs, std::span<const Tensor> hs, std::span<const Tensor> xs) {
    Tensor h = tanh(matmul(reshape(hs[0], {1, 3}), cs[0]) + reshape(xs[0], {1, 3}));
    Tensor hn = reshape(h, {3});
    return std::vector<Tensor>{hn, hn * xs[0]};
  };
  for (bool reverse : {false, true}) {
    c.push_back({reverse ? "scan_reverse" : "scan", [=](Builder& b) {
                   Tensor w = p(b, "w", {3, 3}), h0 = p(b, "h0", {3}), xs = p(b, "xs", {4, 3});
                   auto outs = scan(b, 4, std::array{w}, std::array{h0}, std::array{xs}, rnn, "rnn", reverse);
                   return outs[1] + broadcast_to(outs[0], {4, 3});
                 }});
  }
  c.push_back({"scan_nested", [=](Builder& b) {
                 // An outer scan over 2 groups, each an inner scan over 3 layers (the "double scan").
                 Tensor ws = p(b, "ws", {2, 3, 3, 3}), h0 = p(b, "h0", {3});
                 auto inner = [](Builder& ib, std::span<const Tensor>, std::span<const Tensor> hs,
                                 std::span<const Tensor> xs) {
                   Tensor h = tanh(matmul(reshape(hs[0], {1, 3}), xs[0]));
                   return std::vector<Tensor>{reshape(h, {3}) * 1.5 + scalar(ib, F, 0.1)};
                 };
                 auto outer = [&](Builder& ob, std::span<const Tensor>, std::span<const Tensor> hs,
                                  std::span<const Tensor> xs) {
                   return scan(ob, 3, {}, hs, xs, inner, "layer");
                 };
                 return scan(b, 2, {}, std::array{h0}, std::array{ws}, outer, "group")[0];
               }});
  return c;
}

struct Built {
  Graph f;       // params..., weights -> loss
  std::vector<int> wrt;
};

Built build(const Case& c) {
  Built r;
  Builder b(r.f);
  Tensor y = c.build(b);
  for (size_t i = 0; i < r.f.params.size(); ++i) r.wrt.push_back(static_cast<int>(i));
  Tensor weights = b.param("loss_weights", y.type());
  IntList all(static_cast<size_t>(y.rank()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  b.result(reduce_sum(y * weights, all));
  verify(r.f);
  return r;
}

void collect_ops(const Graph& g, std::set<Op>& ops) {
  for (const Node& n : g.nodes) {
    ops.insert(n.op);
    if (n.body) collect_ops(*n.body, ops);
  }
}

class VjpFiniteDifference : public testing::TestWithParam<Case> {};

TEST_P(VjpFiniteDifference, MatchesCentralDifferences) {
  const Case& c = GetParam();
  Built built = build(c);
  rematerialize::Decider decider;  // each region's policy is its text here (parsed by the decider)
  Graph g = autodiff::grad_graph(built.f, built.wrt, &decider);
  verify(g);
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> dist(c.lo, c.hi);
  std::vector<exec::Array> args;
  for (ValueId v : built.f.params) {
    exec::Array a(built.f.type(v));
    for (int64_t i = 0; i < a.size(); ++i) a.set(i, dist(rng));
    args.push_back(a);
  }
  std::vector<exec::Array> out = exec::run(g, args);
  auto loss = [&](std::vector<exec::Array>& a) { return exec::run(built.f, a)[0].get(0); };
  for (size_t k = 0; k < built.wrt.size(); ++k) {
    const exec::Array& analytic = out[1 + k];
    for (int64_t i = 0; i < args[k].size(); ++i) {
      std::vector<exec::Array> plus = args, minus = args;
      plus[k] = args[k].clone();
      minus[k] = args[k].clone();
      plus[k].set(i, args[k].get(i) + c.eps);
      minus[k].set(i, args[k].get(i) - c.eps);
      double numeric = (loss(plus) - loss(minus)) / (2 * c.eps);
      EXPECT_NEAR(analytic.get(i), numeric, c.tol * (1 + std::abs(numeric)))
          << c.label << ": d/d" << built.f.param_names[k] << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, VjpFiniteDifference, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.label; });

TEST(VjpFiniteDifference, EveryOpHasACase) {
  std::set<Op> covered;
  for (const Case& c : cases()) collect_ops(build(c).f, covered);
  // Messages carry no cotangent (a pipeline stage sends its gradient as a message of its own): see below.
  for (const Op op : {Op::send, Op::send_done, Op::recv}) covered.insert(op);
  covered.insert(Op::adamw);  // the optimizer's update: differentiating through it is an error (below)
  covered.insert(Op::attention_grad);  // attention's VJP: checked by attention's cases
  covered.insert(Op::softmax_grad);    // softmax's VJP: checked by softmax's cases
  covered.insert(Op::log_softmax_grad);  // log_softmax's VJP: checked by log_softmax's cases
  covered.insert(Op::rms_norm_grad);  // rms_norm's VJP: checked by rms_norm's case
  covered.insert(Op::swiglu_grad);  // swiglu's VJP: checked by swiglu's case
  covered.insert(Op::target_log_prob_grad);  // target_log_prob's VJP: checked by its case
  covered.insert(Op::fusion);  // made after differentiation (ir::fuse): differentiating one is an error (below)
  covered.insert(Op::stop_gradient);  // its derivative is zero by definition, not by differences: below
  for (int i = 0; i < kNumOps; ++i)
    EXPECT_TRUE(covered.count(static_cast<Op>(i))) << "op " << op_name(static_cast<Op>(i))
                                                   << " has no finite-difference case";
}

// d/dx (x · stop_gradient(x)) is stop_gradient(x) = x, not the 2x finite differences of the function give.
TEST(VjpStopGradient, ItsOperandIsAConstantForTheBackward) {
  Graph f;
  Builder b(f);
  Tensor x = b.param("x", {DType::f64, {3}});
  b.result(reduce_sum(x * stop_gradient(x), {0}));
  const std::vector<int> wrt{0};
  Graph g = autodiff::grad_graph(f, wrt);
  std::vector<exec::Array> args{exec::Array(f.type(x.id))};
  for (int64_t i = 0; i < 3; ++i) args[0].set(i, 0.5 + static_cast<double>(i));
  const std::vector<exec::Array> out = exec::run(g, args);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(out[1].get(i), args[0].get(i)) << i;
}

TEST(VjpFusion, DifferentiatingAFusionIsAnErrorNamingItsScope) {
  Graph f = parse(
      "graph @f(%x: f32[3]) -> (f32[]) {\n"
      "  %0: f32[3] = fusion(%x) scope=\"mlp\"\n"
      "    graph @fused(%a: f32[3]) -> (f32[3]) {\n"
      "      %0: f32[3] = exp(%a)\n"
      "      %1: f32[3] = neg(%0)\n"
      "      return %1\n"
      "    }\n"
      "  %1: f32[] = reduce_sum(%0) {axes=[0]}\n"
      "  return %1\n"
      "}\n");
  const std::string e = testing_support::error_of([&] { autodiff::grad(f, f.results[0], std::array{f.params[0]}); });
  EXPECT_NE(e.find("cannot differentiate a fusion (scope 'mlp')"), std::string::npos) << e;
}

TEST(VjpMessages, DifferentiatingThroughASendIsAnErrorNamingItsScope) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {2}});
  Tensor sent;
  {
    auto s = b.scope("stage0/out");
    sent = send(x * 2.0, "stage", 2, 1, 0);
  }
  Tensor loss = reduce_sum(sent, {0});
  const std::string error = testing_support::error_of([&] { autodiff::grad(g, loss.id, std::array{x.id}); });
  EXPECT_NE(error.find("cannot differentiate through send (scope 'stage0/out')"), std::string::npos) << error;
}

TEST(VjpMessages, DifferentiatingThroughAdamwIsAnErrorNamingItsScope) {
  Graph g;
  Builder b(g);
  Tensor x = b.param("x", {DType::f32, {2}});
  Tensor one = scalar(b, DType::f32, 1.0);
  std::array<Tensor, 3> updated = [&] {
    auto s = b.scope("optimizer");
    return adamw(x, x, x, x, one, one, one, one, std::nullopt, {.b1 = 0.9, .b2 = 0.95, .eps = 1e-8, .weight_decay = 0});
  }();
  Tensor loss = reduce_sum(updated[0], {0});
  const std::string error = testing_support::error_of([&] { autodiff::grad(g, loss.id, std::array{x.id}); });
  EXPECT_NE(error.find("cannot differentiate through adamw (scope 'optimizer')"), std::string::npos) << error;
}

TEST(VjpMessages, AReceivedValueIsDifferentiatedLikeAParam) {
  // d/dr sum(r * w) = w for r = recv(..): the backward of a pipeline stage with respect to its received input.
  Graph g;
  Builder b(g);
  Tensor w = b.param("w", {DType::f32, {3}});
  Tensor r = recv(b, {DType::f32, {3}}, "stage", 2, 0, 0);
  Tensor y = r * w;
  Tensor dy = full(b, y.type(), 1.0);
  const std::pair<ValueId, ValueId> seed{y.id, dy.id};
  std::vector<ValueId> d = autodiff::vjp(g, std::span(&seed, 1), std::array{r.id, w.id});
  g.results = {d[0], d[1]};
  const std::string text = print(g);
  // dr = dy * w and dw = dy * r: both read the seed, neither is a zero fill.
  EXPECT_EQ(g.nodes[g.nodes.size() - 1].op, Op::mul) << text;
  EXPECT_EQ(g.nodes[g.nodes.size() - 2].op, Op::mul) << text;
}

}  // namespace
}  // namespace remat
