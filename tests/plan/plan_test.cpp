// The memory plan: no two simultaneously live buffers overlap (property test over random graphs), the
// arena is at least the lower bound, arena execution is bit-identical to the free-at-last-use executor,
// and the measured peak of a real training step equals the planned peak, byte for byte.
#include "plan/plan.h"

#include "cli/config.h"
#include "exec/executable.h"
#include "remat/remat.h"
#include "support/models.h"
#include "support/reference_executor.h"
#include "support/step_args.h"
#include "compile/compile.h"
#include "train/step.h"

#include <gtest/gtest.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

#include <cmath>
#include <cstring>
#include <random>

namespace remat {
namespace {

void expect_no_overlap(const plan::Plan& p) {
  for (size_t a = 0; a < p.buffers.size(); ++a) {
    for (size_t b = a + 1; b < p.buffers.size(); ++b) {
      const plan::Buffer &x = p.buffers[a], &y = p.buffers[b];
      if (x.space != y.space || x.end < y.start || y.end < x.start) continue;
      ASSERT_TRUE(x.offset + x.bytes <= y.offset || y.offset + y.bytes <= x.offset)
          << "buffers " << a << " and " << b << " overlap in time and space";
    }
  }
  for (int sp = 0; sp < 2; ++sp) EXPECT_GE(p.arena[sp], p.lower_bound[sp]);
  for (const auto& [node, body] : p.bodies) expect_no_overlap(body);
}

// A random graph of elementwise ops, matmuls, reductions and reshapes over a few shapes.
ir::Graph random_graph(std::mt19937& rng) {
  ir::Graph g;
  ir::Builder b(g);
  std::vector<ir::Tensor> pool;
  std::uniform_int_distribution<int64_t> dim(1, 24);
  for (int i = 0; i < 3; ++i) pool.push_back(b.param(fmt::format("p{}", i), {DType::f32, {dim(rng), dim(rng)}}));
  std::uniform_int_distribution<int> op(0, 5);
  for (int i = 0; i < 40; ++i) {
    ir::Tensor x = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    ir::Tensor y = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    switch (op(rng)) {
      case 0: pool.push_back(ir::tanh(x)); break;
      case 1: pool.push_back(x * ir::broadcast_to(ir::reduce_sum(x, {0}), x.shape())); break;
      case 2: pool.push_back(ir::matmul(x, ir::transpose(x, {1, 0}))); break;
      case 3: pool.push_back(ir::reshape(x, {x.dim(1), x.dim(0)})); break;
      case 4: pool.push_back(x.shape() == y.shape() ? x + y : ir::exp(x)); break;
      default: pool.push_back(ir::concatenate(std::array{x, x}, 0)); break;
    }
  }
  for (size_t i = pool.size() - 3; i < pool.size(); ++i) b.result(pool[i]);
  ir::dce(g);
  return g;
}

bool same_bytes(const exec::Array& a, const exec::Array& b) {
  return a.type() == b.type() && std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())) == 0;
}

std::vector<exec::Array> random_args(const ir::Graph& g, std::mt19937& rng) {
  std::uniform_real_distribution<double> value(-1, 1);
  std::vector<exec::Array> args;
  for (ir::ValueId v : g.params) {
    args.emplace_back(g.type(v));
    for (int64_t i = 0; i < args.back().size(); ++i) args.back().set(i, value(rng));
  }
  return args;
}

// The arguments of a graph of two params: the first's elements sin(0.37 i), the second's cos(0.11 i).
std::vector<exec::Array> sin_cos_args(const ir::Graph& g) {
  std::vector<exec::Array> args;
  for (ir::ValueId v : g.params) args.emplace_back(g.type(v));
  for (int64_t i = 0; i < args[0].size(); ++i) args[0].set(i, std::sin(0.37 * static_cast<double>(i)));
  for (int64_t i = 0; i < args[1].size(); ++i) args[1].set(i, std::cos(0.11 * static_cast<double>(i)));
  return args;
}

std::vector<exec::Array> deep_copy(std::span<const exec::Array> v) {
  std::vector<exec::Array> out;
  for (const exec::Array& a : v) out.push_back(a.clone());
  return out;
}

