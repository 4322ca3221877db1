// Every built-in policy and preset gives bit-identical gradients to everything_saveable, for scanned,
// unrolled and double-scanned layers (a 2-layer model), and each forward op runs at most twice.
#include "remat/remat.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <functional>
#include <set>

namespace remat {
namespace {

enum class Layout { scanned, unrolled, nested };

nn::ModelConfig model(Layout layout, const std::string& policy) {
  nn::ModelConfig c = testing_support::small_model(2, layout != Layout::unrolled, policy);
  c.layers_per_group = layout == Layout::nested ? 1 : 0;
  return c;
}

std::vector<exec::Array> args_for(const nn::ModelConfig& c) {
  std::vector<exec::Array> args = nn::init_params(c, 2);
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> tok(0, 255);
  std::vector<int32_t> in(2 * 16), tg(in.size());
  for (auto& x : in) x = tok(rng);
  for (auto& x : tg) x = tok(rng);
  args.push_back(exec::Array::from<int32_t>({1, 2, 16}, in));
  args.push_back(exec::Array::from<int32_t>({1, 2, 16}, tg));
  return args;
}

std::vector<std::string> all_policies() {
  std::vector<std::string> p = rematerialize::preset_names();
  for (const char* extra : {"everything_saveable", "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                            "offload_dot_with_no_batch_dims", "save_any_names_but_these(mlpwo, context)",
                            "save_and_offload_only_these_names(save=[query_proj], offload=[mlpwi_0, decoder_layer_input])",
                            "save_and_offload_only_these_names_regex(save=\"(query|key|value)_proj\", offload=\"mlpwi_.\")",
                            "save_from_both_policies(save_qkv_proj, dots_saveable)",
                            "combine(minimal_offloaded, dots_saveable, prefer=save)",
                            "custom(query_proj=offload, mlpwo=device, context=device)", "none"})
    p.push_back(extra);
  return p;
}

// Executions per step of each origin's non-recomputed nodes.
void count_original_runs(const ir::Graph& g, int64_t times, std::map<uint64_t, int64_t>& runs) {
  for (const ir::Node& n : g.nodes) {
    if (n.op == ir::Op::scan) count_original_runs(*n.body, times * n.attrs.integer("length"), runs);
    else if (n.op == ir::Op::remat) count_original_runs(*n.body, times, runs);
    else if (!n.recomputed) runs[n.origin] += times;
  }
}

// Origins of nodes computed only from the weights (the first `num_weights` params) and constants.
void derived_origins(const ir::Graph& g, const std::vector<bool>& param_flags, std::set<uint64_t>& out) {
  std::vector<bool> d(g.types.size(), false);
  for (size_t i = 0; i < g.params.size() && i < param_flags.size(); ++i) d[static_cast<size_t>(g.params[i])] = param_flags[i];
  for (const ir::Node& n : g.nodes) {
    bool all = true;
    for (ir::ValueId v : n.inputs) all = all && d[static_cast<size_t>(v)];
    for (ir::ValueId v : n.outputs) d[static_cast<size_t>(v)] = all;
    if (all) out.insert(n.origin);
    if (n.body) {
      std::vector<bool> inner;
      for (ir::ValueId v : n.inputs) inner.push_back(d[static_cast<size_t>(v)]);
      derived_origins(*n.body, inner, out);
    }
  }
}

class AllPolicies : public testing::TestWithParam<std::tuple<Layout, std::string>> {};

TEST_P(AllPolicies, GradientsAreBitIdenticalToEverythingSaveable) {
  auto [layout, policy] = GetParam();
  nn::ModelConfig base = model(layout, "everything_saveable"), c = model(layout, policy);
  std::vector<exec::Array> args = args_for(c);
  std::vector<exec::Array> want = exec::run(train::grads_graph(base, {2, 16, 1}), args);
  rematerialize::Decider decider;
  ir::Graph g = train::grads_graph(c, {2, 16, 1}, &decider);
  ir::verify(g);
  exec::Profile profile;
  std::vector<exec::Array> got = exec::run(g, args, {.profile = &profile});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::memcmp(got[i].bytes(), want[i].bytes(), static_cast<size_t>(got[i].type().bytes())), 0)
        << policy << ": result " << i << " differs";
  // No activation op runs more than twice as often as its original (non-recomputed) node: forward once,
  // recompute once. Parameter-derived ops (broadcasts of weights and constants) are exempt: they are never
  // saved, so a nested recompute computes them again.
  std::map<uint64_t, int64_t> original;
  count_original_runs(g, 1, original);
  std::set<uint64_t> derived;
  derived_origins(g, std::vector<bool>(nn::param_specs(c).size(), true), derived);
  int recomputed_ops = 0;
  for (const auto& [origin, runs] : profile.runs_by_origin) {
    if (!original.count(origin) || derived.count(origin)) continue;
    EXPECT_LE(runs, 2 * original[origin]) << policy << ": op with origin " << origin;
    recomputed_ops += runs > original[origin];
  }
  // Every policy but everything_saveable and none (no region) recomputes something; those two recompute only
  // parameter-derived values (broadcasts of weights and tables), which are never saved.
  if (policy != "everything_saveable" && policy != "none") {
    EXPECT_GT(recomputed_ops, 0) << policy;
  }
  if (policy == "everything_saveable") {
    for (const rematerialize::ResidualRecord& r : decider.records()) {
      if (r.residency == rematerialize::Residency::recompute) {
        EXPECT_EQ(r.rule, "parameter-derived: always recomputed") << r.what;
      }
    }
  }
}

std::string label(const testing::TestParamInfo<std::tuple<Layout, std::string>>& info) {
  auto [layout, policy] = info.param;
  std::string s = layout == Layout::scanned ? "scanned_" : layout == Layout::unrolled ? "unrolled_" : "nested_";
  for (char ch : policy) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Policies, AllPolicies,
                         testing::Combine(testing::Values(Layout::scanned, Layout::unrolled, Layout::nested),
                                          testing::ValuesIn(all_policies())),
                         label);

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// The double scan of seed 000 (2 groups of 2 layers, remat on both levels): JAX, MaxText and marin rerun
// the inner forward a third time; here the group's recompute keeps every inner residual, so each forward
// activation op runs exactly twice per layer (forward, recompute) and never more.
TEST(NestedScan, EveryForwardOpRunsAtMostTwicePerLayer) {
  nn::ModelConfig c = model(Layout::nested, "full");
  c.num_decoder_layers = 4;
  c.layers_per_group = 2;
  std::vector<exec::Array> args = args_for(c);
  ir::Graph g = train::grads_graph(c, {2, 16, 1});
  exec::Profile profile;
  exec::run(g, args, {.profile = &profile});
  std::map<uint64_t, int64_t> original;
  count_original_runs(g, 1, original);
  std::set<uint64_t> derived;
  derived_origins(g, std::vector<bool>(nn::param_specs(c).size(), true), derived);
  // The forward layer ops: everything inside the first (forward) scan over groups.
  std::set<uint64_t> forward;
  std::function<void(const ir::Graph&)> collect = [&](const ir::Graph& body) {
    for (const ir::Node& n : body.nodes) {
      forward.insert(n.origin);
      if (n.body) collect(*n.body);
    }
  };
  for (const ir::Node& n : g.nodes) {
    if (n.op != ir::Op::scan) continue;
    collect(*n.body);
    break;
  }
  int layer_ops = 0, twice = 0;
  for (const auto& [origin, once] : original) {
    if (!forward.count(origin) || derived.count(origin) || !profile.runs_by_origin.count(origin)) continue;
    const int64_t runs = profile.runs_by_origin[origin];
    EXPECT_LE(runs, 2 * once) << "origin " << origin;
    if (once == 4) {  // an op of the layer body: 2 groups x 2 layers
      ++layer_ops;
      twice += runs == 8;
    }
  }
  EXPECT_GT(layer_ops, 50);
  EXPECT_EQ(twice, layer_ops) << "under full remat every layer op is recomputed exactly once";
}

}  // namespace
}  // namespace remat
