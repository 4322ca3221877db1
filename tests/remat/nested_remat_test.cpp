// The double scan (layers_per_group) with JAX's nested semantics (issue 32): the peak it saves derived by hand
// from the layer-input bytes, the recompute it costs derived from the layer's shapes, and the layer policy
// mattering again under groups (every MaxText preset plans apart from the others).
#include "cli/commands.h"
#include "cli/config.h"
#include "compile/compile.h"
#include "remat/layer_flops.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <set>

namespace remat {
namespace {

cli::Config config(const std::vector<std::string>& overrides) {
  return cli::load_config(std::string(REMAT_TEST_DATA) + "/../configs/base.yml", overrides);
}

int64_t plan_total(const std::vector<std::string>& overrides) {
  return nlohmann::json::parse(cli::plan_report(config(overrides), true, "", nullptr)).at("total").get<int64_t>();
}

compile::Compiled compiled(const std::vector<std::string>& overrides) {
  const cli::Config c = config(overrides);
  return compile::compile({.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer});
}

// llama2-7b, 1 x 4096 tokens, f32, full. Without groups the backward holds every layer's input x [B,T,D];
// with groups of g it holds the L/g groups' inputs and, inside one group's backward, its g layers' inputs
// (stacked by the group's rerun forward) plus what that rerun adds around the layer backward it wraps: the
// inner scan's carried gradient dx (one x more; its constant RoPE tables get no gradient accumulators). Everything
// else at the peak (parameters, moments, gradients, the one layer's backward) is the same. So
// total(g) - total(0) = -(L - L/g - g) x + x.
TEST(NestedRemat, GroupsLowerTheLlama7bPeakByTheLayerInputsTheyDoNotHold) {
  const std::vector<std::string> base = {"model=llama2-7b", "per_device_batch_size=1", "max_target_length=4096",
                                         "remat_policy=full"};
  const cli::Config c = config(base);
  ASSERT_EQ(c.run.model.precision.compute, DType::f32);
  const int64_t L = c.run.model.num_decoder_layers, x = 1 * 4096 * c.run.model.emb_dim * 4;
  ASSERT_EQ(L, 32);
  const int64_t ungrouped = plan_total(base);
  std::map<int64_t, int64_t> total;
  for (int64_t g : {1, 2, 4, 8, 16}) {
    std::vector<std::string> o = base;
    o.push_back(fmt::format("layers_per_group={}", g));
    total[g] = plan_total(o);
    EXPECT_EQ(total[g] - ungrouped, -(L - L / g - g) * x + x) << "layers_per_group=" << g;
  }
  for (int64_t g : {2, 4, 8}) EXPECT_LT(total[g], ungrouped) << "layers_per_group=" << g;
  EXPECT_GT(total[1], ungrouped) << "groups of one layer hold L + 1 layer inputs";
  // The best group size is near sqrt(L) = 5.7: L/g + g is least at 4 and 8 (12), against 10 + ... at 2 and 16.
  const auto best = std::min_element(total.begin(), total.end(), [](auto& a, auto& b) { return a.second < b.second; });
  EXPECT_TRUE(best->first == 4 || best->first == 8) << best->first;
  EXPECT_EQ(total[4], total[8]);
}

// FLOPs of every layer's whole forward (a group's rerun), contractions and the rest.
std::pair<double, double> layers_forward(const testing_support::LayerFlops& t) {
  const double wo_gemm = 2 * t.N * t.F * t.D;
  return {t.L * (t.qkv_gemms() + t.scores_gemm() + t.context_gemm() + t.out_gemm() + 2 * t.wi_gemm() + wo_gemm),
          t.L * (2 * t.norm() + t.rope(t.Q) + t.rope(t.K) + t.probs() + 2 * t.residual_add() + t.silu_times_up())};
}

// tiny under minimal, groups of 2: the layers' backward recomputes what minimal does not keep (the norms, the
// probs and the context from the kept q, k, v, x + out_proj, silu(gate)·up), and each group's backward reruns the
// whole forward of its layers first (nothing crosses groups but their inputs). Both from the shapes.
TEST(NestedRemat, MinimalUnderGroupsRecomputesItsOwnPlusOneForwardAndPlansBelowMinimal) {
  const std::vector<std::string> grouped = {"model=tiny", "remat_policy=minimal", "layers_per_group=2"};
  const cli::Config c = config(grouped);
  const testing_support::LayerFlops t(c.run.model, c.run.shape);
  const double minimal_gemm = t.L * (t.scores_gemm() + t.context_gemm()),
               minimal_other = t.L * (2 * t.norm() + t.probs() + t.residual_add() + t.silu_times_up());
  const auto [forward_gemm, forward_other] = layers_forward(t);
  const compile::Compiled step = compiled(grouped);
  EXPECT_EQ(step.explanation.recompute_gemm_flops, minimal_gemm + forward_gemm);
  EXPECT_EQ(step.explanation.recompute_flops - step.explanation.recompute_gemm_flops, minimal_other + forward_other);
  EXPECT_EQ(step.explanation.group_recompute_flops, forward_gemm + forward_other);
  EXPECT_LT(plan_total(grouped), plan_total({"model=tiny", "remat_policy=minimal"}));
}

// `remat explain` under groups shows the two levels: across groups only the groups' inputs x (2 of them per
// step), inside one group's backward its 2 layers' inputs under full; the recompute split into the groups'
// rerun forward and the layers' own.
TEST(NestedRemat, ExplainShowsBothLevels) {
  const cli::Config c = config({"model=tiny", "remat_policy=full", "layers_per_group=2"});
  const testing_support::LayerFlops t(c.run.model, c.run.shape);
  const double x = 4 * t.N * t.D;
  const nlohmann::json j = nlohmann::json::parse(cli::explain_report(c, true)).at("groups");
  EXPECT_EQ(j.at("groups"), 2);
  EXPECT_EQ(j.at("layers"), 4);
  EXPECT_EQ(j.at("across_groups").at("saved").get<double>(), 2 * x);
  EXPECT_EQ(j.at("inside_a_group").at("saved").get<double>(), 2 * x);
  EXPECT_EQ(j.at("across_groups").at("offloaded").get<double>(), 0);
  const auto [forward_gemm, forward_other] = layers_forward(t);
  EXPECT_EQ(j.at("recompute_flops").at("group").get<double>(), forward_gemm + forward_other);
  const std::string text = cli::explain_report(c, false);
  EXPECT_NE(text.find("two levels: 2 groups of 2 layers\n"), std::string::npos) << text;
  EXPECT_NE(text.find("group region (policy nothing_saveable), runs 2x per step"), std::string::npos) << text;
}

// A group policy that keeps minimal's names but not the layers' inputs: each group's forward reruns anyway (its
// backward needs every layer's input), and the rerun makes those names again, so nothing more crosses groups
// than under nothing_saveable (the same plan) and `explain` says so. Keeping the inputs too, nothing reruns.
TEST(NestedRemat, AGroupPolicyKeepsAcrossGroupsOnlyWhatSparesTheRerun) {
  const std::vector<std::string> base = {"model=tiny", "remat_policy=minimal", "layers_per_group=2"};
  auto with = [&](const std::string& group_policy) {
    std::vector<std::string> o = base;
    o.push_back("group_remat_policy=" + group_policy);
    return compiled(o);
  };
  const compile::Compiled nothing = with("nothing_saveable"), names = with("minimal"),
                          inputs_too = with("save_only_these_names(decoder_layer_input, query_proj, key_proj, "
                                            "value_proj, out_proj, mlpwi_0, mlpwi_1)");
  EXPECT_EQ(plan::trace(names.plan, names.program), plan::trace(nothing.plan, nothing.program));
  const cli::Config c = config(base);
  const testing_support::LayerFlops t(c.run.model, c.run.shape);
  const double x = 4 * t.N * t.D, kept_per_layer = 4 * t.N * (t.Q + 2 * t.K + t.D + 2 * t.F);  // q, k, v, out, wi x2
  const nlohmann::json levels = names.explanation.json().at("groups");
  EXPECT_EQ(levels.at("across_groups").at("saved").get<double>(), 2 * x) << "only the 2 groups' inputs";
  EXPECT_GT(names.explanation.group_recompute_flops, 0);
  // Keeping the inputs and the names: no rerun, every layer's input and kept values cross groups (a group's
  // own input is its first layer's, in the stack: the backward no longer reads it apart).
  EXPECT_EQ(inputs_too.explanation.group_recompute_flops, 0);
  EXPECT_EQ(inputs_too.explanation.json().at("groups").at("across_groups").at("saved").get<double>(),
            t.L * (x + kept_per_layer));
  EXPECT_EQ(inputs_too.explanation.recompute_flops, with("nothing_saveable").explanation.recompute_flops -
                                                         nothing.explanation.group_recompute_flops);
}

// Every MaxText preset under groups of 2 on tiny: presets that keep different sets of residuals plan apart (the
// double scan no longer plans every policy as full does).
TEST(NestedRemat, PresetsWithDifferentSavedSetsPlanApartUnderGroups) {
  std::map<std::set<std::string>, std::string> saved_sets;  // saved set -> a preset keeping it
  std::map<std::string, std::string> plans;                   // preset -> its plan's trace
  for (const std::string& preset : rematerialize::preset_names()) {
    const compile::Compiled step = compiled({"model=tiny", "layers_per_group=2", "remat_policy=" + preset});
    std::set<std::string> kept;
    for (const rematerialize::ResidualRecord& r : step.explanation.residuals)
      if (r.policy == step.explanation.residuals.front().policy && !r.region_input && !r.alias &&
          r.residency != rematerialize::Residency::recompute)
        kept.insert(r.what + (r.residency == rematerialize::Residency::offload ? " (host)" : ""));
    plans[preset] = plan::trace(step.plan, step.program);
    saved_sets.emplace(kept, preset);
    for (const auto& [set, other] : saved_sets)
      if (set != kept) {
        EXPECT_NE(plans[preset], plans[other]) << preset << " plans as " << other << " does";
      }
  }
  EXPECT_GE(saved_sets.size(), 8u) << "the presets keep different sets";
}

}  // namespace
}  // namespace remat
