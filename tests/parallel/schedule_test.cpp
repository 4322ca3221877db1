// Pipeline schedules as data: the generators' schedules are valid and run to the end; each rank holds the
// microbatches the literature says it holds (GPipe all m on every rank, 1F1B min(p - s, m) on rank s,
// Megatron's interleaved warm-up + 1 in chunk units); the simulated bubble is (p-1)/(m+p-1), or
// (p-1)/(v·m+p-1) interleaved, computed here from the formula, exactly; broken schedules are refused naming the
// rank and the action; a small GPipe and a small interleaved grid are checked against ones worked out by hand.
#include "parallel/parallel.h"

#include "support/error_of.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>

namespace remat::parallel {
namespace {

using testing_support::error_of;

struct Case {
  ScheduleKind kind;
  PipelineShape shape;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  for (int64_t p : {1, 2, 4, 8})
    for (int64_t m : {8, 16}) {
      c.push_back({ScheduleKind::gpipe, {p, m, 1}});
      c.push_back({ScheduleKind::one_f_one_b, {p, m, 1}});
      c.push_back({ScheduleKind::zb_h1, {p, m, 1}});
      for (int64_t v : {2, 3}) c.push_back({ScheduleKind::interleaved_1f1b, {p, m, v}});
    }
  c.push_back({ScheduleKind::gpipe, {4, 3, 1}});  // fewer microbatches than stages
  c.push_back({ScheduleKind::gpipe, {4, 8, 2}});  // circular (MaxText's repeats)
  return c;
}

// Microbatch-chunks a rank stashes at most, from the schedules' definitions.
int64_t expected_in_flight(const Case& c, int64_t rank) {
  const int64_t p = c.shape.stages, m = c.shape.microbatches, v = c.shape.chunks;
  switch (c.kind) {
    case ScheduleKind::gpipe: return m * v;
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::zb_h1: return std::min(p - rank, m);  // 1F1B's order of forwards and B's
    case ScheduleKind::interleaved_1f1b: return std::min((p - rank - 1) * 2 + (v - 1) * p + 1, m * v);
  }
  return -1;
}

// Each virtual stage runs at its own costs (a remat policy per stage): a rank is busy m x the sum of its chunks'
// F + B, and with m = 1 the one microbatch passes every stage forward, then back, one after another.
TEST(Schedules, EachVirtualStageRunsAtItsOwnCosts) {
  for (const Case& c : cases()) {
    const Schedule s = make_schedule(c.kind, c.shape);
    const int64_t p = c.shape.stages, K = c.shape.virtual_stages();
    std::vector<Costs> costs;
    for (int64_t k = 0; k < K; ++k) costs.push_back({1.0 + static_cast<double>(k), 2.5 + 0.5 * static_cast<double>(k * k)});
    const Simulation t = simulate(s, costs);
    const std::string what = fmt::format("{} p={} m={} v={}", schedule_name(c.kind), p, c.shape.microbatches, c.shape.chunks);
    for (int64_t r = 0; r < p; ++r) {
      double busy = 0;
      for (int64_t k = r; k < K; k += p) busy += costs[static_cast<size_t>(k)].forward + costs[static_cast<size_t>(k)].backward;
      EXPECT_DOUBLE_EQ(t.ranks[static_cast<size_t>(r)].busy, static_cast<double>(c.shape.microbatches) * busy) << what << " rank " << r;
    }
  }
  for (const ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
    const Schedule s = make_schedule(kind, {.stages = 3, .microbatches = 1});
    const std::vector<Costs> costs = {{1, 2}, {3, 7}, {0.5, 4}};
    EXPECT_DOUBLE_EQ(simulate(s, costs).makespan, 1 + 2 + 3 + 7 + 0.5 + 4) << schedule_name(kind);
    EXPECT_NE(error_of([&] { simulate(s, std::vector<Costs>(2)); }).find("2 stage costs for 3 virtual stages"), std::string::npos);
  }
}

TEST(Schedules, EveryGeneratedScheduleRunsAndHoldsWhatItsDefinitionSays) {
  for (const Case& c : cases()) {
    const Schedule s = make_schedule(c.kind, c.shape);
    const double v = static_cast<double>(c.shape.chunks);
    const Simulation t = simulate(s, {1 / v, 2 / v});  // a chunk is 1/v of a stage's layers
    const std::string what = fmt::format("{} p={} m={} v={}", schedule_name(c.kind), c.shape.stages,
                                         c.shape.microbatches, c.shape.chunks);
    for (size_t r = 0; r < t.ranks.size(); ++r)
      EXPECT_EQ(t.ranks[r].peak_in_flight, expected_in_flight(c, static_cast<int64_t>(r))) << what << " rank " << r;
  }
}

// Time unit: a whole stage's forward; a chunk (1/v of the stage's layers) takes 1/v forward and 2/v backward. Every
// rank is busy v·m·(1/v + 2/v) = 3m. Its idle time is the pipeline's fill and drain, p - 1 chunk forwards and p - 1
// chunk backwards, (p-1)·3/v: with v chunks a step of the fill or drain crosses a chunk, not a stage (Megatron,
// Narayanan et al. 2021, §2.2.2), and with m % p == 0 the interleaved steady state adds no wait (each rank's warm-up
// leaves the next group of p microbatches ready). So the makespan is 3m + 3(p-1)/v and the bubble 3(p-1)/v / (3m +
// 3(p-1)/v) = (p-1)/(v·m + p-1); with v = 1 (GPipe, 1F1B) 3m + 3(p-1) and (p-1)/(m+p-1). The 2 x 2 x 2 grid below
// shows it slot by slot.
TEST(Schedules, BubbleIsTheClosedForm) {
  for (const Case& c : cases()) {
    if (c.kind == ScheduleKind::gpipe && c.shape.chunks > 1) continue;  // circular GPipe: no closed form here
    if (c.kind == ScheduleKind::interleaved_1f1b) {
      ASSERT_EQ(c.shape.microbatches % c.shape.stages, 0) << "the closed form needs m % p == 0";
    }
    const double p = static_cast<double>(c.shape.stages), m = static_cast<double>(c.shape.microbatches),
                 v = static_cast<double>(c.shape.chunks);
    const Simulation t = simulate(make_schedule(c.kind, c.shape), {1 / v, 2 / v});
    const std::string what = fmt::format("{} p={} m={} v={}", schedule_name(c.kind), p, m, v);
    EXPECT_NEAR(t.makespan, 3 * m + 3 * (p - 1) / v, 1e-9) << what;
    for (size_t r = 0; r < t.ranks.size(); ++r) {
      EXPECT_NEAR(t.ranks[r].busy, 3 * m, 1e-9) << what << " rank " << r;
      EXPECT_NEAR(t.bubble(r), (p - 1) / (v * m + p - 1), 1e-12) << what << " rank " << r;
    }
  }
}

// Interleaved, p = 2, m = 2, v = 2 (chunk forward 1/2, backward 1; a column is one chunk forward). Rank 0 warms up
// with (p-1)·2 + (v-1)·p = 4 forwards (microbatches 0, 1 through chunk 0, then chunk 1), rank 1 with 2. Rank 1 runs
// virtual stages 1 and 3: F0.1 (stage 3) waits for rank 0's F0.1 (stage 2, done after 3 columns), its B0.1 follows at
// once (stage 3 is the last), then F1.1 and B1.1; rank 0's B0.1 waits for rank 1's (done after 6 columns), B1.1 for
// rank 1's (done after 9); rank 1's chunk-0 backwards follow its B1.1 (their gradients came from rank 0 by then), and
// rank 0's chunk-0 backwards wait for those. Makespan 15 columns = 7.5 = 3m + 3(p-1)/v; each rank idles 3 columns:
// 20% = (p-1)/(v·m + p-1).
TEST(Schedules, GridOfASmallInterleavedScheduleIsTheOneWorkedOutByHand) {
  const Schedule s = make_schedule(ScheduleKind::interleaved_1f1b, {2, 2, 2});
  const Simulation t = simulate(s, {0.5, 1});
  EXPECT_EQ(t.makespan, 7.5);
  EXPECT_EQ(grid(s, t),
            "interleaved_1f1b schedule: 2 stages x 2 chunk(s), 2 microbatches; a column is one forward\n"
            "rank  0 | F0.0 F1.0 F0.1 F1.1 .    .    B0.1 B0.1 .    B1.1 B1.1 B0.0 B0.0 B1.0 B1.0\n"
            "rank  1 | .    F0.0 F1.0 F0.1 B0.1 B0.1 F1.1 B1.1 B1.1 B0.0 B0.0 B1.0 B1.0 .    .   \n"
            "rank  0: at most 4 microbatch-chunk(s) in flight, bubble 20.0%\n"
            "rank  1: at most 3 microbatch-chunk(s) in flight, bubble 20.0%\n");
}

// GPipe, p = 2, m = 2, forward 1, backward 2: rank 1's forwards trail rank 0's by one; rank 0's backwards
// wait for rank 1's; the makespan is (m + p - 1)(1 + 2) = 9, the bubble 3/9 on both ranks.
TEST(Schedules, GridOfASmallGPipeIsTheOneWorkedOutByHand) {
  const Schedule s = make_schedule(ScheduleKind::gpipe, {2, 2, 1});
  EXPECT_EQ(grid(s, simulate(s, {1, 2})),
            "gpipe schedule: 2 stages x 1 chunk(s), 2 microbatches; a column is one forward\n"
            "rank  0 | F0 F1 .  .  .  B0 B0 B1 B1\n"
            "rank  1 | .  F0 F1 B0 B0 B1 B1 .  . \n"
            "rank  0: at most 2 microbatch-chunk(s) in flight, bubble 33.3%\n"
            "rank  1: at most 2 microbatch-chunk(s) in flight, bubble 33.3%\n");
  const std::string picture = svg(s, simulate(s, {1, 2}));
  EXPECT_EQ(std::count(picture.begin(), picture.end(), '\n'), 2 + 8 + 2 + 1);  // header, 8 boxes, 2 rank names, end
}

TEST(Schedules, ActionsAroundEachComputeStepCarryItsTensors) {
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, {2, 2, 1});
  using A = Action;
  EXPECT_EQ(s.ranks[0], (std::vector<A>{{Step::forward, 0, 0}, {Step::send_activation, 0, 0, 1},
                                        {Step::forward, 1, 0}, {Step::send_activation, 1, 0, 1},
                                        {Step::recv_gradient, 0, 0, 1}, {Step::backward, 0, 0},
                                        {Step::recv_gradient, 1, 0, 1}, {Step::backward, 1, 0}}));
  EXPECT_EQ(s.ranks[1], (std::vector<A>{{Step::recv_activation, 0, 0, 0}, {Step::forward, 0, 0},
                                        {Step::backward, 0, 0}, {Step::send_gradient, 0, 0, 0},
                                        {Step::recv_activation, 1, 0, 0}, {Step::forward, 1, 0},
                                        {Step::backward, 1, 0}, {Step::send_gradient, 1, 0, 0}}));
}

TEST(Schedules, BrokenSchedulesAreRefusedNamingTheRankAndTheAction) {
  Schedule s = make_schedule(ScheduleKind::one_f_one_b, {2, 4, 1});
  Schedule early = s;  // rank 0 waits for a gradient before it has sent the activations that produce it
  auto& r0 = early.ranks[0];
  auto recv = std::find(r0.begin(), r0.end(), Action{Step::recv_gradient, 0, 0, 1});
  std::rotate(r0.begin(), recv, recv + 1);
  EXPECT_NE(error_of([&] { simulate(early, Costs{}); })
                .find("schedule 1f1b does not progress (deadlock): rank 0 at recv_gradient of microbatch 0 (chunk 0) with "
                      "rank 1; rank 1 at recv_activation of microbatch 0 (chunk 0) with rank 0"),
            std::string::npos)
      << error_of([&] { simulate(early, Costs{}); });
  Schedule swapped = s;  // rank 1 runs microbatch 1's forward before microbatch 0's
  auto& r1 = swapped.ranks[1];
  std::iter_swap(std::find(r1.begin(), r1.end(), Action{Step::forward, 0, 0}),
                 std::find(r1.begin(), r1.end(), Action{Step::forward, 1, 0}));
  EXPECT_NE(error_of([&] { simulate(swapped, Costs{}); })
                .find("schedule: rank 1 runs forward of microbatch 1 (chunk 0) where microbatch 0 comes next on that chunk"),
            std::string::npos)
      << error_of([&] { simulate(swapped, Costs{}); });
  Schedule lost = s;  // a backward dropped
  lost.ranks[1].erase(std::find(lost.ranks[1].begin(), lost.ranks[1].end(), Action{Step::backward, 3, 0}));
  EXPECT_NE(error_of([&] { simulate(lost, Costs{}); }).find("rank 1 chunk 0 runs 4 forwards, 3 backwards and 0 weight parts; 1f1b wants 4, 4 and 0"),
            std::string::npos);
}

TEST(Schedules, InvalidCombinationsAreConfigErrorsSayingWhatWorks) {
  auto check = [](ScheduleKind k, PipelineShape s, int64_t layers, int64_t per) {
    return error_of([&] { check_pipeline(k, s, layers, per); });
  };
  EXPECT_NE(check(ScheduleKind::one_f_one_b, {4, 2, 1}, 4, 1)
                .find("pipeline_schedule=1f1b needs num_pipeline_microbatches (2) >= ici_pipeline_parallelism (4): set "
                      "it to 4 or more, or use gpipe"),
            std::string::npos);
  EXPECT_NE(check(ScheduleKind::gpipe, {4, 8, 1}, 6, 1).find("base_num_decoder_layers (6) must equal ici_pipeline_parallelism (4)"),
            std::string::npos);
  EXPECT_NE(check(ScheduleKind::interleaved_1f1b, {4, 8, 1}, 4, 1).find("needs num_pipeline_repeats >= 2"),
            std::string::npos);
  EXPECT_NE(check(ScheduleKind::interleaved_1f1b, {4, 6, 2}, 8, 1).find("a multiple of ici_pipeline_parallelism (4): 4 or 8 would do"),
            std::string::npos)
      << check(ScheduleKind::interleaved_1f1b, {4, 6, 2}, 8, 1);
  EXPECT_EQ(check(ScheduleKind::interleaved_1f1b, {4, 8, 2}, 16, 2), "");
  EXPECT_NE(error_of([] { parse_schedule("zb-v"); }).find("unknown schedule 'zb-v'; choose gpipe, 1f1b, interleaved_1f1b or zb_h1"),
            std::string::npos);
}

}  // namespace
}  // namespace remat::parallel