// Runs the plan in one arena, with every buffer poisoned (NaN) outside its planned live range, and with
// each buffer in its own allocation: both bit-identical to the free-at-last-use reference executor. (Each
// run gets its own copy of the arguments: donated results overwrite them.)
void expect_planned_run_is_exact(const ir::Graph& g, const plan::Plan& p, std::span<const exec::Array> args,
                                 const std::string& what) {
  const std::vector<exec::Array> want = testing_support::reference_run(g, deep_copy(args));
  for (exec::Options o : {exec::Options{.poison = true, .separate_buffers = false},
                          exec::Options{.poison = true, .separate_buffers = true}}) {
    exec::Executable e(g, p, o);
    const std::vector<exec::Array>& got = e.run(deep_copy(args));
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_TRUE(same_bytes(got[i], want[i])) << what << ": result " << i << (o.separate_buffers ? ", separate buffers" : "");
  }
}

TEST(Plan, NoOverlapOnRandomGraphsAndTheirRunsAreExact) {
  std::mt19937 rng(123);
  for (int trial = 0; trial < 200; ++trial) {
    ir::Graph g = random_graph(rng);
    plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
    expect_no_overlap(p);
    // Every buffer fits in the arena.
    for (const plan::Buffer& x : p.buffers) EXPECT_LE(x.offset + x.bytes, p.arena[static_cast<int>(x.space)]);
    expect_planned_run_is_exact(g, p, random_args(g, rng), fmt::format("random graph {}\n{}", trial, ir::print(g)));
  }
}

// Kernel workspace is planned: a dot_general whose lhs must be copied into [batch, M, K] order (its
// contracting dim leads) gets a workspace buffer of at least that copy, live at its node's step only and
// counted in the lower bound; the planned run (poisoned; separate buffers under ASan, where a kernel
// writing past its workspace hits a redzone) matches the reference, and its measured peak is the plan's.
TEST(Plan, KernelWorkspaceIsABufferLiveAtItsNodeOnly) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("x", {DType::f32, {8, 4, 16}});  // [K, B, M]
  ir::Tensor w = b.param("w", {DType::f32, {4, 8, 5}});   // [B, K, N]
  ir::Tensor y = ir::dot_general(ir::tanh(x), w, {.lhs_contract = {0}, .rhs_contract = {1}, .lhs_batch = {1}, .rhs_batch = {0}});
  b.result(ir::exp(y));
  plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
  const int dot = 1;
  ASSERT_EQ(g.nodes[dot].op, ir::Op::dot_general);
  ASSERT_TRUE(p.workspace_buffer.contains(dot));
  const plan::Buffer& ws = p.buffers[static_cast<size_t>(p.workspace_buffer.at(dot))];
  EXPECT_GE(ws.bytes, 8 * 4 * 16 * 4) << "the lhs copy";
  EXPECT_EQ(ws.start, p.position[dot]);
  EXPECT_EQ(ws.end, p.position[dot]);
  const int64_t at_dot = 8 * 4 * 16 * 4 + 4 * 16 * 5 * 4 + ws.bytes;  // tanh(x), y and the workspace
  EXPECT_EQ(p.live[0][static_cast<size_t>(p.position[dot])], at_dot);
  EXPECT_EQ(p.lower_bound[0], at_dot);
  EXPECT_FALSE(plan::build(g).workspace_buffer.contains(dot)) << "no workspace unless the backend asks";
  std::mt19937 rng(7);
  std::vector<exec::Array> args = random_args(g, rng);
  expect_planned_run_is_exact(g, p, args, "dot with a copied operand");
  exec::Executable e(g, p);
  e.run(args);
  EXPECT_EQ(e.measured_peak(plan::Space::device), p.lower_bound[0]);
}

// The poison check can fail: a plan that ends a buffer one step before its last read (so a later value may
// take its bytes) computes with NaNs.
TEST(Plan, PoisonShowsABufferEndedBeforeItsLastRead) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("x", {DType::f32, {64}});
  ir::Tensor t = ir::tanh(x);               // read again at the end
  b.result(ir::exp(ir::exp(t)) + t);
  plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
  const size_t buffer = static_cast<size_t>(p.buffer_of[static_cast<size_t>(t.id)]);
  ASSERT_EQ(p.buffers[buffer].end, 3);
  std::mt19937 rng(1);
  std::vector<exec::Array> args = random_args(g, rng);
  const exec::Array want = testing_support::reference_run(g, args)[0];
  EXPECT_TRUE(same_bytes(exec::Executable(g, p, {.poison = true}).run(args)[0], want));
  p.buffers[buffer].end = 2;
  exec::Executable wrong(g, p, {.poison = true, .separate_buffers = true});
  EXPECT_TRUE(std::isnan(wrong.run(args)[0].get(0)));
}

struct Step {
  ir::Graph graph;
  std::vector<exec::Array> args;
  std::vector<std::pair<int, int>> donate;
  ir::Signature signature;
  int64_t offloaded_bytes = 0;  // per step, from the decider's records: what the host arena must hold
};

