// `remat plan` under interleaved 1F1B: each rank's messages, counted from the virtual stages it owns. With p
// ranks and v chunks, rank r runs virtual stages r, r + p, ..., r + (v-1)p of K = p·v; per microbatch a virtual
// stage k sends its activation to k + 1 (k < K - 1) and its input's gradient to k - 1 (k > 0), and receives the
// same from them. So rank r sends m·(2v - [r = p-1] - [r = 0]) messages and receives as many, each one
// microbatch's activation [B, T, D] in f32; the bubble of equal chunks is (p-1)/(v·m + p-1).
#include "cli/commands.h"
#include "cli/config.h"
#include "exec/executable.h"
#include "support/command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace remat {
namespace {

TEST(PipelineCli, InterleavedRanksSendAndReceiveTheirVirtualStagesMessages) {
  const int p = 4, m = 8, v = 2;
  const testing_support::Output o = testing_support::run_command(fmt::format(
      "'{}' plan base_num_decoder_layers={} ici_pipeline_parallelism={} num_pipeline_microbatches={} "
      "num_pipeline_repeats={} pipeline_schedule=interleaved_1f1b num_layers_per_pipeline_stage=1 --json 2>&1",
      REMAT_BINARY, p * v, p, m, v));
  ASSERT_EQ(o.status, 0) << o.text;
  const nlohmann::json ranks = nlohmann::json::parse(o.text).at("pipeline").at("ranks");
  ASSERT_EQ(ranks.size(), static_cast<size_t>(p));
  // base.yml: per_device_batch_size 16 x 4 ranks / 8 microbatches = 8 sequences of 128 tokens, D = 128, f32.
  const double message = 4.0 * 8 * 128 * 128;
  for (int r = 0; r < p; ++r) {
    const nlohmann::json& comm = ranks[static_cast<size_t>(r)].at("communication").at("by_op");
    const int messages = m * (2 * v - (r == p - 1) - (r == 0));
    for (const char* op : {"send", "recv"}) {
      ASSERT_TRUE(comm.contains(op)) << "rank " << r << ": " << comm.dump();
      EXPECT_EQ(comm.at(op).at("count").get<int>(), messages) << op << " rank " << r;
      EXPECT_EQ(comm.at(op).at("bytes").get<double>(), messages * message) << op << " rank " << r;
    }
    EXPECT_NEAR(ranks[static_cast<size_t>(r)].at("bubble").get<double>(), (p - 1.0) / (v * m + p - 1.0), 1e-12)
        << "rank " << r;
  }
}

// `remat plan --json`'s pipeline object under `keys`: the schedule's costs, each rank's plan.
nlohmann::json plan_pipeline(const std::string& keys) {
  const testing_support::Output o = testing_support::run_command(fmt::format("'{}' plan {} --json 2>&1", REMAT_BINARY, keys));
  EXPECT_EQ(o.status, 0) << o.text;
  return o.status == 0 ? nlohmann::json::parse(o.text).at("pipeline")
                       : nlohmann::json{{"ranks", nlohmann::json::array()}, {"costs", nlohmann::json::array()}};
}

nlohmann::json plan_ranks(const std::string& keys) { return plan_pipeline(keys).at("ranks"); }

// Under 1F1B rank r holds the activations of up to p - r microbatches at once, so the policy rank 0 needs to fit
// is not the cheapest that fits the others. A rank's program holds only its own chunks: under
// pipeline_stage_remat_policies each rank plans as it does when its entry is everyone's policy. So the per-stage
// optimum under a budget is, rank by rank, the policy of least recompute that fits; here one policy for all
// either does not fit (minimal: rank 0) or recomputes more (full: ranks 1-3).
TEST(PipelineCli, PerStagePoliciesFitABudgetThatOnePolicyForAllDoesNotFitOrFitsRecomputingMore) {
  const int p = 4;
  const std::string pipeline = "base_num_decoder_layers=8 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
                               "pipeline_schedule=1f1b logits_via_embedding=false";
  const std::vector<std::string> policies = {"full", "minimal"};  // recompute: full > minimal
  std::map<std::string, nlohmann::json> alone;  // policy -> each rank's plan with it everywhere
  for (const std::string& policy : policies) {
    alone[policy] = plan_ranks(pipeline + " remat_policy=" + policy);
    ASSERT_EQ(alone[policy].size(), static_cast<size_t>(p)) << policy;
  }
  auto total = [&](const std::string& policy, int r) { return alone[policy][static_cast<size_t>(r)].at("total").get<double>(); };
  auto recompute = [&](const std::string& policy, int r) {
    return alone[policy][static_cast<size_t>(r)].at("recompute_flops").get<double>();
  };
  // The budget: rank 0 under full, the others under minimal.
  double budget = total("full", 0);
  for (int r = 1; r < p; ++r) budget = std::max(budget, total("minimal", r));
  std::vector<std::string> best;  // rank by rank: the least recompute that fits
  double best_recompute = 0;
  for (int r = 0; r < p; ++r) {
    std::string pick;
    for (const std::string& policy : policies)
      if (total(policy, r) <= budget && (pick.empty() || recompute(policy, r) < recompute(pick, r))) pick = policy;
    ASSERT_FALSE(pick.empty()) << "rank " << r;
    best.push_back(pick);
    best_recompute += recompute(pick, r);
  }
  EXPECT_EQ(best, (std::vector<std::string>{"full", "minimal", "minimal", "minimal"}));
  EXPECT_GT(total("minimal", 0), budget) << "minimal for all stages does not fit rank 0";
  double full_recompute = 0;
  for (int r = 0; r < p; ++r) {
    EXPECT_LE(total("full", r), budget) << "full for all stages fits (rank " << r << ")";
    full_recompute += recompute("full", r);
  }
  EXPECT_GT(full_recompute, best_recompute) << "full for all stages recomputes more";

  // The per-stage list: every rank plans as with its policy alone, and shows it.
  const nlohmann::json mixed_plan =
      plan_pipeline(fmt::format("{} pipeline_stage_remat_policies={}", pipeline, fmt::join(best, ",")));
  const nlohmann::json& mixed = mixed_plan.at("ranks");
  ASSERT_EQ(mixed.size(), static_cast<size_t>(p));
  // The simulator's costs are each stage's: full's backward runs its forward again, minimal's little of it.
  const nlohmann::json& costs = mixed_plan.at("costs");
  ASSERT_EQ(costs.size(), static_cast<size_t>(p));
  EXPECT_EQ(costs[0].at("forward"), costs[1].at("forward"));
  EXPECT_GT(costs[0].at("backward").get<double>(), costs[1].at("backward").get<double>());
  EXPECT_EQ(costs[1], costs[3]);
  for (int r = 0; r < p; ++r) {
    const nlohmann::json& rank = mixed[static_cast<size_t>(r)];
    const std::string& policy = best[static_cast<size_t>(r)];
    EXPECT_EQ(rank.at("remat_policy").get<std::string>(), policy) << "rank " << r;
    EXPECT_EQ(rank.at("total").get<double>(), total(policy, r)) << "rank " << r;
    EXPECT_EQ(rank.at("recompute_flops").get<double>(), recompute(policy, r)) << "rank " << r;
    EXPECT_LE(rank.at("total").get<double>(), budget) << "rank " << r;
  }
  // The text shows each rank's policy; one entry per rank or per virtual stage, nothing else.
  const testing_support::Output text = testing_support::run_command(fmt::format(
      "'{}' plan {} pipeline_stage_remat_policies=full,minimal,minimal,minimal 2>&1", REMAT_BINARY, pipeline));
  ASSERT_EQ(text.status, 0) << text.text;
  EXPECT_NE(text.text.find("pipeline_stage_remat_policies full,minimal,minimal,minimal"), std::string::npos) << text.text;
  EXPECT_NE(text.text.find("full\n"), std::string::npos) << text.text;
  const testing_support::Output three = testing_support::run_command(fmt::format(
      "'{}' plan {} pipeline_stage_remat_policies=full,minimal,minimal 2>&1", REMAT_BINARY, pipeline));
  EXPECT_NE(three.status, 0);
  EXPECT_NE(three.text.find("has 3 entries: give one per rank (4) or one per virtual stage"), std::string::npos)
      << three.text;
  const testing_support::Output with_auto = testing_support::run_command(fmt::format(
      "'{}' plan {} pipeline_stage_remat_policies=full,auto,full,full 2>&1", REMAT_BINARY, pipeline));
  EXPECT_NE(with_auto.status, 0);
  EXPECT_NE(with_auto.text.find("entry 1: auto is not an entry; drop this key and set remat_policy=auto"),
            std::string::npos)
      << with_auto.text;
  const testing_support::Output no_pipeline = testing_support::run_command(
      fmt::format("'{}' plan pipeline_stage_remat_policies=full,minimal 2>&1", REMAT_BINARY));
  EXPECT_NE(no_pipeline.status, 0);
  EXPECT_NE(no_pipeline.text.find("there is no pipeline (ici_pipeline_parallelism=1)"), std::string::npos)
      << no_pipeline.text;
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// remat_policy=auto under a pipeline places each rank's names: every rank fits the budget, rank 0 (four
// microbatches stashed at its peak) keeps fewer names on device than rank 3 (one), and the printed list, given
// back as pipeline_stage_remat_policies, plans to the same totals.
TEST(PipelineCli, AutoPlacesEachRanksNamesAndPrintsTheListThatReproducesIt) {
  const std::string pipeline = "base_num_decoder_layers=8 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
                               "pipeline_schedule=1f1b logits_via_embedding=false";
  const double budget = 50.0 * 1024 * 1024;
  const nlohmann::json ranks = plan_ranks(pipeline + " remat_policy=auto hbm_limit=50MiB");
  ASSERT_EQ(ranks.size(), 4u);
  std::vector<std::string> policies;
  for (const nlohmann::json& rank : ranks) {
    policies.push_back(rank.at("remat_policy").get<std::string>());
    EXPECT_LE(rank.at("total").get<double>(), budget) << policies.back();
    EXPECT_EQ(policies.back().rfind("custom(", 0), 0u) << policies.back();
  }
  auto on_device = [](const std::string& policy) {
    size_t n = 0;
    for (size_t at = policy.find("=device"); at != std::string::npos; at = policy.find("=device", at + 1)) ++n;
    return n;
  };
  EXPECT_LT(on_device(policies[0]), on_device(policies[3])) << policies[0] << " vs " << policies[3];
  std::string list;
  for (const std::string& p : policies) list += (list.empty() ? "" : ",") + p;
  const nlohmann::json given = plan_ranks(fmt::format("{} \"pipeline_stage_remat_policies={}\"", pipeline, list));
  ASSERT_EQ(given.size(), 4u);
  for (size_t r = 0; r < 4; ++r) EXPECT_EQ(given[r].at("total"), ranks[r].at("total")) << "rank " << r;
  const testing_support::Output text = testing_support::run_command(
      fmt::format("'{}' plan {} remat_policy=auto hbm_limit=50MiB 2>&1", REMAT_BINARY, pipeline));
  ASSERT_EQ(text.status, 0) << text.text;
  for (const char* line : {"pipeline rank 0: remat_policy=auto under hbm_limit 50.00 MiB", "pipeline rank 3: ",
                           "\npipeline_stage_remat_policies: custom(", "every rank fits"})
    EXPECT_NE(text.text.find(line), std::string::npos) << line << "\n" << text.text;
}

}  // namespace
}  // namespace remat