namespace remat::parallel {
namespace {

// ZB-H1 (Qi et al., ICLR 2024): with each backward split into B (T_B) and W (T_W), every rank idles
// (p-1)(T_F + T_B - T_W) per step where 1F1B, running B and W as one backward, idles (p-1)(T_F + T_B + T_W) —
// the paper's closed forms, for T_W <= T_F — and every rank stashes as many microbatches as under 1F1B. Costs
// (T_F, T_B, T_W) in any unit; Costs::backward is the whole backward, T_B + T_W.
TEST(Schedules, ZeroBubbleH1IdlesTheClosedFormAndStashesAs1F1B) {
  const std::vector<std::array<double, 3>> ratios = {{1, 1, 1}, {2, 2, 1}, {3, 2, 1}, {2, 3, 2}, {1, 2, 0.5}, {1.5, 1, 1}};
  for (int64_t p : {2, 3, 4, 8})
    for (int64_t m : {p, 2 * p, p + 5})
      for (const auto& [f, b, w] : ratios) {
        const Costs costs{f, b + w, w};
        const std::string what = fmt::format("p={} m={} T_F={} T_B={} T_W={}", p, m, f, b, w);
        const Simulation zb = simulate(make_schedule(ScheduleKind::zb_h1, {p, m, 1}), costs);
        const Simulation one = simulate(make_schedule(ScheduleKind::one_f_one_b, {p, m, 1}), costs);
        for (size_t r = 0; r < static_cast<size_t>(p); ++r) {
          EXPECT_NEAR(zb.ranks[r].busy, static_cast<double>(m) * (f + b + w), 1e-9) << what;
          EXPECT_NEAR(zb.makespan - zb.ranks[r].busy, static_cast<double>(p - 1) * (f + b - w), 1e-9) << what << " rank " << r;
          EXPECT_NEAR(one.makespan - one.ranks[r].busy, static_cast<double>(p - 1) * (f + b + w), 1e-9) << what << " rank " << r;
          EXPECT_EQ(zb.ranks[r].peak_in_flight, one.ranks[r].peak_in_flight) << what << " rank " << r;
        }
      }
}

// p = 2, m = 2, T_F = T_B = T_W = 1. Rank 1 (the last stage) runs B0 at once, then F1 and B1, deferring W0 (one
// W per rank index): its B1 reaches rank 0 one slot sooner than under 1F1B. Rank 0 waits one slot for B0, fills
// the wait for B1's gradient with W0. Makespan 7 = 2·3 + (p-1)(1 + 1 - 1).
TEST(Schedules, GridOfASmallZeroBubbleScheduleIsTheOneWorkedOutByHand) {
  const Schedule s = make_schedule(ScheduleKind::zb_h1, {2, 2, 1});
  const Simulation t = simulate(s, Costs{1, 2, 1});
  EXPECT_EQ(t.makespan, 7);
  EXPECT_EQ(grid(s, t),
            "zb_h1 schedule: 2 stages x 1 chunk(s), 2 microbatches; a column is one forward\n"
            "rank  0 | F0 F1 .  B0 W0 B1 W1\n"
            "rank  1 | .  F0 B0 F1 B1 W0 W1\n"
            "rank  0: at most 2 microbatch-chunk(s) in flight, bubble 14.3%\n"
            "rank  1: at most 1 microbatch-chunk(s) in flight, bubble 14.3%\n");
  // A W before its B, and a W where the backward is not split, are refused.
  Schedule early = s;
  std::vector<Action>& rank0 = early.ranks[0];
  const auto w0 = std::find(rank0.begin(), rank0.end(), Action{Step::weight, 0, 0});
  ASSERT_NE(w0, rank0.end());
  rank0.erase(w0);
  rank0.insert(rank0.begin() + 1, Action{Step::weight, 0, 0});  // after F0
  EXPECT_NE(error_of([&] { simulate(early, Costs{}); }).find("rank 0 runs weight of microbatch 0 (chunk 0) before its backward"),
            std::string::npos);
  Schedule unsplit = s;
  unsplit.kind = ScheduleKind::one_f_one_b;
  EXPECT_NE(error_of([&] { simulate(unsplit, Costs{}); }).find("runs 2 forwards, 2 backwards and 2 weight parts; 1f1b wants 2, 2 and 0"),
            std::string::npos);
}

}  // namespace
}  // namespace remat::parallel