// A training step (with AdamW) of a small model, its arguments, and the donation pairs.
Step training_step(const std::string& policy, int64_t k = 1) {
  nn::ModelConfig c = testing_support::small_model(2, true, policy);
  train::OptimizerConfig o;
  Step s;
  rematerialize::Decider decider;
  train::Program program = train::step_program(c, {2, 16, k}, o, &decider);
  s.graph = std::move(program.graph);
  s.donate = program.signature.updates();
  s.signature = program.signature;
  for (const rematerialize::ResidualRecord& r : decider.records())
    if (r.residency == rematerialize::Residency::offload) s.offloaded_bytes += r.type.bytes() * r.trip_count;
  ir::inline_remat_regions(s.graph);
  std::vector<exec::Array> params = nn::init_params(c, 4);
  s.args = params;
  for (int rep = 0; rep < 2; ++rep)
    for (const exec::Array& p : params) s.args.push_back(exec::Array::zeros(p.type()));
  s.args.push_back(exec::Array::from<int32_t>({}, {3}));
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, 255);
  std::vector<int32_t> t(static_cast<size_t>(k * 2 * 16));
  for (int rep = 0; rep < 2; ++rep) {
    for (auto& x : t) x = tok(rng);
    s.args.push_back(exec::Array::from<int32_t>({k, 2, 16}, t));
  }
  return s;
}


class PlannedStep : public testing::TestWithParam<std::string> {};

TEST_P(PlannedStep, ArenaRunIsBitIdenticalAndPeakIsAsPlanned) {
  Step s = training_step(GetParam());
  std::vector<exec::Array> want = testing_support::reference_run(s.graph, s.args);
  plan::Plan p = plan::build(s.graph, {.donate = s.donate, .workspace = exec::workspace_of(exec::cpu())});
  expect_no_overlap(p);
  int donated = 0;
  for (int d : p.donated_param) donated += d >= 0;
  EXPECT_EQ(donated, static_cast<int>(s.donate.size())) << "every updated parameter and moment is written in place";
  expect_planned_run_is_exact(s.graph, p, deep_copy(s.args), GetParam());
  exec::Executable step(s.graph, p);
  for (int run = 0; run < 2; ++run) {  // twice: the second run reuses the arena
    std::vector<exec::Array> args = deep_copy(s.args);
    std::vector<exec::Array> got = step.run(args);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::memcmp(got[i].bytes(), want[i].bytes(), static_cast<size_t>(want[i].type().bytes())), 0)
          << GetParam() << ": result " << i;
    EXPECT_EQ(step.measured_peak(plan::Space::device), p.lower_bound[0]) << "planned peak = measured peak";
    EXPECT_EQ(step.measured_peak(plan::Space::host), p.lower_bound[1]);
  }
  // Every offloaded residual of every layer is in host memory at once (between forward and backward), and
  // nothing more: each iteration's offload writes its layer's straight into its slice of the stacked host
  // output (plan::kInSlice), so there is no host sub-arena. Counted from the decider's records.
  EXPECT_EQ(p.lower_bound[1], s.offloaded_bytes) << GetParam();
  if (GetParam() == "minimal_offloaded") {
    EXPECT_GT(s.offloaded_bytes, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, PlannedStep, testing::Values("full", "minimal", "everything_saveable", "minimal_offloaded"));

// Three chained steps through donated buffers: the executable writes params', m', v' into the argument
// buffers and the next step reads them there; the reference executor's results are fed back by hand. Loss,
// gradient norm and every parameter and moment agree bit for bit after each step.
TEST(PlannedStep, ChainedStepsThroughDonatedBuffersMatchTheReference) {
  Step s = training_step("minimal");
  const size_t step_arg = static_cast<size_t>(s.signature.arg("step"));
  exec::Executable planned(s.graph, plan::build(s.graph, {.donate = s.donate, .workspace = exec::workspace_of(exec::cpu())}));
  std::vector<exec::Array> mine = deep_copy(s.args), ref = deep_copy(s.args);
  for (int k = 0; k < 3; ++k) {
    const std::vector<exec::Array> want = testing_support::reference_run(s.graph, ref);
    const std::vector<exec::Array>& got = planned.run(mine);
    for (const char* metric : {"loss", "grad_norm", "lr"}) {
      const size_t r = static_cast<size_t>(s.signature.result(metric));
      ASSERT_TRUE(same_bytes(got[r], want[r])) << "step " << k << ", " << metric;
    }
    for (auto [r, i] : s.donate) {
      ref[static_cast<size_t>(i)] = want[static_cast<size_t>(r)];
      ASSERT_TRUE(same_bytes(mine[static_cast<size_t>(i)], ref[static_cast<size_t>(i)])) << "step " << k << ": " << s.signature.args[static_cast<size_t>(i)].name << " after the step";
    }
    for (std::vector<exec::Array>* a : {&mine, &ref}) (*a)[step_arg] = exec::Array::from<int32_t>({}, {4 + k});
  }
}

// The same on the real `tiny` training step (configs/, batch 16 x 128, AdamW), for the three policies
// for bf16 compute with either cast placement, with the output layer and loss tiled (num_vocab_tiling), and
// in groups (offloading layers; a group policy keeping named values of every layer across groups).
class TinyStep : public testing::TestWithParam<std::vector<std::string>> {};

TEST_P(TinyStep, MeasuredPeakIsThePlannedPeakByteForByte) {
  std::vector<std::string> overrides = GetParam();
  // The sanitizer build runs the reference kernels ~10x slower: 512 tokens there instead of 2048, every value
  // still over the kernels' parallel thresholds.
  if (exec::kAddressSanitizer) overrides.push_back("per_device_batch_size=4");
  cli::Config c = cli::load_config(std::string(REMAT_TEST_DATA) + "/../configs/base.yml", overrides);
  compile::Compiled s = compile::compile({.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer});
  ir::Graph& g = s.program;
  plan::Plan& p = s.plan;
  // By the signature: initial parameters, zero moments and step, tokens.
  std::vector<exec::Array> args = testing_support::step_args(s, c.run.model);
  std::vector<exec::Array> want = testing_support::reference_run(g, deep_copy(args));
  expect_planned_run_is_exact(g, p, args, fmt::format("{}", fmt::join(GetParam(), " ")));
  exec::Executable step(g, p);
  std::vector<exec::Array> got = step.run(args);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(got[i].bytes(), want[i].bytes(), static_cast<size_t>(want[i].type().bytes())), 0) << i;
  EXPECT_EQ(step.measured_peak(plan::Space::device), p.lower_bound[0]);
  EXPECT_GE(p.arena[0], p.lower_bound[0]);
  std::printf("tiny %s: planned peak %lld B, measured %lld B, arena %lld B\n", fmt::format("{}", fmt::join(GetParam(), " ")).c_str(),
              static_cast<long long>(p.lower_bound[0]), static_cast<long long>(step.measured_peak(plan::Space::device)),
              static_cast<long long>(p.arena[0]));
}