namespace remat {
namespace {

// --search-pipeline against brute force: every configuration of the space (2 and 4 stages, 4 and 8
// microbatches, the four schedules with every chunk count, full / minimal / none per rank) planned by `remat
// plan`'s own report with its pipeline_stage_remat_policies list, the least simulated step per sequence among
// those whose every rank fits; the search's answer and each schedule's best are the same, with fewer rank plans.
// Hundreds of plans: the release build only (Makefile RELEASE_ONLY).
TEST(PipelineCli, SearchPipelineEqualsTheBruteForceOverItsSpace) {
  const std::vector<std::string> base = {"base_num_decoder_layers=4", "logits_via_embedding=false", "hbm_limit=44MiB"};
  const std::vector<std::string> policies = {"full", "minimal", "none"};
  const testing_support::Output o = testing_support::run_command(fmt::format(
      "'{}' plan {} --search-pipeline --stages 2,4 --microbatches 4,8 --policies full,minimal,none --json 2>&1",
      REMAT_BINARY, fmt::join(base, " ")));
  ASSERT_EQ(o.status, 0) << o.text;
  const nlohmann::json got = nlohmann::json::parse(o.text).at("search_pipeline");
  std::map<std::string, double> best;  // per schedule: least per-sequence step
  int plans = 0, fitting = 0, rank_plans = 0;
  for (const char* schedule : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"})
    for (int64_t p : {2, 4})
      for (int64_t m : {4, 8})
        for (int64_t v = 1; p * v <= 4; ++v) {
          if ((std::string(schedule) == "interleaved_1f1b") != (v > 1) || 4 % (p * v) != 0 || m < p) continue;
          std::vector<size_t> pick(static_cast<size_t>(p), 0);
          for (bool more = true; more;) {
            std::vector<std::string> list;
            for (size_t i : pick) list.push_back(policies[i]);
            std::vector<std::string> keys = base;
            for (const std::string& k :
                 {fmt::format("pipeline_schedule={}", schedule), fmt::format("ici_pipeline_parallelism={}", p),
                  fmt::format("num_pipeline_microbatches={}", m), fmt::format("num_pipeline_repeats={}", v),
                  fmt::format("pipeline_stage_remat_policies={}", fmt::join(list, ","))})
              keys.push_back(k);
            bool fits = false;
            const nlohmann::json plan =
                nlohmann::json::parse(cli::plan_report(cli::load_config("", keys), true, "", &fits)).at("pipeline");
            ++plans, rank_plans += static_cast<int>(p);
            if (fits) {
              ++fitting;
              // base.yml: per_device_batch_size 16, so a replica's step is 16·p sequences.
              const double per_sequence = plan.at("makespan").get<double>() / (16.0 * static_cast<double>(p));
              auto [it, fresh] = best.try_emplace(schedule, per_sequence);
              if (!fresh) it->second = std::min(it->second, per_sequence);
            }
            size_t r = 0;
            while (r < pick.size() && ++pick[r] == policies.size()) pick[r++] = 0;
            more = r < pick.size();
          }
        }
  ASSERT_GT(fitting, 0);
  ASSERT_LT(fitting, plans) << "the budget should leave some configurations out";
  double least = INFINITY;
  for (const auto& [schedule, per_sequence] : best) {
    ASSERT_TRUE(got.at("schedules").contains(schedule)) << schedule;
    EXPECT_DOUBLE_EQ(got.at("schedules").at(schedule).at("per_sequence").get<double>(), per_sequence) << schedule;
    least = std::min(least, per_sequence);
  }
  EXPECT_EQ(got.at("schedules").size(), best.size());
  EXPECT_DOUBLE_EQ(got.at("best").at("per_sequence").get<double>(), least);
  EXPECT_LT(got.at("planned").get<int>(), rank_plans) << "the search's rank plans against the brute force's";
}

}  // namespace
}  // namespace remat
