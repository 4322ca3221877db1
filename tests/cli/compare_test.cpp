// `remat plan --compare` and the warnings of remat settings that do nothing or raise the plan total, on the tiny
// model. Each row is checked against `remat plan --json` run on its own with the row's overrides; the step's
// contraction FLOPs (the estimate's main term) against the model's shapes; each warning's totals against the two
// configs planned apart, and "does nothing" against the two printed reports.
#include "cli/commands.h"
#include "cli/config.h"
#include "plan/report.h"
#include "remat/layer_flops.h"
#include "support/command.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace remat::cli {
namespace {

using testing_support::Output;

// `remat ARGS` from the repository root; `redirect`: what its output is (default: stdout and stderr).
Output remat_cli(const std::string& args, const std::string& redirect = "2>&1") {
  return testing_support::run_command(fmt::format("cd '{}/..' && '{}' {} {}", REMAT_TEST_DATA, REMAT_BINARY, args, redirect));
}

Config tiny(const std::vector<std::string>& overrides) { return load_config("", overrides); }

nlohmann::json plan_json(const std::vector<std::string>& overrides) {
  return nlohmann::json::parse(plan_report(tiny(overrides), true, "", nullptr));
}

std::string total_of(const std::vector<std::string>& overrides) {
  return plan::bytes_str(static_cast<double>(plan_json(overrides)["total"].get<int64_t>()));
}

TEST(Compare, EachRowIsTheSeparatePlanOfItsOverrides) {
  Output o = remat_cli("plan --json --compare 'remat_policy=full,minimal_offloaded,save_only_these_names(query_proj, key_proj)' "
                       "--compare layers_per_group=0,2 host_bandwidth=1GB");
  ASSERT_EQ(o.status, 0) << o.text;
  const nlohmann::json rows = nlohmann::json::parse(o.text)["compare"]["rows"];
  const std::vector<std::string> policies = {"full", "minimal_offloaded", "save_only_these_names(query_proj, key_proj)"};
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<std::string> variant = {"remat_policy=" + policies[i / 2], fmt::format("layers_per_group={}", 2 * (i % 2))};
    EXPECT_EQ(rows[i]["variant"], variant);
    Output alone = remat_cli(fmt::format("plan --json '{}' {} host_bandwidth=1GB", variant[0], variant[1]), "2>/dev/null");
    ASSERT_EQ(alone.status, 0) << alone.text;
    const nlohmann::json j = nlohmann::json::parse(alone.text);
    EXPECT_EQ(rows[i]["total"], j["total"]) << variant[0] << " " << variant[1];
    EXPECT_EQ(rows[i]["lower_bound"], j["lower_bound"]);
    EXPECT_EQ(rows[i]["peak_step"], j["peak"]["step"]);
    // The estimate, from the row's own terms and rates; the host rate is the config's.
    const nlohmann::json& r = rows[i]["rates"];
    EXPECT_EQ(r["host_bandwidth"].get<double>(), 1e9);
    const double gemm = rows[i]["step_gemm_flops"], all = rows[i]["step_flops"], offloaded = rows[i]["offloaded_bytes"];
    EXPECT_DOUBLE_EQ(rows[i]["estimated_step_seconds"].get<double>(),
                     gemm / r["gemm_flops"].get<double>() + (all - gemm) / r["other_flops"].get<double>() + 2 * offloaded / 1e9);
  }
  // Without groups the policies differ: saving q and k keeps more than full; minimal_offloaded moves bytes to host.
  EXPECT_GT(rows[4]["total"].get<int64_t>(), rows[0]["total"].get<int64_t>());
  EXPECT_GT(rows[2]["offloaded_bytes"].get<double>(), 0);

  Output text = remat_cli("plan --compare remat_policy=full,minimal_offloaded");
  ASSERT_EQ(text.status, 0) << text.text;
  EXPECT_NE(text.text.find(fmt::format("remat_policy=minimal_offloaded  {:>11}", total_of({"remat_policy=minimal_offloaded"}))),
            std::string::npos) << text.text;
  EXPECT_NE(text.text.find("est. step s = contraction FLOPs"), std::string::npos) << text.text;
}

// The estimate's main term: with nothing recomputed (remat_policy=none) every contraction of the forward runs three
// times (forward, and the two gradients of its operands); `full` adds one forward of every layer but the MLP's Wo.
TEST(Compare, StepContractionFlopsAreThoseOfTheShapes) {
  auto gemm_flops = [](const std::string& policy) {
    const Config c = tiny({"remat_policy=" + policy});
    return compile_step(c, trainer::plan_run(c.run, 0)).explanation.step_gemm_flops;
  };
  const Config c = tiny({});
  const testing_support::LayerFlops t(c.run.model, c.run.shape);
  const double attention = t.qkv_gemms() + t.scores_gemm() + t.context_gemm() + t.out_gemm();
  const double logits = 2 * t.N * t.D * static_cast<double>(c.run.model.vocab_size);
  const double forward = t.L * (attention + 3 * t.wi_gemm()) + logits;
  EXPECT_EQ(gemm_flops("none"), 3 * forward);
  EXPECT_EQ(gemm_flops("full"), 3 * forward + t.L * (attention + 2 * t.wi_gemm()));
}