INSTANTIATE_TEST_SUITE_P(Policies, TinyStep,
                         testing::Values(std::vector<std::string>{"remat_policy=full"},
                                         std::vector<std::string>{"remat_policy=minimal"},
                                         std::vector<std::string>{"remat_policy=everything_saveable"},
                                         std::vector<std::string>{"dtype=bfloat16"},
                                         std::vector<std::string>{"dtype=bfloat16", "mp_cast=upfront"},
                                         std::vector<std::string>{"dtype=bfloat16", "num_vocab_tiling=8"},
                                         std::vector<std::string>{"layers_per_group=2", "remat_policy=minimal_offloaded"},
                                         std::vector<std::string>{"layers_per_group=2", "group_remat_policy=minimal"}));

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// A result may be written into a param's buffer only if nothing still reads the param: not the defining
// node through an alias (a matmul reading name(w) cannot write into w), and not a second result.
TEST(Plan, DonationRefusedWhileTheParamIsReadThroughAnAlias) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor w = b.param("w", {DType::f32, {8, 8}});
  b.result(ir::matmul(ir::checkpoint_name(w, "w"), w));
  plan::Plan p = plan::build(g, {.donate = {{0, 0}}});
  EXPECT_EQ(p.donated_param[0], -1);
  ir::Graph h;
  ir::Builder hb(h);
  ir::Tensor x = hb.param("x", {DType::f32, {4}});
  hb.result(ir::exp(x));
  hb.result(ir::tanh(x));
  plan::Plan q = plan::build(h, {.donate = {{0, 0}, {1, 0}}});
  EXPECT_EQ(q.donated_param[0] + q.donated_param[1], -1) << "one of the two results gets the buffer";
  EXPECT_THROW(plan::build(h, {.donate = {{2, 0}}}), Error);
}

