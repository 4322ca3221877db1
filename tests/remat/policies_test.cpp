// Every built-in policy and preset gives bit-identical gradients to everything_saveable, for scanned,
// unrolled (2 layers) and double-scanned layers (4 layers in groups of 2), in f32 and with bf16 compute
// (where each layer casts its weights), and each forward op runs at most twice.
#include "exec/exec.h"
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

// MaxText's fusions of the layer's input projections (fused_qkv, fused_mlp).
struct Fusion {
  bool qkv = false, mlp = false;
};

nn::ModelConfig model(Layout layout, const std::string& policy, bool bf16 = false, Fusion fusion = {},
                      const std::string& group_policy = "nothing_saveable") {
  nn::ModelConfig c = testing_support::small_model(layout == Layout::nested ? 4 : 2, layout != Layout::unrolled, "full");
  c.layers_per_group = layout == Layout::nested ? 2 : 0;
  if (bf16) c.precision = nn::parse_precision("p=f32,c=bf16");
  c.fused_qkv = fusion.qkv;
  c.fused_mlp = fusion.mlp;
  c.remat_policy = nn::parse_remat_policy(policy, c);  // spelled as the fused layer spells its names
  c.group_remat_policy = nn::parse_remat_policy(group_policy, c);
  return c;
}

void expect_bit_identical(const std::vector<exec::Array>& got, const std::vector<exec::Array>& want,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].type(), want[i].type()) << what << ": result " << i;
    ASSERT_EQ(std::memcmp(got[i].bytes(), want[i].bytes(), static_cast<size_t>(got[i].type().bytes())), 0)
        << what << ": result " << i << " differs";
  }
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

class AllPolicies : public testing::TestWithParam<std::tuple<Layout, bool, std::string>> {};

void expect_exact_gradients(Layout layout, bool bf16, const std::string& policy, Fusion fusion,
                            const std::string& group_policy = "nothing_saveable") {
  nn::ModelConfig base = model(layout, "everything_saveable", bf16, fusion),
                  c = model(layout, policy, bf16, fusion, group_policy);
  std::vector<exec::Array> args = args_for(c);
  std::vector<exec::Array> want = exec::run(train::grads_program(base, {2, 16, 1}).graph, args);
  rematerialize::Decider decider;
  ir::Graph g = train::grads_program(c, {2, 16, 1}, &decider).graph;
  ir::verify(g);
  // Run as compile runs it: regions inlined, then fused (the invariants hold with fusion on).
  ir::Graph program = g.clone();
  ir::inline_remat_regions(program);
  ir::fuse(program);
  exec::Profile profile;
  std::vector<exec::Array> got = exec::run(program, args, {.profile = &profile});
  expect_bit_identical(got, want, policy);
  // No activation op runs more than twice as often as its original (non-recomputed) node: forward once,
  // recompute once; in the double scan three times (forward, group recompute, layer recompute).
  // Parameter-derived ops (broadcasts of weights and constants) are exempt: they are never saved, so a
  // nested recompute computes them again.
  const int64_t most = layout == Layout::nested ? 3 : 2;
  std::map<uint64_t, int64_t> original;
  count_original_runs(g, 1, original);
  std::set<uint64_t> derived;
  derived_origins(g, std::vector<bool>(nn::param_specs(c).size(), true), derived);
  int recomputed_ops = 0;
  for (const auto& [origin, runs] : profile.runs_by_origin) {
    if (!original.count(origin) || derived.count(origin)) continue;
    EXPECT_LE(runs, most * original[origin]) << policy << ": op with origin " << origin;
    recomputed_ops += runs > original[origin];
  }
  // Every policy but everything_saveable and none (no region) recomputes something; those two recompute only
  // parameter-derived values (broadcasts of weights and tables), which are never saved.
  if (policy != "everything_saveable" && policy != "none") {
    EXPECT_GT(recomputed_ops, 0) << policy;
  }
  if (policy == "everything_saveable") {
    for (const rematerialize::ResidualRecord& r : decider.records()) {
      if (r.policy != c.remat_policy.described()) continue;  // a group's
      if (r.residency == rematerialize::Residency::recompute) {
        EXPECT_EQ(r.rule, "parameter-derived: always recomputed") << r.what;
      }
    }
  }
  // Values computed from weights alone (under bf16 the layer's weight casts; f32 layers have none since the norms,
  // SwiGLU and the masked softmax became ops of their own) are never saved or offloaded, whatever the policy says.
  int casts = 0;
  for (const rematerialize::ResidualRecord& r : decider.records()) {
    if (!r.parameter_derived || r.region_input) continue;
    casts += r.what.rfind("convert_group @ ", 0) == 0;
    EXPECT_EQ(r.residency, rematerialize::Residency::recompute) << policy << ": " << r.what;
  }
  if (policy != "none" && bf16) {
    EXPECT_GT(casts, 0) << policy << ": the layer's bf16 weight casts are residuals, recomputed";
  }
}

TEST_P(AllPolicies, GradientsAreBitIdenticalToEverythingSaveable) {
  auto [layout, bf16, policy] = GetParam();
  expect_exact_gradients(layout, bf16, policy, {});
}

// The double scan with the group's policy varied too: each layer policy under groups whose policy keeps
// nothing but the groups' inputs (the default), the layers' inputs, MaxText's minimal names, or everything.
class GroupPolicies : public testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GroupPolicies, GradientsAreBitIdenticalToEverythingSaveable) {
  auto [group_policy, policy] = GetParam();
  expect_exact_gradients(Layout::nested, false, policy, {}, group_policy);
}