TEST(Compare, BadArgumentsAreErrorsNamingThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--compare layers_per_group", "--compare 'layers_per_group' is not KEY=V1,V2,..."},
      {"--compare layers_per_group=", "--compare 'layers_per_group=' has an empty value"},
      {"--compare layers_per_group=1,,2", "--compare 'layers_per_group=1,,2' has an empty value"},
      {"--compare layers_per_grup=1,2", "--compare variant layers_per_grup=1: unknown config key 'layers_per_grup'"},
      {"--compare layers_per_group=1,-2", "--compare variant layers_per_group=-2: config key 'layers_per_group' expects an integer >= 0"},
      {"--compare remat_policy=full,bogus", "--compare variant remat_policy=bogus: config key 'remat_policy': unknown remat policy 'bogus'"},
      {"--compare remat_policy=auto", "--compare variant remat_policy=auto: remat_policy=auto is not compared"},
      {"--compare fusion=true --compare fusion=false", "--compare names 'fusion' twice"},
      {"ici_pipeline_parallelism=2 --compare fusion=true,false", "remat plan --compare under pipeline parallelism (ici_pipeline_parallelism=2) is not supported"},
      {"--compare fusion=true --timeline x.svg", "remat plan --compare prints a table of plans and takes no --timeline"},
  };
  for (const auto& [args, error] : cases) {
    Output o = remat_cli("plan " + args);
    EXPECT_EQ(o.status, 2) << args << "\n" << o.text;
    EXPECT_EQ(o.text.rfind("error: " + error, 0), 0u) << args << "\n" << o.text;
  }
}

// mlpwo (the MLP's output) is read by no gradient: the next add's gradient passes through, the next norm reads the
// sum. Saving it saves nothing: the same plan as full.
TEST(SettingWarnings, APolicyWhoseNamesTheBackwardNeverReadsDoesNothing) {
  const std::string policy = "remat_policy=save_only_these_names(mlpwo)";
  EXPECT_EQ(setting_warnings(tiny({policy}), 0),
            std::vector<std::string>{fmt::format("{} does nothing: the plan is identical to remat_policy=full (total {})",
                                                 policy, total_of({"remat_policy=full"}))});
  // The printed reports agree but for their titles.
  auto body = [](const std::string& p) {
    const std::string r = plan_report(tiny({p}), false, "", nullptr);
    return r.substr(r.find('\n'));
  };
  EXPECT_EQ(body(policy), body("remat_policy=full"));
  // Offloading it does nothing either, against saving it on device (and against full).
  const std::string offloaded = "remat_policy=save_and_offload_only_these_names(save=[], offload=[mlpwo])";
  EXPECT_EQ(setting_warnings(tiny({offloaded}), 0),
            (std::vector<std::string>{
                fmt::format("{} does nothing: the plan is identical to remat_policy=full (total {})", offloaded, total_of({offloaded})),
                fmt::format("offloading in {} does nothing: the plan is identical to the same names saved on device (total {})",
                            offloaded, total_of({offloaded}))}));
  // Settings that change the plan and do not raise it say nothing.
  for (const char* quiet : {"remat_policy=full", "remat_policy=minimal", "remat_policy=minimal_offloaded", "num_vocab_tiling=4"})
    EXPECT_EQ(setting_warnings(tiny({quiet}), 0), std::vector<std::string>{}) << quiet;
}

// tiny has L = 4 layers; one group of 4 (> √L) holds every layer input in its backward as no groups do, and its
// input and its recompute besides.
TEST(SettingWarnings, AGroupLargerThanTheRootOfTheLayersRaisesThePlanTotal) {
  const std::string with = total_of({"layers_per_group=4"}), without = total_of({"layers_per_group=0"});
  EXPECT_GT(plan_json({"layers_per_group=4"})["total"].get<int64_t>(), plan_json({"layers_per_group=0"})["total"].get<int64_t>());
  const std::string warning =
      fmt::format("layers_per_group=4 raises the plan total: {} vs {} without it (layers_per_group=0)", with, without);
  EXPECT_EQ(setting_warnings(tiny({"layers_per_group=4"}), 0), std::vector<std::string>{warning});
  // `remat plan` and `remat train` print it on stderr, once.
  Output plan = remat_cli("plan layers_per_group=4", "2>&1 >/dev/null");
  EXPECT_EQ(plan.text, "warning: " + warning + "\n");
  testing_support::TempDir dir;
  Output train = remat_cli(fmt::format("train layers_per_group=4 steps=1 eval_steps=1 sample_length=0 per_device_batch_size=1 "
                                       "base_output_directory='{}'", dir.path.string()), "2>&1 >/dev/null");
  EXPECT_EQ(train.status, 0) << train.text;
  EXPECT_EQ(train.text.find("warning: layers_per_group=4 raises the plan total: "), 0u) << train.text;
}

}  // namespace
}  // namespace remat::cli