// A convert_group's outputs share one buffer, at 64-byte aligned offsets inside it, live from the group's
// step to the last read of any member; the executable writes each member where the plan says.
TEST(Plan, ConvertGroupIsOneBufferLiveUntilItsLastMemberIsRead) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor x = b.param("x", {DType::f32, {40}});
  ir::Tensor y = b.param("y", {DType::f32, {40}});
  std::vector<ir::Tensor> xy{x, y};
  std::vector<ir::Tensor> cast = ir::convert_group(xy, DType::bf16);  // 80 B each, 128 B aligned
  ir::Tensor first = ir::tanh(cast[0]);                                // step 1: last read of cast[0]
  ir::Tensor second = ir::exp(first) + cast[1];                        // steps 2, 3: cast[1] read at 3
  b.result(ir::convert(second, DType::f32));
  plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
  const int buffer = p.buffer_of[static_cast<size_t>(cast[0].id)];
  ASSERT_GE(buffer, 0);
  EXPECT_EQ(p.buffer_of[static_cast<size_t>(cast[1].id)], buffer);
  EXPECT_EQ(p.within[static_cast<size_t>(cast[0].id)], 0);
  EXPECT_EQ(p.within[static_cast<size_t>(cast[1].id)], 128);
  const plan::Buffer& group = p.buffers[static_cast<size_t>(buffer)];
  EXPECT_EQ(group.bytes, 256);
  EXPECT_EQ(group.start, 0);
  EXPECT_EQ(group.end, 3);
  expect_no_overlap(p);
  std::vector<exec::Array> args;
  for (int k = 0; k < 2; ++k) {
    exec::Array a({DType::f32, {40}});
    for (int64_t i = 0; i < 40; ++i) a.set(i, 0.05 * static_cast<double>(i) - k);
    args.push_back(a);
  }
  exec::Executable e(g, p);
  exec::Array got = e.run(args)[0], want = testing_support::reference_run(g, args)[0];
  EXPECT_EQ(std::memcmp(got.bytes(), want.bytes(), 160), 0);
  EXPECT_EQ(e.measured_peak(plan::Space::device), p.lower_bound[0]);
}

// A result written over its dying operand that is also a scan body's stacked result (a y): the operand is made in
// the y's slice of the stacked output (Plan::in_slice), and so is the result written over it.
TEST(Plan, AResultWrittenInPlaceAndStackedByItsScanIsMadeInItsSlice) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor s = b.param("s", {DType::f32, {3, 6, 37}}), dp = b.param("dp", {DType::f32, {6, 37}});
  ir::Tensor c = b.param("c", {DType::f32, {2}});
  auto body = [](ir::Builder&, std::span<const ir::Tensor> consts, std::span<const ir::Tensor> carries,
                 std::span<const ir::Tensor> xs) {
    ir::Tensor x = ir::tanh(xs[0]) * 4.0f;  // a temporary, read only by softmax_grad
    return std::vector<ir::Tensor>{carries[0] * 0.5f, ir::softmax_grad(x, consts[0])};
  };
  for (ir::Tensor r : ir::scan(b, 3, std::array{dp}, std::array{c}, std::array{s}, body)) b.result(r);
  const plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
  const ir::Graph& scanned = *g.nodes.back().body;
  const plan::Plan& inner = p.bodies.begin()->second;
  const auto grad = std::find_if(scanned.nodes.begin(), scanned.nodes.end(),
                                 [](const ir::Node& n) { return n.op == ir::Op::softmax_grad; });
  ASSERT_NE(grad, scanned.nodes.end());
  const ir::ValueId x = grad->inputs[0], dx = grad->outputs[0];
  EXPECT_EQ(inner.root[static_cast<size_t>(dx)], inner.root[static_cast<size_t>(x)]) << "written over x";
  EXPECT_EQ(inner.buffer_of[static_cast<size_t>(x)], plan::kInSlice) << "x made in the y's slice";
  std::vector<exec::Array> args = sin_cos_args(g);
  expect_planned_run_is_exact(g, p, args, "in place, in its slice");
}

