// partial_eval (src/autodiff/partial_eval.h) on the body of a scan and of a remat region, IR text in and IR
// text out: the forward body and the backward (as a graph over the seeds and the residuals it reads) are
// printed and checked against lines worked out by hand from each rule.
#include "autodiff/partial_eval.h"
#include "support/filecheck.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace remat::autodiff {
namespace {

using namespace ir;
using testing_support::filecheck;

// The body of the first node of `outer` (IR text) differentiated with every param differentiable and the
// params in `weights` parameter-derived, each result seeded (%seed<k>).
Joint joint_of_region(const Graph& outer, const std::vector<bool>& weights) {
  const Graph& body = *outer.nodes[0].body;
  std::vector<std::string> seeds;
  for (size_t k = 0; k < body.results.size(); ++k) seeds.push_back(fmt::format("seed{}", k));
  return differentiate({.body = body,
                        .seed_names = seeds,
                        .accumulators = {},
                        .parameter_derived = weights,
                        .differentiable = std::vector<bool>(body.params.size(), true),
                        .decider = nullptr,
                        .trip_count = 1});
}

// The forward body, then the backward: params are the seeds, then the residuals it reads (inputs under their
// own names, the others as saved<i>, offloaded<i>, alias<i> in the order decided), its results the params'
// cotangents.
std::string split_text(Joint& joint, const Graph& body, const ResidualRule& rule, Walk walk,
                       std::span<const ValueId> known) {
  std::vector<ValueId> needed;
  for (ValueId c : joint.cots)
    if (c >= 0) needed.push_back(c);
  Split split = partial_eval(joint, needed, known, rule, walk);
  std::string text = print(*forward_body(joint, split, body, "region"));
  Graph backward;
  backward.name = body.name + "_bwd";
  backward.types = joint.graph.types;
  for (ValueId seed : joint.seeds) {
    backward.param_names.push_back(fmt::format("seed{}", backward.params.size()));
    backward.params.push_back(seed);
  }
  std::map<ResidualKind, int> count;
  for (const Residual& r : split.residuals) {
    if (r.kind == ResidualKind::recompute) continue;  // defined by its clone
    auto p = std::find(joint.params.begin(), joint.params.end(), r.value);
    const char* kind = r.kind == ResidualKind::save ? "saved" : r.kind == ResidualKind::offload ? "offloaded" : "alias";
    backward.params.push_back(r.value);
    backward.param_names.push_back(r.kind == ResidualKind::available
                                       ? body.param_names[static_cast<size_t>(p - joint.params.begin())]
                                       : fmt::format("{}{}", kind, count[r.kind]++));
  }
  backward.nodes = std::move(split.backward);
  backward.results = needed;
  return text + print(backward);
}

// A scan's rule: consts and xs are read as they are, weight-derived values recomputed, the rest (carries and
// activations) stacked.
TEST(PartialEval, ScanBodyStacksActivationsAndRecomputesWeightDerivedValues) {
  const std::string text = R"(graph @outer(%w: f32[4,4], %h: f32[2,4], %xs: f32[3,2,4]) -> (f32[2,4]) {
  %0: f32[2,4] = scan(%w, %h, %xs) {length=3, num_consts=1, num_carry=1, reverse=false}
    graph @layer(%w0: f32[4,4], %h0: f32[2,4], %x0: f32[2,4]) -> (f32[2,4]) {
      %0: f32[4,4] = exp(%w0)
      %1: f32[2,4] = dot_general(%h0, %0) {contract=[[1],[0]], batch=[[],[]]}
      %2: f32[2,4] = add(%1, %x0)
      %3: f32[2,4] = tanh(%2)
      return %3
    }
  return %0
}
// The forward stacks tanh's output (read by tanh') and the carry entering the layer (read by dw), in the
// order the backward first reads them; exp(w) is not stacked.
// CHECK: graph @layer(%w0: f32[4,4], %h0: f32[2,4], %x0: f32[2,4]) -> (f32[2,4], f32[2,4], f32[2,4])
// CHECK: [[T:%[0-9]+]]: f32[2,4] = tanh(
// CHECK-NEXT: return [[T]], [[T]], %h0
// The backward reads the seed, the two stacked values and the const w0 (for exp(w0), recomputed first).
// CHECK: graph @layer_bwd(%seed0: f32[2,4], %saved0: f32[2,4], %w0: f32[4,4], %saved1: f32[2,4]) -> (f32[4,4], f32[2,4], f32[2,4])
// CHECK-NEXT: [[E:%[0-9]+]]: f32[4,4] = exp.remat(%w0)
// CHECK-NEXT: mul(%saved0, %saved0)
// CHECK-NOT: .remat
// CHECK: dot_general({{%[0-9]+}}, [[E]]) {contract=[[1],[1]], batch=[[],[]]}
// CHECK-NEXT: dot_general(%saved1, {{%[0-9]+}}) {contract=[[0],[0]], batch=[[],[]]}
// CHECK: return
)";
  const Graph outer = parse(text);
  const Graph& body = *outer.nodes[0].body;
  Joint joint = joint_of_region(outer, {true, false, false});
  auto rule = [&](const Candidate& c) {
    if (c.param == 0 || c.param == 2) return ResidualKind::available;
    const bool weight_derived = c.param < 0 && joint.parameter_derived[static_cast<size_t>(c.value)];
    return weight_derived ? ResidualKind::recompute : ResidualKind::save;
  };
  const std::string out = split_text(joint, body, rule, Walk::first_use, {});
  EXPECT_EQ(filecheck(text, out), "") << out;
}