// Every layer policy under each group policy; under AddressSanitizer three layer policies (one recomputing, one
// saving, one offloading) cover the code paths (tests/support/sanitizer_subset.h has the reason).
std::vector<std::tuple<std::string, std::string>> group_policy_cases() {
  std::vector<std::tuple<std::string, std::string>> cases;
  for (const char* group : {"save_only_these_names(decoder_layer_input)", "minimal", "everything_saveable"})
    for (const std::string& policy : all_policies())
      if (!exec::kAddressSanitizer || policy == "full" || policy == "minimal" || policy == "minimal_offloaded")
        cases.emplace_back(group, policy);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Nested, GroupPolicies, testing::ValuesIn(group_policy_cases()),
                         [](const testing::TestParamInfo<std::tuple<std::string, std::string>>& i) {
                           std::string s = fmt::format("group_{}__{}_{}", std::get<0>(i.param), std::get<1>(i.param), i.index);
                           for (char& ch : s) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return s;
                         });

// Every MaxText preset under fused_qkv, fused_mlp and both (the presets list qkv_proj and mlpwi there).
class FusedPolicies : public testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(FusedPolicies, GradientsAreBitIdenticalToEverythingSaveable) {
  auto [fusion, preset] = GetParam();
  expect_exact_gradients(Layout::scanned, false, preset, Fusion{(fusion & 1) != 0, (fusion & 2) != 0});
}

std::vector<std::string> presets_and_custom() {
  std::vector<std::string> p = rematerialize::preset_names();
  p.push_back("custom(qkv_proj=offload, mlpwi=device, out_proj=device)");  // custom takes the fused names
  return p;
}

INSTANTIATE_TEST_SUITE_P(Presets, FusedPolicies,
                         testing::Combine(testing::Values(1, 2, 3), testing::ValuesIn(presets_and_custom())),
                         [](const testing::TestParamInfo<std::tuple<int, std::string>>& i) {
                           const int f = std::get<0>(i.param);
                           std::string name = std::get<1>(i.param);
                           name = name.substr(0, name.find('('));
                           return fmt::format("{}{}{}", f & 1 ? "qkv_" : "", f & 2 ? "mlp_" : "", name);
                         });

std::string label(const testing::TestParamInfo<std::tuple<Layout, bool, std::string>>& info) {
  auto [layout, bf16, policy] = info.param;
  std::string s = layout == Layout::scanned ? "scanned_" : layout == Layout::unrolled ? "unrolled_" : "nested_";
  s += bf16 ? "bf16_" : "f32_";
  for (char ch : policy) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Policies, AllPolicies,
                         testing::Combine(testing::Values(Layout::scanned, Layout::unrolled, Layout::nested),
                                          testing::Bool(), testing::ValuesIn(all_policies())),
                         label);

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// The double scan of seed 000 (groups of 2 and of 4 layers, f32 and bf16) with JAX's nested semantics: a
// group's backward reruns the group's forward with the layer policy applied, and each layer's backward
// recomputes what the layer policy did not keep. Under full layers (nothing kept) a forward op runs at most
// three times per layer (forward, group recompute, layer recompute), and those the layer's backward reads
// run exactly three times; with everything_saveable layers (remat only at the group level, the double scan
// before nested policies) exactly twice. The gradients are bit-identical to no remat at all.
class NestedScan : public testing::TestWithParam<std::tuple<int, bool, const char*>> {};

TEST_P(NestedScan, EveryForwardOpRunsAtMostThreeTimesPerLayerAndGradientsAreExact) {
  auto [group, bf16, layer_policy] = GetParam();
  nn::ModelConfig c = model(Layout::nested, layer_policy, bf16), base = model(Layout::nested, "none", bf16);
  c.layers_per_group = base.layers_per_group = group;
  const int64_t most = std::string(layer_policy) == "full" ? 3 : 2;
  ASSERT_EQ(c.num_decoder_layers, 4);
  std::vector<exec::Array> args = args_for(c);
  ir::Graph g = train::grads_program(c, {2, 16, 1}).graph;
  exec::Profile profile;
  std::vector<exec::Array> got = exec::run(g, args, {.profile = &profile});
  expect_bit_identical(got, exec::run(train::grads_program(base, {2, 16, 1}).graph, args), "remat vs none");
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
  int layer_ops = 0, at_most = 0;
  for (const auto& [origin, once] : original) {
    if (!forward.count(origin) || derived.count(origin) || !profile.runs_by_origin.count(origin)) continue;
    const int64_t runs = profile.runs_by_origin[origin];
    EXPECT_LE(runs, most * once) << "origin " << origin;
    EXPECT_GE(runs, 2 * once) << "origin " << origin << ": the group's backward reruns its whole forward";
    if (once == 4) {  // an op of the layer body: 4 layers, whatever the grouping
      ++layer_ops;
      at_most += runs == most * 4;
    }
  }
  EXPECT_GT(layer_ops, 30);  // the layer body's ops were counted (33 in f32)
  if (most == 2) EXPECT_EQ(at_most, layer_ops) << "every layer op runs in the forward and the group's recompute";
  else EXPECT_GT(at_most, layer_ops * 3 / 4) << "most layer ops also run in their layer's recompute";
}

INSTANTIATE_TEST_SUITE_P(Groups, NestedScan,
                         testing::Combine(testing::Values(2, 4), testing::Bool(),
                                          testing::Values("full", "everything_saveable")),
                         [](const testing::TestParamInfo<std::tuple<int, bool, const char*>>& info) {
                           return fmt::format("groups_of_{}_{}_{}", std::get<0>(info.param),
                                              std::get<1>(info.param) ? "bf16" : "f32", std::get<2>(info.param));
                         });

}  // namespace
}  // namespace remat