// A body node whose every result is a stacked result (made in its slice: no arena bytes) runs as soon as its
// operands are made, wherever the body lists it: here a layer's bf16 value widened into an f32 stack, listed
// after a chain of carry work, runs right after the value is made, whose buffer then ends there.
TEST(Plan, AStackedResultIsMadeAsSoonAsItsOperandsAre) {
  ir::Graph g;
  ir::Builder b(g);
  ir::Tensor s = b.param("s", {DType::f32, {3, 512}}), c = b.param("c", {DType::f32, {512}});
  auto body = [](ir::Builder&, std::span<const ir::Tensor>, std::span<const ir::Tensor> carries,
                 std::span<const ir::Tensor> xs) {
    ir::Tensor narrow = ir::convert(ir::tanh(xs[0]), DType::bf16);
    ir::Tensor carry = carries[0];
    for (int k = 0; k < 4; ++k) carry = ir::exp(carry * 0.25f);  // temporaries while narrow waits
    return std::vector<ir::Tensor>{carry, ir::convert(narrow, DType::f32)};
  };
  for (ir::Tensor r : ir::scan(b, 3, std::span<const ir::Tensor>{}, std::array{c}, std::array{s}, body)) b.result(r);
  const plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
  const ir::Graph& scanned = *g.nodes.back().body;
  const plan::Plan& inner = p.bodies.begin()->second;
  const auto made = [&](ir::ValueId v) {
    for (size_t i = 0; i < scanned.nodes.size(); ++i)
      if (scanned.nodes[i].outputs[0] == v) return inner.position[i];
    return -1;
  };
  const ir::ValueId widened = scanned.results[1];
  const ir::ValueId narrow = scanned.nodes[static_cast<size_t>(std::find_if(scanned.nodes.begin(), scanned.nodes.end(), [&](const ir::Node& n) {
                                                return n.outputs[0] == widened;
                                              }) - scanned.nodes.begin())].inputs[0];
  EXPECT_EQ(made(widened), made(narrow) + 1) << "widened right after the narrow value is made";
  EXPECT_EQ(inner.buffer_of[static_cast<size_t>(widened)], plan::kInSlice);
  EXPECT_EQ(inner.buffers[static_cast<size_t>(inner.buffer_of[static_cast<size_t>(narrow)])].end, made(widened));
  expect_no_overlap(inner);
  std::vector<exec::Array> args = sin_cos_args(g);
  expect_planned_run_is_exact(g, p, args, "a stacked result made early");
}

// A scan's final carry takes its initial value's storage when that value dies at the scan (the loop updates the
// carry there, skipping the first copy): one buffer fewer. Not when the scan also reads that value as a const,
// which every iteration reads whole.
TEST(Plan, AScanCarriesInTheStorageOfItsDyingInitialValue) {
  for (bool also_const : {false, true}) {
    ir::Graph g;
    ir::Builder b(g);
    ir::Tensor s = b.param("s", {DType::f32, {3, 512}}), c = b.param("c", {DType::f32, {512}});
    ir::Tensor init = ir::tanh(c) * 2.0f;  // a temporary of the plan
    auto body = [](ir::Builder&, std::span<const ir::Tensor> consts, std::span<const ir::Tensor> carries,
                   std::span<const ir::Tensor> xs) {
      ir::Tensor next = ir::exp(carries[0] * 0.25f) + xs[0];
      return std::vector<ir::Tensor>{consts.empty() ? next : next * consts[0], carries[0] * 0.5f};
    };
    const std::vector<ir::Tensor> consts = also_const ? std::vector<ir::Tensor>{init} : std::vector<ir::Tensor>{};
    const std::vector<ir::Tensor> out = ir::scan(b, 3, consts, std::array{init}, std::array{s}, body);
    for (ir::Tensor r : out) b.result(ir::exp(r));
    const plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
    EXPECT_EQ(p.buffer_of[static_cast<size_t>(out[0].id)] == p.buffer_of[static_cast<size_t>(init.id)], !also_const)
        << (also_const ? "the initial carry is a const too" : "the initial carry dies at the scan");
    expect_no_overlap(p);
    std::vector<exec::Array> args = sin_cos_args(g);
    expect_planned_run_is_exact(g, p, args, also_const ? "a const too" : "carried in place");
  }
}

