// remat_policy=auto (search::search) against brute force over every placement of the searched names, planned
// by the real planner: the same optimum (least estimated cost, then least peak) under three budgets per model,
// one of them tight; the memory bound of the search (the lemma) below every plan. Under groups the space and the
// brute force include the group policy (and, in search_group_sizes, the group size). The cost model itself is
// checked apart from the code: recompute FLOPs of three placements of the tiny model derived from its shapes,
// and the placements the memory bound spares the planner counted from residual bytes derived by hand.
#include "cli/commands.h"
#include "cli/config.h"
#include "remat/layer_flops.h"
#include "search/search.h"
#include "support/sanitizer_subset.h"
#include "trainer/trainer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

namespace remat {
namespace {

using search::Residency;

compile::Request request_of(const std::vector<std::string>& keys) {
  const cli::Config c = cli::load_config("", keys);
  return {.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer};
}

const search::Rates kRates{.gemm_flops = 2e11, .other_flops = 5e9, .host_bandwidth = 2e10};

// Every placement of the model `keys` configure, planned (3^k plans; under groups each with group policy
// nothing_saveable, and those that offload nothing (2^k) also with G keeping the layer inputs and the names they
// save), once per test program.
const std::vector<search::Candidate>& brute_force(const std::vector<std::string>& keys) {
  static std::map<std::vector<std::string>, std::vector<search::Candidate>> planned;
  if (planned.contains(keys)) return planned[keys];
  const compile::Request r = request_of(keys);
  const std::vector<std::string> names = search::searched_names(r);
  std::vector<search::Candidate>& all = planned[keys];
  std::vector<Residency> p(names.size(), Residency::recompute);
  std::function<void(size_t)> each = [&](size_t i) {
    if (i == names.size()) {
      all.push_back(search::evaluate(r, names, p, {}, kRates));
      if (r.model.layers_per_group > 0 && std::count(p.begin(), p.end(), Residency::offload) == 0)
        all.push_back(search::evaluate(r, names, p, {}, kRates, true));
      return;
    }
    for (Residency x : {Residency::recompute, Residency::save, Residency::offload}) p[i] = x, each(i + 1);
  };
  each(0);
  return all;
}

// A model: its config keys and the names a search over it decides, in the order of checkpoint_names.h.
struct Model {
  std::string name;
  std::vector<std::string> keys, searched;
};

class AutoPolicy : public testing::TestWithParam<Model> {};

TEST_P(AutoPolicy, EqualsTheBruteForceOptimumUnderEveryBudget) {
  const compile::Request r = request_of(GetParam().keys);
  const search::Rates& rates = kRates;
  std::vector<double> bytes;
  const std::vector<std::string> names = search::searched_names(r, &bytes);
  EXPECT_EQ(names, GetParam().searched);
  const std::vector<search::Candidate>& all = brute_force(GetParam().keys);
  // The lemma, on every placement: peak >= (peak - device bytes of the all-device placement with the same group
  // policy) + device bytes.
  auto device_bytes = [&](const search::Candidate& c) {
    double b = 0;
    for (size_t i = 0; i < names.size(); ++i) b += c.placement[i] == Residency::save ? bytes[i] : 0;
    return b;
  };
  for (const search::Candidate& c : all) {
    const search::Candidate& all_device = *std::find_if(all.begin(), all.end(), [&](const search::Candidate& d) {
      return d.group_keeps == c.group_keeps &&
             std::all_of(d.placement.begin(), d.placement.end(), [](Residency x) { return x == Residency::save; });
    });
    const double base = static_cast<double>(all_device.peak) - device_bytes(all_device);
    EXPECT_GE(static_cast<double>(c.peak), base + device_bytes(c)) << c.policy << " " << c.group_policy;
  }

  std::vector<int64_t> peaks;
  for (const search::Candidate& c : all) peaks.push_back(c.peak);
  std::sort(peaks.begin(), peaks.end());
  peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
  // Tight: only the smallest peak fits; middle; loose: all but the all-device placement's peak (twice the one peak
  // if every placement had the same).
  const int64_t loose = peaks.size() > 1 ? peaks.back() - 1 : 2 * peaks.back();
  for (int64_t budget : {peaks.front(), peaks[peaks.size() / 2], loose}) {
    const search::Result got = search::search(r, {.device = budget}, rates);
    const search::Candidate* want = nullptr;
    for (const search::Candidate& c : all)
      if (c.peak <= budget && (!want || c.seconds < want->seconds || (c.seconds == want->seconds && c.peak < want->peak)))
        want = &c;
    ASSERT_TRUE(want != nullptr);
    ASSERT_TRUE(got.best.has_value()) << budget;
    EXPECT_EQ(got.best->seconds, want->seconds) << "budget " << budget << ": got " << got.best->policy << " "
                                                << got.best->group_policy << ", brute force " << want->policy << " "
                                                << want->group_policy;
    EXPECT_EQ(got.best->peak, want->peak) << budget;
    EXPECT_LE(got.best->peak, budget);
    EXPECT_TRUE(got.lemma_held);
    EXPECT_LT(got.planned, static_cast<int>(all.size()) / 4 + 2) << "the bounds prune";
    for (const search::Candidate& c : got.cheaper) {  // the reasons printed: each cheaper change, planned, does not fit
      EXPECT_LT(c.seconds, got.best->seconds);
      EXPECT_GT(c.peak, budget) << c.policy;
    }
  }
  // Under the smallest peak nothing fits, and the search names that peak.
  const search::Result none = search::search(r, {.device = peaks.front() - 1}, rates);
  EXPECT_FALSE(none.best.has_value());
  EXPECT_EQ(none.smallest.peak, peaks.front());
  // The frontier is the Pareto set of the brute force (peak, cost), and no MaxText preset lies below it.
  std::vector<std::pair<int64_t, double>> pareto;
  for (const search::Candidate& c : all) {
    bool dominated = false;
    for (const search::Candidate& d : all)
      dominated = dominated || (d.peak <= c.peak && d.seconds <= c.seconds && (d.peak < c.peak || d.seconds < c.seconds));
    if (!dominated) pareto.emplace_back(c.peak, c.seconds);
  }
  std::sort(pareto.begin(), pareto.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  pareto.erase(std::unique(pareto.begin(), pareto.end()), pareto.end());
  const search::Frontier f = search::frontier(r, {}, rates);
  std::vector<std::pair<int64_t, double>> got;
  for (const search::Candidate& c : f.points) got.emplace_back(c.peak, c.seconds);
  EXPECT_EQ(got, pareto);
  EXPECT_EQ(f.presets.size(), rematerialize::preset_names().size());
  for (const search::Candidate& q : f.presets)
    EXPECT_TRUE(std::any_of(f.points.begin(), f.points.end(),
                            [&](const search::Candidate& p) { return p.peak <= q.peak && p.seconds <= q.seconds; }))
        << q.policy << " lies below the frontier";
  // A host limit below every offloading placement's host bytes: the answer is the brute force's best placement
  // that offloads nothing.
  const int64_t middle = peaks[peaks.size() / 2];
  const search::Candidate* on_device = nullptr;
  for (const search::Candidate& c : all)
    if (c.peak <= middle && std::count(c.placement.begin(), c.placement.end(), Residency::offload) == 0 &&
        (!on_device || std::pair(c.seconds, c.peak) < std::pair(on_device->seconds, on_device->peak)))
      on_device = &c;
  ASSERT_TRUE(on_device != nullptr);
  const search::Result no_host = search::search(r, {.device = middle, .host = 1}, rates);
  ASSERT_TRUE(no_host.best.has_value()) << "budget " << middle << ": " << on_device->policy << " fits";
  EXPECT_EQ(no_host.best->seconds, on_device->seconds) << no_host.best->policy << " vs " << on_device->policy;
  EXPECT_EQ(no_host.best->peak, on_device->peak) << no_host.best->policy << " vs " << on_device->policy;
  for (Residency x : no_host.best->placement) EXPECT_NE(x, Residency::offload);
}

// Not searched: a name on a region input, kept with it (decoder_layer_input of a layer scan), and one the
// backward never reads: mlpwo (only the residual add reads it). The double scan searches the layers' policy
// (the groups keep theirs, nothing_saveable) over the same names; fused projections keep it to 3^4 plans.
const std::vector<std::string> kUnfusedNames = {"query_proj", "key_proj", "value_proj", "context", "out_proj",
                                                "mlpwi_0",    "mlpwi_1"};
INSTANTIATE_TEST_SUITE_P(
    Models, AutoPolicy,
    testing::ValuesIn(testing_support::sanitizer_subset(std::vector<Model>{Model{"tiny", {"model=tiny"}, kUnfusedNames},
                    Model{"gqa_double_scan",
                          {"model=tiny", "base_num_kv_heads=2", "layers_per_group=2", "max_target_length=512",
                           "fused_qkv=true", "fused_mlp=true"},
                          {"context", "out_proj", "qkv_proj", "mlpwi"}},
                    Model{"llama2_7b_4096", {"model=llama2-7b", "per_device_batch_size=1", "max_target_length=4096"},
                          kUnfusedNames}},
        {"gqa_double_scan"})),
    [](const testing::TestParamInfo<Model>& i) { return i.param.name; });

// The group policies the search leaves out plan as nothing_saveable does, so deciding between nothing_saveable
// and G keeping the layer inputs with every name P saves loses nothing: a G keeping only some of them (the
// group's forward is rerun, making all again), and the keeping G under a P that offloads a name (G cannot keep its
// host copy). The keeping G reruns no group: its recompute is P's own without groups.
TEST(AutoPolicy, UnderGroupsOnlyNothingSaveableAndKeepingAllThatCrossesGroupsDiffer) {
  const std::vector<std::string> keys = {"model=tiny", "base_num_kv_heads=2", "layers_per_group=2",
                                         "max_target_length=512", "fused_qkv=true", "fused_mlp=true"};
  compile::Request r = request_of(keys);
  const std::vector<std::string> names = search::searched_names(r);
  ASSERT_EQ(names, (std::vector<std::string>{"context", "out_proj", "qkv_proj", "mlpwi"}));
  using R = Residency;
  const std::vector<R> saves_two = {R::save, R::recompute, R::save, R::recompute};  // context, qkv_proj
  const search::Candidate nothing = search::evaluate(r, names, saves_two, {}, kRates);
  const search::Candidate keeping = search::evaluate(r, names, saves_two, {}, kRates, true);
  EXPECT_EQ(keeping.group_policy, "save_only_these_names(decoder_layer_input, context, qkv_proj)");
  EXPECT_LT(keeping.recompute_flops, nothing.recompute_flops);
  const std::vector<std::string> crossing = {"decoder_layer_input", "context", "qkv_proj"};
  for (unsigned subset = 0; subset + 1 < 1u << crossing.size(); ++subset) {  // every strict subset
    std::vector<std::string> kept;
    for (size_t i = 0; i < crossing.size(); ++i)
      if (subset >> i & 1) kept.push_back(crossing[i]);
    compile::Request g = r;
    g.model.group_remat_policy = nn::parse_remat_policy(fmt::format("save_only_these_names({})", fmt::join(kept, ", ")), g.model);
    const search::Candidate c = search::evaluate_policy(g, search::placed(g.model, names, saves_two), {}, kRates);
    EXPECT_EQ(c.peak, nothing.peak) << g.model.group_remat_policy.written;
    EXPECT_EQ(c.recompute_flops, nothing.recompute_flops) << g.model.group_remat_policy.written;
  }
  const std::vector<R> offloads = {R::save, R::recompute, R::offload, R::recompute};
  const search::Candidate off_nothing = search::evaluate(r, names, offloads, {}, kRates);
  const search::Candidate off_keeping = search::evaluate(r, names, offloads, {}, kRates, true);
  EXPECT_EQ(off_keeping.peak, off_nothing.peak);
  EXPECT_EQ(off_keeping.recompute_flops, off_nothing.recompute_flops);
  // Every P that offloads nothing: the keeping G's recompute is P's without groups, below nothing_saveable's.
  std::vector<std::string> flat_keys = keys;
  flat_keys[2] = "layers_per_group=0";
  const compile::Request flat = request_of(flat_keys);
  for (unsigned saved = 0; saved < 1u << names.size(); ++saved) {
    std::vector<R> p;
    for (size_t i = 0; i < names.size(); ++i) p.push_back(saved >> i & 1 ? R::save : R::recompute);
    const search::Candidate k = search::evaluate(r, names, p, {}, kRates, true);
    EXPECT_EQ(k.recompute_flops, search::evaluate(flat, names, p, {}, kRates).recompute_flops) << k.policy;
    EXPECT_LT(k.recompute_flops, search::evaluate(r, names, p, {}, kRates).recompute_flops) << k.policy;
  }
}

// Under groups, what auto prints is paste-able and is what the config runs with: the two printed lines, given by
// hand as remat_policy and group_remat_policy, plan the answer's peak and recompute, and resolve_auto (train's and
// plan's route) sets both policies of the model.
TEST(AutoPolicy, UnderGroupsBothPrintedPoliciesGivenByHandPlanTheAnswer) {
  const std::vector<std::string> keys = {"model=tiny", "base_num_kv_heads=2", "layers_per_group=2",
                                         "max_target_length=512", "fused_qkv=true", "fused_mlp=true"};
  std::vector<std::string> automatic = keys;
  automatic.push_back("remat_policy=auto");  // unlimited: every name saved, kept across groups (the least recompute)
  cli::Config config = cli::load_config("", automatic);
  const std::optional<search::Result> r = cli::resolve_auto(config, false);
  ASSERT_TRUE(r && r->best) << (r ? r->text() : "");
  const std::string text = r->text();
  auto line = [&](const std::string& key) {
    const size_t at = text.find("  " + key + ": ");
    if (at == std::string::npos) return std::string();
    const size_t from = at + key.size() + 4;
    return text.substr(from, text.find('\n', from) - from);
  };
  const std::string p = line("remat_policy"), g = line("group_remat_policy");
  ASSERT_NE(g, "") << text;
  EXPECT_EQ(g, "save_only_these_names(decoder_layer_input, mlpwi, qkv_proj, context, out_proj)") << text;
  EXPECT_EQ(config.run.model.remat_policy.written, p);
  EXPECT_EQ(config.run.model.group_remat_policy.written, g);
  std::vector<std::string> by_hand = keys;
  by_hand.insert(by_hand.end(), {"remat_policy=" + p, "group_remat_policy=" + g});
  const compile::Request h = request_of(by_hand);
  const search::Candidate c = search::evaluate_policy(h, h.model.remat_policy, {}, kRates);
  EXPECT_EQ(c.peak, r->best->peak);
  EXPECT_EQ(c.recompute_flops, r->best->recompute_flops);
}

// The group size searched too equals brute force over every size of 8 layers of the tiny model (0: no groups, 1, 2,
// 4, 8), each size's every placement and group policy planned: the least cost that fits, then the least peak, under
// four budgets, and four more with nothing offloaded, where groups pay (97 plans per grouped size, 81 without;
// 469 in all: the release build only, Makefile RELEASE_ONLY).
TEST(AutoPolicy, TheGroupSizeSearchedTooEqualsTheBruteForceOverEverySize) {
  const std::vector<std::string> keys = {"model=tiny", "base_num_kv_heads=2", "layers_per_group=2", "max_target_length=512",
                                         "fused_qkv=true", "fused_mlp=true", "base_num_decoder_layers=8"};
  std::vector<std::pair<int64_t, const search::Candidate*>> all;  // (size, candidate)
  for (int64_t size : {0, 1, 2, 4, 8}) {
    std::vector<std::string> sized = keys;
    sized[2] = fmt::format("layers_per_group={}", size);
    for (const search::Candidate& c : brute_force(sized)) all.emplace_back(size, &c);
  }
  std::vector<int64_t> peaks;
  for (const auto& [size, c] : all) peaks.push_back(c->peak);
  std::sort(peaks.begin(), peaks.end());
  const compile::Request r = request_of(keys);
  std::set<int64_t> sizes;
  std::vector<int64_t> device_peaks;  // of the placements that offload nothing
  for (const auto& [size, c] : all)
    if (c->host == 0) device_peaks.push_back(c->peak);
  std::sort(device_peaks.begin(), device_peaks.end());
  std::vector<search::Limits> budgets;
  for (const std::vector<int64_t>* p : {&peaks, &device_peaks})
    for (size_t at : {size_t{0}, p->size() / 4, p->size() / 2, p->size() - 1})
      budgets.push_back({.device = (*p)[at], .host = p == &peaks ? 0 : 1});
  for (const search::Limits& limits : budgets) {
    const int64_t budget = limits.device;
    const std::pair<int64_t, const search::Candidate*>* want = nullptr;
    for (const auto& sc : all)
      if (sc.second->peak <= budget && (limits.host == 0 || sc.second->host == 0) &&
          (!want || std::tuple(sc.second->seconds, sc.second->peak, sc.first) <
                        std::tuple(want->second->seconds, want->second->peak, want->first)))
        want = &sc;
    ASSERT_TRUE(want != nullptr);
    const search::Result got = search::search_group_sizes(r, limits, kRates);
    ASSERT_TRUE(got.best.has_value()) << budget;
    EXPECT_EQ(got.best->seconds, want->second->seconds) << budget << ": got " << got.text() << "brute force: layers_per_group "
                                                       << want->first << " " << want->second->policy << " " << want->second->group_policy;
    EXPECT_EQ(got.best->peak, want->second->peak) << budget;
    EXPECT_EQ(got.layers_per_group, want->first) << budget;
    EXPECT_NE(got.text().find(fmt::format("  layers_per_group: {}\n", want->first)), std::string::npos) << got.text();
    sizes.insert(want->first);
  }
  EXPECT_GE(sizes.size(), 2u) << "the budgets are answered by different group sizes";
  const search::Result none = search::search_group_sizes(r, {.device = peaks.front() - 1}, kRates);
  EXPECT_FALSE(none.best.has_value());
  EXPECT_EQ(none.smallest.peak, peaks.front());
}

// Recompute FLOPs (GEMM and the rest) of three placements of the tiny model, derived from its shapes, equal
// the search's. The backward reads the normed inputs h of every projection, the softmax's probs, the context
// (for Wo's gradient), x + out_proj (the second norm's input) and silu(gate)·up (for Wo of the MLP).
TEST(AutoPolicy, RecomputeFlopsOfTinyPlacementsAreTheOnesDerivedFromItsShapes) {
  const compile::Request r = request_of({"model=tiny"});
  const search::Rates rates;
  const testing_support::LayerFlops t(r.model, r.shape);
  const std::vector<std::string> names = search::searched_names(r);
  using R = Residency;
  const auto placed = [&](const std::vector<std::pair<std::string, R>>& choice) {
    std::vector<R> p;
    for (const std::string& n : names)
      p.push_back(std::find_if(choice.begin(), choice.end(), [&](const auto& c) { return c.first == n; })->second);
    return search::evaluate(r, names, p, {}, rates);
  };
  // Every name recomputed: the whole layer forward again but Wo of the MLP and the last residual add.
  const search::Candidate none = placed({{"query_proj", R::recompute}, {"key_proj", R::recompute},
                                         {"value_proj", R::recompute}, {"context", R::recompute},
                                         {"out_proj", R::recompute}, {"mlpwi_0", R::recompute}, {"mlpwi_1", R::recompute}});
  EXPECT_EQ(none.recompute_gemm_flops,
            t.L * (t.qkv_gemms() + t.scores_gemm() + t.context_gemm() + t.out_gemm() + 2 * t.wi_gemm()));
  EXPECT_EQ(none.recompute_flops - none.recompute_gemm_flops,
            t.L * (2 * t.norm() + t.rope(t.Q) + t.rope(t.K) + t.probs() + t.residual_add() +
                   t.silu_times_up()));
  // q, k, v, out_proj and the MLP's inputs kept (offloaded or on device: the same FLOPs), the context recomputed:
  // the norms, the probs from q and k, the context from them and v, x + out_proj, silu(gate)·up.
  const search::Candidate kept = placed({{"query_proj", R::offload}, {"key_proj", R::save}, {"value_proj", R::save},
                                         {"context", R::recompute}, {"out_proj", R::save}, {"mlpwi_0", R::save},
                                         {"mlpwi_1", R::offload}});
  EXPECT_EQ(kept.recompute_gemm_flops, t.L * (t.scores_gemm() + t.context_gemm()));
  EXPECT_EQ(kept.recompute_flops - kept.recompute_gemm_flops,
            t.L * (2 * t.norm() + t.probs() + t.residual_add() + t.silu_times_up()));
  // Offloaded per step: query_proj [B,T,H,Dh] and mlpwi_1 [B,T,F] of every layer, f32.
  EXPECT_EQ(kept.offloaded_bytes, t.L * 4 * (t.N * t.Q + t.N * t.F));
  // Unlimited memory: the search keeps every name on device, and only the probs' scores product is a GEMM left.
  const search::Result all = search::search(r, {}, rates);
  ASSERT_TRUE(all.best.has_value());
  EXPECT_EQ(all.best->placement, std::vector<R>(names.size(), R::save)) << all.best->policy;
  EXPECT_EQ(all.best->recompute_gemm_flops, t.L * t.scores_gemm());
  EXPECT_EQ(all.best->recompute_flops - all.best->recompute_gemm_flops,
            t.L * (2 * t.norm() + t.probs() + t.residual_add() + t.silu_times_up()));
}

// Under tensor parallelism the cost adds the bytes a device sends again in recomputed collectives, at
// ici_bandwidth. With every name recomputed, each layer reruns its attention block's sum: an all-reduce of
// [B,T,D] f32 over t = 2 ranks, of which a device sends 2 (t-1)/t = 1 times the bytes (the MLP block's sum feeds
// only the layer's output, the next layer's kept input). With out_proj saved — the sum itself, as the layer
// adds it — nothing reruns.
TEST(AutoPolicy, UnderTensorParallelismRecomputedCollectivesCostTheirBytesAtIciBandwidth) {
  const cli::Config c = cli::load_config("", {"model=tiny", "ici_tensor_parallelism=2"});
  const compile::Request r{.model = trainer::device_model(c.run, trainer::plan_run(c.run, 0)), .shape = c.run.shape,
                           .optimizer = c.run.optimizer};
  const std::vector<std::string> names = search::searched_names(r);
  search::Rates slow = kRates, fast = kRates;
  slow.ici_bandwidth = 1e8, fast.ici_bandwidth = 1e11;
  std::vector<Residency> none(names.size(), Residency::recompute), out_saved = none;
  const auto out = std::find(names.begin(), names.end(), "out_proj");
  ASSERT_NE(out, names.end());
  out_saved[static_cast<size_t>(out - names.begin())] = Residency::save;
  const double B = static_cast<double>(r.shape.batch), T = static_cast<double>(r.shape.seq),
               D = static_cast<double>(r.model.emb_dim), L = static_cast<double>(r.model.num_decoder_layers);
  const search::Candidate at_slow = search::evaluate(r, names, none, {}, slow);
  const search::Candidate at_fast = search::evaluate(r, names, none, {}, fast);
  EXPECT_EQ(at_slow.recomputed_sent, L * 4 * B * T * D);
  EXPECT_NEAR(at_slow.seconds - at_fast.seconds, at_slow.recomputed_sent * (1 / 1e8 - 1 / 1e11), 1e-9 * at_slow.seconds);
  EXPECT_EQ(search::evaluate(r, names, out_saved, {}, slow).recomputed_sent, 0);
  // The search prices it: unlimited memory keeps every name on device, nothing sent again.
  const search::Result all = search::search(r, {}, slow);
  ASSERT_TRUE(all.best.has_value());
  EXPECT_EQ(all.best->recomputed_sent, 0) << all.best->policy;
}

// A budget where the memory bound prunes. Per step (f32, every layer) q, k, v, context and out_proj hold
// 4·N·H·Dh bytes each and mlpwi_0, mlpwi_1 4·N·F; the bound rejects, unplanned, every placement whose device bytes
// exceed the budget less the all-device plan's other bytes: here whatever keeps both MLP inputs on device, or one
// of them and 4 of the 5 others. The search plans exactly the all-device placement, each placement no dearer than
// its answer that the bound admits, and the cheaper one-name changes of the answer it prints. The brute force
// plans all 3^7 placements: the release build only (Makefile RELEASE_ONLY).
TEST(AutoPolicy, TheMemoryBoundSparesThePlannerTheCandidatesItRejects) {
  const compile::Request r = request_of({"model=tiny"});
  const search::Rates& rates = kRates;
  const testing_support::LayerFlops t(r.model, r.shape);
  std::vector<double> bytes;
  const std::vector<std::string> names = search::searched_names(r, &bytes);
  const double small = 4 * t.L * t.N * t.Q, wide = 4 * t.L * t.N * t.F;
  EXPECT_EQ(bytes, (std::vector<double>{small, small, small, small, small, wide, wide}));
  ASSERT_EQ(wide, 4 * small) << "the rejected set described above";
  const std::vector<search::Candidate>& all = brute_force({"model=tiny"});
  auto device_bytes = [&](const search::Candidate& c) {
    double b = 0;
    for (size_t i = 0; i < names.size(); ++i) b += c.placement[i] == Residency::save ? bytes[i] : 0;
    return b;
  };
  const search::Candidate& all_device = *std::find_if(all.begin(), all.end(), [&](const search::Candidate& c) {
    return device_bytes(c) == 5 * small + 2 * wide;
  });
  const double base = static_cast<double>(all_device.peak) - device_bytes(all_device);
  const int64_t budget = static_cast<int64_t>(base + 2 * wide) - 1;
  const auto rejected = [&](const search::Candidate& c) { return base + device_bytes(c) > static_cast<double>(budget); };
  const search::Candidate* want = nullptr;
  for (const search::Candidate& c : all)
    if (c.peak <= budget && (!want || std::pair(c.seconds, c.peak) < std::pair(want->seconds, want->peak))) want = &c;
  ASSERT_TRUE(want != nullptr);
  std::set<std::string> planned = {all_device.policy}, spared;
  for (const search::Candidate& c : all) {
    if (rejected(c)) {
      EXPECT_GT(c.peak, budget) << c.policy << ": the bound rejected a placement that fits";
    }
    if (c.seconds <= want->seconds) (rejected(c) ? spared : planned).insert(c.policy);
    int changed = 0;
    for (size_t i = 0; i < names.size(); ++i) changed += c.placement[i] != want->placement[i];
    if (changed == 1 && c.seconds < want->seconds) planned.insert(c.policy);
  }
  EXPECT_TRUE(spared.contains(all_device.policy));
  EXPECT_GE(spared.size(), 10u) << "placements cheaper than the answer that the bound rejects";
  const search::Result got = search::search(r, {.device = budget}, rates);
  ASSERT_TRUE(got.best.has_value());
  EXPECT_EQ(got.best->seconds, want->seconds) << got.best->policy << " vs " << want->policy;
  EXPECT_TRUE(got.lemma_held);
  EXPECT_EQ(got.planned, static_cast<int>(planned.size())) << spared.size() << " spared by the bound";
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// remat_policy=auto under a pipeline (search_ranks): each rank's answer equals the brute force over that rank's
// placements, its own program planned with each, under every budget the ranks' peaks suggest (tight, middle,
// loose). Under 1F1B rank 0 holds two microbatches' residuals at its peak and
// rank 1 one, so a saved name costs rank 0 twice its bytes: under some budget the ranks answer differently, and
// there one placement for both ranks does not fit or costs more than the two answers. 162 plans: the release
// build only (Makefile RELEASE_ONLY).
TEST(AutoPolicy, UnderAPipelineEachRanksAnswerEqualsTheBruteForceOverItsPlacements) {
  const cli::Config config =
      cli::load_config("", {"model=tiny", "fused_qkv=true", "fused_mlp=true", "ici_pipeline_parallelism=2",
                            "num_pipeline_microbatches=4", "pipeline_schedule=1f1b", "logits_via_embedding=false"});
  const cli::SearchInputs in = cli::search_inputs(config);
  ASSERT_TRUE(in.pipeline != nullptr);
  const int64_t ranks = 2;
  std::vector<std::vector<search::Candidate>> all(ranks);
  std::set<int64_t> budgets;
  bool bound_fails = false;  // on some rank, some placement's peak is below the memory bound
  for (int64_t r = 0; r < ranks; ++r) {
    compile::Request rank = in.request;
    rank.stage = r;
    std::vector<double> bytes;
    const std::vector<std::string> names = search::searched_names(rank, &bytes);
    ASSERT_EQ(names, (std::vector<std::string>{"context", "out_proj", "qkv_proj", "mlpwi"}));
    std::vector<Residency> p(names.size(), Residency::recompute);
    std::function<void(size_t)> each = [&](size_t i) {
      if (i == names.size()) return all[r].push_back(search::evaluate(rank, names, p, {}, kRates));
      for (Residency x : {Residency::recompute, Residency::save, Residency::offload}) p[i] = x, each(i + 1);
    };
    each(0);
    // The names' bytes are the step's (4 microbatches); at its peak rank r holds 2 - r of them (1F1B: p - r).
    auto device_bytes = [&](const search::Candidate& c) {
      double b = 0;
      for (size_t i = 0; i < names.size(); ++i) b += c.placement[i] == Residency::save ? bytes[i] / 4 * (2 - r) : 0;
      return b;
    };
    // Why the search has no memory bound under a pipeline: on some rank some placement's peak is below it.
    const search::Candidate& all_device = all[r][40];  // every name saved: the middle of 3^4 in this order
    ASSERT_TRUE(std::all_of(all_device.placement.begin(), all_device.placement.end(),
                            [](Residency x) { return x == Residency::save; }));
    bound_fails = bound_fails || std::any_of(all[r].begin(), all[r].end(), [&](const search::Candidate& c) {
      return static_cast<double>(c.peak) < static_cast<double>(all_device.peak) - device_bytes(all_device) + device_bytes(c);
    });
    std::vector<int64_t> peaks;
    for (const search::Candidate& c : all[r]) peaks.push_back(c.peak);
    std::sort(peaks.begin(), peaks.end());
    peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
    budgets.insert({peaks.front(), peaks[peaks.size() / 2], peaks.back() - 1});
  }
  EXPECT_TRUE(bound_fails) << "the memory bound holds on every rank; search.cpp may use it under a pipeline";
  auto best_of = [](const std::vector<search::Candidate>& candidates, int64_t budget) {
    const search::Candidate* want = nullptr;
    for (const search::Candidate& c : candidates)
      if (c.peak <= budget && (!want || std::pair(c.seconds, c.peak) < std::pair(want->seconds, want->peak))) want = &c;
    return want;
  };
  bool differ = false;
  for (int64_t budget : budgets) {
    const std::vector<search::Result> got = search::search_ranks(in.request, {.device = budget}, kRates);
    ASSERT_EQ(got.size(), static_cast<size_t>(ranks));
    double answers = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      const search::Candidate* want = best_of(all[r], budget);
      const search::Result& result = got[static_cast<size_t>(r)];
      EXPECT_FALSE(result.memory_bound) << "rank " << r;
      if (!want) {
        EXPECT_FALSE(result.best.has_value()) << "rank " << r << ", budget " << budget;
        answers = INFINITY;
        continue;
      }
      ASSERT_TRUE(result.best.has_value()) << "rank " << r << ", budget " << budget << ": " << want->policy << " fits";
      EXPECT_EQ(result.best->seconds, want->seconds) << "rank " << r << ", budget " << budget << ": got "
                                                     << result.best->policy << ", brute force " << want->policy;
      EXPECT_EQ(result.best->peak, want->peak) << "rank " << r << ", budget " << budget;
      answers += want->seconds;
    }
    if (got[0].best && got[1].best && got[0].best->policy != got[1].best->policy) {
      differ = true;
      // One placement for both ranks: none fits both, or the cheapest that does costs more.
      double one = INFINITY;
      for (size_t i = 0; i < all[0].size(); ++i)
        if (all[0][i].peak <= budget && all[1][i].peak <= budget) one = std::min(one, all[0][i].seconds + all[1][i].seconds);
      EXPECT_GT(one, answers) << "budget " << budget;
    }
  }
  EXPECT_TRUE(differ) << "some budget separates the ranks";
}

}  // namespace
}  // namespace remat