// A policy's rule: checkpoint names say save ("proj") or offload ("act"), a name on an input is that input,
// the rest is recomputed; the region's output is known outside.
TEST(PartialEval, RematBodySavesOffloadsRecomputesAndAliasesAsTheRuleSays) {
  const std::string text = R"(graph @outer(%w: f32[4,4], %x: f32[2,4]) -> (f32[2,4]) {
  %0: f32[2,4] = remat(%w, %x) {policy="test"}
    graph @block(%w0: f32[4,4], %x0: f32[2,4]) -> (f32[2,4]) {
      %0: f32[2,4] = name(%x0) {name="input"}
      %1: f32[2,4] = dot_general(%0, %w0) {contract=[[1],[0]], batch=[[],[]]}
      %2: f32[2,4] = name(%1) {name="proj"}
      %3: f32[2,4] = tanh(%2)
      %4: f32[2,4] = name(%3) {name="act"}
      %5: f32[2,4] = mul(%4, %4)
      return %5
    }
  return %0
}
// The forward returns its output, the saved proj, then a host copy of act.
// CHECK: graph @block(%w0: f32[4,4], %x0: f32[2,4]) -> (f32[2,4], f32[2,4], f32[2,4])
// CHECK: [[P:%[0-9]+]]: f32[2,4] = name({{%[0-9]+}}) {name="proj"}
// CHECK: [[A:%[0-9]+]]: f32[2,4] = name({{%[0-9]+}}) {name="act"}
// CHECK: [[Y:%[0-9]+]]: f32[2,4] = mul([[A]], [[A]])
// CHECK-NEXT: [[H:%[0-9]+]]: f32[2,4] = offload([[A]]) scope="region"
// CHECK-NEXT: return [[Y]], [[P]], [[H]]
// Decided latest first (w0 as the backward first reads it): act, tanh (recomputed from the saved proj),
// proj, the input's name (x0 stands for it), x0.
// CHECK: graph @block_bwd(%seed0: f32[2,4], %w0: f32[4,4], %offloaded0: f32[2,4], %saved0: f32[2,4], %alias0: f32[2,4], %x0: f32[2,4]) -> (f32[4,4], f32[2,4])
// CHECK-NEXT: [[T:%[0-9]+]]: f32[2,4] = tanh.remat(%saved0)
// CHECK-NOT: .remat
// CHECK: mul(%seed0, %offloaded0)
// CHECK-NOT: .remat
// CHECK: dot_general(%alias0, {{%[0-9]+}})
// CHECK: return
)";
  const Graph outer = parse(text);
  const Graph& body = *outer.nodes[0].body;
  Joint joint = joint_of_region(outer, {true, false});
  auto rule = [&](const Candidate& c) {
    if (c.param >= 0) return ResidualKind::available;
    const Node& made_by = joint.graph.nodes[static_cast<size_t>(c.producer)];
    if (made_by.op != Op::name) return ResidualKind::recompute;
    const std::string& name = made_by.attrs.str("name");
    if (name == "input") return ResidualKind::alias;
    if (name == "proj") return ResidualKind::save;
    return name == "act" ? ResidualKind::offload : ResidualKind::recompute;
  };
  const std::string out = split_text(joint, body, rule, Walk::latest_first, joint.results);
  EXPECT_EQ(filecheck(text, out), "") << out;
}

}  // namespace
}  // namespace remat::autodiff