// softmax_grad writes its result over x when nothing reads x afterwards (ir::in_place_operand): one buffer, live
// from x's definition to dx's last read, and the run equals the reference executor's (every value its own
// allocation) bit for bit. When x is read later, or is an argument, dx gets a buffer of its own.
TEST(Plan, SoftmaxGradWritesOverItsDyingInput) {
  for (bool x_read_later : {false, true}) {
    ir::Graph g;
    ir::Builder b(g);
    ir::Tensor s = b.param("s", {DType::f32, {6, 37}}), dp = b.param("dp", {DType::bf16, {6, 37}});
    ir::Tensor x = ir::tanh(s) * 4.0f;  // a temporary of the plan
    ir::Tensor dx = ir::softmax_grad(x, dp);
    ir::Tensor y = ir::exp(dx);
    b.result(x_read_later ? y + x : y);
    plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
    const int bx = p.buffer_of[static_cast<size_t>(x.id)], bdx = p.buffer_of[static_cast<size_t>(dx.id)];
    ASSERT_GE(bx, 0);
    ASSERT_GE(bdx, 0);
    EXPECT_EQ(bx == bdx, !x_read_later) << (x_read_later ? "x is read after softmax_grad" : "x dies at softmax_grad");
    if (!x_read_later) {  // the buffer lives on to dx's last read: exp's step
      const auto exp_node = std::find_if(g.nodes.begin(), g.nodes.end(), [](const ir::Node& n) { return n.op == ir::Op::exp; });
      EXPECT_EQ(p.buffers[static_cast<size_t>(bx)].end, p.position[static_cast<size_t>(exp_node - g.nodes.begin())]);
    }
    expect_no_overlap(p);
    std::vector<exec::Array> args = sin_cos_args(g);
    expect_planned_run_is_exact(g, p, args, x_read_later ? "x read later" : "in place");
    exec::Executable e(g, p);
    e.run(args);
    EXPECT_EQ(e.measured_peak(plan::Space::device), p.lower_bound[0]);
  }
  {  // a dx nobody reads (plan::build plans graphs as they are, before DCE): x's buffer still lives at its step
    ir::Graph g;
    ir::Builder b(g);
    ir::Tensor x = ir::exp(b.param("s", {DType::f32, {3, 4}}));
    ir::softmax_grad(x, b.param("g", {DType::f32, {3, 4}}));
    b.result(ir::tanh(b.param("t", {DType::f32, {2}})));
    plan::Plan p = plan::build(g);
    const plan::Buffer& shared = p.buffers[static_cast<size_t>(p.buffer_of[static_cast<size_t>(x.id)])];
    EXPECT_EQ(shared.end, p.position[1]) << "softmax_grad (node 1) writes into it";
  }
  ir::Graph h;  // x an argument: never overwritten
  ir::Builder hb(h);
  ir::Tensor x = hb.param("x", {DType::f32, {2, 5}});
  hb.result(ir::softmax_grad(x, hb.param("g", {DType::f32, {2, 5}})));
  plan::Plan q = plan::build(h);
  EXPECT_GE(q.buffer_of[static_cast<size_t>(h.results[0])], 0);
}

// scatter_add writes over its dying operand (the embedding's gradient: a table of zeros, each token's row of the
// cotangent added to its row): one buffer, and the planned run (poisoned, and with separate buffers) equals the
// reference executor's bit for bit, rows added more than once included. Read afterwards, the operand keeps its own.
TEST(Plan, ScatterAddWritesOverItsDyingOperand) {
  for (bool operand_read_later : {false, true}) {
    ir::Graph g;
    ir::Builder b(g);
    ir::Tensor s = b.param("s", {DType::f32, {5, 3}}), updates = b.param("updates", {DType::f32, {6, 3}});
    ir::Tensor rows = b.param("rows", {DType::i32, {6}});
    ir::Tensor table = ir::tanh(s) * 2.0f;  // a temporary of the plan
    ir::Tensor sum = ir::scatter_add(table, rows, updates);
    b.result(operand_read_later ? ir::exp(sum) + table : ir::exp(sum));
    const plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
    const int bt = p.buffer_of[static_cast<size_t>(table.id)], bs = p.buffer_of[static_cast<size_t>(sum.id)];
    ASSERT_GE(bt, 0);
    EXPECT_EQ(bt == bs, !operand_read_later) << (operand_read_later ? "read after scatter_add" : "dies at scatter_add");
    expect_no_overlap(p);
    std::vector<exec::Array> args = sin_cos_args(g);
    for (int64_t i = 0; i < 6; ++i) args[2].set(i, static_cast<double>((3 * i + 1) % 5));  // rows 1, 4, 2, 0, 3, 1
    expect_planned_run_is_exact(g, p, args, operand_read_later ? "operand read later" : "in place");
  }
}

// log_softmax writes over its dying input and log_softmax_grad over its dying y: the loss's chain x -> y -> dx
// takes one buffer (also in bf16, and with y as its own cotangent), and the planned run equals the reference
// executor (separate buffers) bit for bit. x or y read later keeps its own buffer.
TEST(Plan, LogSoftmaxAndItsGradWriteOverTheirDyingOperands) {
  enum Case { chain, chain_bf16, y_as_cotangent, x_read_later, y_read_later };
  for (Case c : {chain, chain_bf16, y_as_cotangent, x_read_later, y_read_later}) {
    const DType dt = c == chain_bf16 ? DType::bf16 : DType::f32;
    ir::Graph g;
    ir::Builder b(g);
    ir::Tensor s = b.param("s", {dt, {6, 37}}), dy = b.param("dy", {dt, {6, 37}});
    ir::Tensor x = ir::tanh(s) * 4.0f;  // a temporary of the plan
    ir::Tensor y = ir::log_softmax(x);
    ir::Tensor dx = ir::log_softmax_grad(y, c == y_as_cotangent ? y : dy);
    ir::Tensor r = ir::exp(dx);
    b.result(c == x_read_later ? r + x : c == y_read_later ? r + y : r);
    plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
    const int bx = p.buffer_of[static_cast<size_t>(x.id)], by = p.buffer_of[static_cast<size_t>(y.id)];
    ASSERT_GE(bx, 0);
    EXPECT_EQ(by == bx, c != x_read_later) << c;
    EXPECT_EQ(p.buffer_of[static_cast<size_t>(dx.id)] == by, c != y_read_later) << c;
    expect_no_overlap(p);
    std::vector<exec::Array> args = sin_cos_args(g);
    expect_planned_run_is_exact(g, p, args, fmt::format("case {}", static_cast<int>(c)));
  }
}

