// remat_policy=auto (search::search) against brute force over every placement of the searched names, planned
// by the real planner: the same optimum (least estimated cost, then least peak) under three budgets per model,
// one of them tight; the memory bound of the search (the lemma) below every plan.
#include "cli/config.h"
#include "search/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace remat {
namespace {

using search::Residency;

compile::Request request_of(const std::vector<std::string>& keys) {
  const cli::Config c = cli::load_config("", keys);
  return {.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer};
}

// Every placement, planned (3^k plans).
std::vector<search::Candidate> brute_force(const compile::Request& r, const std::vector<std::string>& names,
                                           const search::Rates& rates) {
  std::vector<search::Candidate> all;
  std::vector<Residency> p(names.size(), Residency::recompute);
  std::function<void(size_t)> each = [&](size_t i) {
    if (i == names.size()) return all.push_back(search::evaluate(r, names, p, {}, rates));
    for (Residency x : {Residency::recompute, Residency::save, Residency::offload}) p[i] = x, each(i + 1);
  };
  each(0);
  return all;
}

class AutoPolicy : public testing::TestWithParam<std::vector<std::string>> {};

TEST_P(AutoPolicy, EqualsTheBruteForceOptimumUnderEveryBudget) {
  const compile::Request r = request_of(GetParam());
  const search::Rates rates{.gemm_flops = 2e11, .other_flops = 5e9, .host_bandwidth = 2e10};
  std::vector<double> bytes;
  const std::vector<std::string> names = search::searched_names(r, &bytes);
  ASSERT_GE(names.size(), 5u);
  const std::vector<search::Candidate> all = brute_force(r, names, rates);
  // The lemma, on every placement: peak >= (peak - device bytes of the all-device placement) + device bytes.
  auto device_bytes = [&](const search::Candidate& c) {
    double b = 0;
    for (size_t i = 0; i < names.size(); ++i) b += c.placement[i] == Residency::save ? bytes[i] : 0;
    return b;
  };
  const search::Candidate& all_device = *std::find_if(all.begin(), all.end(), [](const search::Candidate& c) {
    return std::all_of(c.placement.begin(), c.placement.end(), [](Residency x) { return x == Residency::save; });
  });
  const double base = static_cast<double>(all_device.peak) - device_bytes(all_device);
  for (const search::Candidate& c : all) EXPECT_GE(static_cast<double>(c.peak), base + device_bytes(c)) << c.policy;

  std::vector<int64_t> peaks;
  for (const search::Candidate& c : all) peaks.push_back(c.peak);
  std::sort(peaks.begin(), peaks.end());
  peaks.erase(std::unique(peaks.begin(), peaks.end()), peaks.end());
  // Tight: only the smallest peak fits; middle; loose: all but the all-device placement's peak. (Under the double
  // scan every placement has the same peak — the inner layers' residuals live in the backward body either way —
  // so its loose budget is twice that.)
  const int64_t loose = peaks.size() > 1 ? peaks.back() - 1 : 2 * peaks.back();
  for (int64_t budget : {peaks.front(), peaks[peaks.size() / 2], loose}) {
    const search::Result got = search::search(r, {.device = budget}, rates);
    const search::Candidate* want = nullptr;
    for (const search::Candidate& c : all)
      if (c.peak <= budget && (!want || c.seconds < want->seconds || (c.seconds == want->seconds && c.peak < want->peak)))
        want = &c;
    ASSERT_TRUE(want != nullptr);
    ASSERT_TRUE(got.best.has_value()) << budget;
    EXPECT_EQ(got.best->seconds, want->seconds) << "budget " << budget << ": got " << got.best->policy << ", brute force "
                                                << want->policy;
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
  // A host limit below every offloading placement's host bytes: the answer offloads nothing.
  const search::Result no_host = search::search(r, {.device = peaks[peaks.size() / 2], .host = 1}, rates);
  if (no_host.best) {
    for (Residency x : no_host.best->placement) EXPECT_NE(x, Residency::offload);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, AutoPolicy,
    testing::Values(std::vector<std::string>{"model=tiny"},
                    std::vector<std::string>{"model=tiny", "base_num_kv_heads=2", "layers_per_group=2", "max_target_length=512"},
                    std::vector<std::string>{"model=llama2-7b", "per_device_batch_size=1", "max_target_length=4096"}),
    [](const testing::TestParamInfo<std::vector<std::string>>& i) {
      return i.index == 0 ? std::string("tiny") : i.index == 1 ? std::string("gqa_double_scan") : std::string("llama2_7b_4096");
    });

}  // namespace
}  // namespace remat
