// ir::instantiate: a template's node ranges copied into another graph, IR text in and out, with the origins
// (not printed) checked as the relation they keep: a recompute copy shares its forward op's, instances differ.
#include "ir/ir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

namespace remat::ir {
namespace {

// A forward (two nodes, the second a scan) and a backward reading it: a recompute of the first, then a use.
const char* kTemplate =
    "graph @chunk(%x: f32[2], %w: f32[2]) -> (f32[2]) {\n"
    "  %0: f32[2] = mul(%x, %w) scope=\"layer\"\n"
    "  %1: f32[2] = scan(%0) {length=1, num_consts=0, num_carry=1, reverse=false} scope=\"layer\"\n"
    "    graph @body(%h: f32[2]) -> (f32[2]) {\n"
    "      %0: f32[2] = tanh(%h) scope=\"layer/inner\"\n"
    "      return %0\n"
    "    }\n"
    "  %2: f32[2] = mul.remat(%x, %w) scope=\"layer\"\n"
    "  %3: f32[2] = add(%2, %1)\n"
    "  return %3\n"
    "}\n";

struct Instantiated {
  Graph g;
  std::vector<Instance> instances;
};

// Two instances of kTemplate in one graph, under scopes mb0 and mb1: each forward, then each backward.
Instantiated two_instances(const Graph& t, bool keep_first) {
  Instantiated r;
  r.g.name = "rank";
  Builder b(r.g);
  const Tensor w = b.param("w", {DType::f32, {2}});
  r.instances.resize(2);
  r.instances[0].keep_origins = keep_first;
  for (int phase = 0; phase < 2; ++phase)
    for (size_t k = 0; k < 2; ++k) {
      Instance& in = r.instances[k];
      auto scope = b.scope(fmt::format("mb{}", k));
      if (phase == 0) {
        in.values.emplace(t.params[0], b.param(fmt::format("x{}", k), {DType::f32, {2}}));
        in.values.emplace(t.params[1], w);
        instantiate(b, t, 0, 2, in);
      } else {
        in.keep_origins = false;
        instantiate(b, t, 2, 4, in);
        b.result(in.values.at(t.results[0]));
      }
    }
  return r;
}

TEST(Instantiate, CopiesRangesUnderTheCurrentScopeWithFreshValues) {
  Graph t = parse(kTemplate);
  t.nodes[2].origin = t.nodes[0].origin;  // the recompute of %0, as autodiff makes it
  const Instantiated r = two_instances(t, false);
  verify(r.g);
  EXPECT_EQ(print(r.g),
            "graph @rank(%w: f32[2], %x0: f32[2], %x1: f32[2]) -> (f32[2], f32[2]) {\n"
            "  %0: f32[2] = mul(%x0, %w) scope=\"mb0/layer\"\n"
            "  %1: f32[2] = scan(%0) {length=1, num_consts=0, num_carry=1, reverse=false} scope=\"mb0/layer\"\n"
            "    graph @body(%h: f32[2]) -> (f32[2]) {\n"
            "      %0: f32[2] = tanh(%h) scope=\"mb0/layer/inner\"\n"
            "      return %0\n"
            "    }\n"
            "  %2: f32[2] = mul(%x1, %w) scope=\"mb1/layer\"\n"
            "  %3: f32[2] = scan(%2) {length=1, num_consts=0, num_carry=1, reverse=false} scope=\"mb1/layer\"\n"
            "    graph @body(%h: f32[2]) -> (f32[2]) {\n"
            "      %0: f32[2] = tanh(%h) scope=\"mb1/layer/inner\"\n"
            "      return %0\n"
            "    }\n"
            "  %4: f32[2] = mul.remat(%x0, %w) scope=\"mb0/layer\"\n"
            "  %5: f32[2] = add(%4, %1) scope=\"mb0\"\n"
            "  %6: f32[2] = mul.remat(%x1, %w) scope=\"mb1/layer\"\n"
            "  %7: f32[2] = add(%6, %3) scope=\"mb1\"\n"
            "  return %5, %7\n"
            "}\n");
}

TEST(Instantiate, EachInstanceHasItsOwnOriginsAndARecomputeSharesItsOpsOne) {
  Graph t = parse(kTemplate);
  t.nodes[2].origin = t.nodes[0].origin;
  const Instantiated r = two_instances(t, false);
  const std::vector<Node>& n = r.g.nodes;  // mb0: 0 1, mb1: 2 3, backward mb0: 4 5, mb1: 6 7
  EXPECT_EQ(n[4].origin, n[0].origin);
  EXPECT_EQ(n[6].origin, n[2].origin);
  std::set<uint64_t> distinct;
  for (size_t i : {0, 1, 2, 3, 5, 7}) distinct.insert(n[i].origin);
  distinct.insert(n[1].body->nodes[0].origin);
  distinct.insert(n[3].body->nodes[0].origin);
  distinct.insert(t.nodes[0].origin);
  distinct.insert(t.nodes[3].origin);
  EXPECT_EQ(distinct.size(), 10u);  // every op of each instance new, none the template's
  // An instance that keeps origins (traced where the template was) keeps its forward's; its backward's ops
  // (keep_origins reset) are new even so.
  const Instantiated kept = two_instances(t, true);
  EXPECT_EQ(kept.g.nodes[0].origin, t.nodes[0].origin);
  EXPECT_EQ(kept.g.nodes[1].body->nodes[0].origin, t.nodes[1].body->nodes[0].origin);
  EXPECT_EQ(kept.g.nodes[4].origin, t.nodes[0].origin);
  EXPECT_NE(kept.g.nodes[5].origin, t.nodes[3].origin);
  EXPECT_NE(kept.g.nodes[2].origin, t.nodes[0].origin);
}


// Copies of one template are one computation (what the planner plans once); a changed attribute, operand or
// body op is another.
TEST(Instantiate, CopiesAreOneComputationAndChangesAreNot) {
  Graph t = parse(kTemplate);
  const Instantiated r = two_instances(t, false);
  const Graph& a = *r.g.nodes[1].body;
  const Graph& b = *r.g.nodes[3].body;
  ASSERT_NE(a.nodes[0].scope, b.nodes[0].scope);
  ASSERT_NE(a.nodes[0].origin, b.nodes[0].origin);
  EXPECT_TRUE(same_computation(a, b));
  EXPECT_TRUE(same_computation(t, parse(kTemplate)));  // names, scopes and origins aside
  Graph changed = parse(kTemplate);
  changed.nodes[1].body->nodes[0].op = Op::exp;
  EXPECT_FALSE(same_computation(t, changed));
  changed = parse(kTemplate);
  changed.nodes[1].attrs.set("reverse", true);
  EXPECT_FALSE(same_computation(t, changed));
  changed = parse(kTemplate);
  std::swap(changed.nodes[0].inputs[0], changed.nodes[0].inputs[1]);
  EXPECT_FALSE(same_computation(t, changed));
  changed = parse(kTemplate);
  changed.nodes[2].recomputed = false;
  EXPECT_FALSE(same_computation(t, changed));
}

}  // namespace
}  // namespace remat::ir