// A convert_group member that is a donated result goes into its argument's buffer, not the group's.
TEST(Plan, DonatedConvertGroupMemberIsWrittenIntoItsArgument) {
  ir::Graph g;
  ir::Builder b(g);
  b.param("w", {DType::bf16, {16}});
  ir::Tensor x = b.param("x", {DType::f32, {16}});
  std::vector<ir::Tensor> xs{x, x};
  std::vector<ir::Tensor> cast = ir::convert_group(xs, DType::bf16);
  b.result(ir::tanh(cast[0]));
  b.result(cast[1]);  // may be written into w: nothing reads w
  plan::Plan p = plan::build(g, {.donate = {{1, 0}}, .workspace = exec::workspace_of(exec::cpu())});
  EXPECT_EQ(p.donated_param[1], 0);
  EXPECT_EQ(p.buffer_of[static_cast<size_t>(cast[1].id)], -1);
  const int group = p.buffer_of[static_cast<size_t>(cast[0].id)];
  ASSERT_GE(group, 0);
  EXPECT_EQ(p.buffers[static_cast<size_t>(group)].bytes, 64);
  std::vector<exec::Array> args{exec::Array::zeros({DType::bf16, {16}}), exec::Array::zeros({DType::f32, {16}})};
  for (int64_t i = 0; i < 16; ++i) args[1].set(i, 0.25 * static_cast<double>(i));
  std::vector<exec::Array> want = testing_support::reference_run(g, args);
  exec::Executable e(g, p);
  std::vector<exec::Array> got = e.run(args);
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(std::memcmp(got[r].bytes(), want[r].bytes(), 32), 0) << r;
  EXPECT_EQ(std::memcmp(args[0].bytes(), want[1].bytes(), 32), 0) << "the donated member is in w's buffer";
}

#ifdef __SANITIZE_ADDRESS__
// In ASan builds each planned buffer is its own allocation of its exact size: the byte after a value is a
// redzone, so a kernel writing past a buffer's end is reported instead of landing in a neighbour.
TEST(Plan, EachBufferEndsInARedzoneUnderAddressSanitizer) {
  ir::Graph g;
  ir::Builder b(g);
  b.result(ir::exp(ir::tanh(b.param("x", {DType::f32, {5}}))));
  exec::Executable e(g, plan::build(g, {.workspace = exec::workspace_of(exec::cpu())}));
  std::vector<exec::Array> args{exec::Array::zeros({DType::f32, {5}})};
  const exec::Array& r = e.run(args)[0];
  EXPECT_EQ(__asan_address_is_poisoned(r.bytes() + 19), 0);
  EXPECT_NE(__asan_address_is_poisoned(r.bytes() + 20), 0);
}
#endif

TEST(Plan, ResultsOutliveTheExecutable) {
  exec::Array planned, plain;
  {
    ir::Graph g;
    ir::Builder b(g);
    b.result(ir::reshape(ir::tanh(b.param("x", {DType::f32, {2, 3}})), {3, 2}));
    exec::Executable e(g, plan::build(g, {.workspace = exec::workspace_of(exec::cpu())}));
    std::vector<exec::Array> args{exec::Array::from<float>({2, 3}, {0.5f, -1, 2, 0.25f, -3, 1})};
    planned = e.run(args)[0];
    plain = testing_support::reference_run(g, args)[0];
  }
  for (const exec::Array* a : {&planned, &plain}) {  // the graph is gone; each result owns its type
    EXPECT_EQ(ir::type_str(a->type()), "f32[3,2]");
    const float in[] = {0.5f, -1, 2, 0.25f, -3, 1};
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(a->get(i), static_cast<double>(std::tanh(in[i]))) << i;
  }
}

}  // namespace
}  // namespace remat
