// Validation and simulation of a schedule: every rank's actions run in order against the compute costs; a
// receive waits for its send. The first error names the rank and the action.
#include "parallel/parallel.h"

#include "base/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

namespace remat::parallel {
namespace {

std::string action_str(const Action& a) {
  std::string s = fmt::format("{} of microbatch {} (chunk {})", step_name(a.step), a.microbatch, a.chunk);
  return a.peer < 0 ? s : s + fmt::format(" with rank {}", a.peer);
}

// Each virtual stage runs every microbatch forward once and backward once, in microbatch order, on its rank,
// backward after forward; where the schedule splits backwards, the weight part once, in order, after the backward
// (elsewhere none).
void check_counts(const Schedule& s) {
  const PipelineShape& shape = s.shape;
  CHECK(static_cast<int64_t>(s.ranks.size()) == shape.stages, "schedule: {} rank lists for {} stages", s.ranks.size(),
        shape.stages);
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    std::vector<int64_t> forwards(static_cast<size_t>(shape.chunks), 0), backwards = forwards, weights = forwards;
    for (const Action& a : s.ranks[r]) {
      if (a.step != Step::forward && a.step != Step::backward && a.step != Step::weight) continue;
      CHECK(a.chunk >= 0 && a.chunk < shape.chunks, "schedule: rank {} runs {}: no such chunk", r, action_str(a));
      const size_t c = static_cast<size_t>(a.chunk);
      int64_t& next = a.step == Step::forward ? forwards[c] : a.step == Step::backward ? backwards[c] : weights[c];
      CHECK(a.microbatch == next, "schedule: rank {} runs {} where microbatch {} comes next on that chunk", r,
            action_str(a), next);
      CHECK(a.step == Step::forward || a.microbatch < forwards[c], "schedule: rank {} runs {} before its forward", r,
            action_str(a));
      CHECK(a.step != Step::weight || a.microbatch < backwards[c], "schedule: rank {} runs {} before its backward", r,
            action_str(a));
      ++next;
    }
    const int64_t m = shape.microbatches, w = splits_backward(s.kind) ? m : 0;
    for (size_t c = 0; c < static_cast<size_t>(shape.chunks); ++c)
      CHECK(forwards[c] == m && backwards[c] == m && weights[c] == w,
            "schedule: rank {} chunk {} runs {} forwards, {} backwards and {} weight parts; {} wants {}, {} and {}", r,
            c, forwards[c], backwards[c], weights[c], schedule_name(s.kind), m, m, w);
  }
}

struct Message {
  int64_t microbatch, chunk;  // as the receiver names them: its chunk
  double time;
  size_t send;                       // the send's index in its rank's list
  std::vector<int64_t> clock;        // the sender's vector clock after the send
};

}  // namespace

Simulation simulate(const Schedule& s, const Costs& costs) { return simulate(s, std::span(&costs, 1)); }

Simulation simulate(const Schedule& s, std::span<const Costs> stage_costs) {
  CHECK(stage_costs.size() == 1 || stage_costs.size() == static_cast<size_t>(s.shape.virtual_stages()),
        "schedule: {} stage costs for {} virtual stages (give one, or one per virtual stage)", stage_costs.size(),
        s.shape.virtual_stages());
  check_counts(s);
  const int64_t p = s.shape.stages;
  // Channels (from, to, gradient?) carry messages in the order they were sent.
  std::map<std::tuple<int64_t, int64_t, bool>, std::deque<Message>> channels;
  Simulation sim;
  sim.ranks.resize(s.ranks.size());
  std::vector<size_t> next(s.ranks.size(), 0);
  std::vector<double> clock(s.ranks.size(), 0);
  std::vector<int64_t> in_flight(s.ranks.size(), 0);
  // Vector clocks: known[r][q] = how many of rank q's actions rank r knows are done (its own, and others' as
  // messages tell). Kept after each action, with where each send was received, to find when a sender knows.
  const size_t n = s.ranks.size();
  std::vector<std::vector<int64_t>> known(n, std::vector<int64_t>(n, 0));
  std::vector<std::vector<std::vector<int64_t>>> known_after(n);
  std::vector<std::map<size_t, std::pair<size_t, size_t>>> received_at(n);  // send index -> (rank, recv index)
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < s.ranks.size(); ++r) {
      for (; next[r] < s.ranks[r].size(); ++next[r]) {
        const Action& a = s.ranks[r][next[r]];
        const int64_t me = static_cast<int64_t>(r);
        if (a.step == Step::send_activation || a.step == Step::send_gradient) {
          const bool gradient = a.step == Step::send_gradient;
          // The receiver's chunk: the next virtual stage (activation) or the previous one (gradient).
          const int64_t k = a.chunk * p + me + (gradient ? -1 : 1);
          known[r][r] = static_cast<int64_t>(next[r]) + 1;
          channels[{me, a.peer, gradient}].push_back({a.microbatch, k / p, clock[r], next[r], known[r]});
        } else if (a.step == Step::recv_activation || a.step == Step::recv_gradient) {
          std::deque<Message>& q = channels[{a.peer, me, a.step == Step::recv_gradient}];
          if (q.empty()) break;  // waits for the send
          const Message m = q.front();
          q.pop_front();
          CHECK(m.microbatch == a.microbatch && m.chunk == a.chunk,
                "schedule: rank {} runs {} but the next message from rank {} is for microbatch {} (chunk {})", r,
                action_str(a), a.peer, m.microbatch, m.chunk);
          clock[r] = std::max(clock[r], m.time);
          for (size_t q = 0; q < n; ++q) known[r][q] = std::max(known[r][q], m.clock[q]);
          received_at[static_cast<size_t>(a.peer)][m.send] = {r, next[r]};
        } else {
          const Costs& costs = stage_costs[stage_costs.size() == 1 ? 0 : static_cast<size_t>(a.chunk * p + me)];
          const bool split = splits_backward(s.kind);
          const double d = a.step == Step::forward    ? costs.forward
                           : a.step == Step::weight   ? costs.weight
                           : split                    ? costs.backward - costs.weight
                                                      : costs.backward;
          RankTimeline& t = sim.ranks[r];
          t.compute.push_back({clock[r], clock[r] + d, a});
          t.busy += d;
          clock[r] += d;
          in_flight[r] += a.step == Step::forward ? 1 : a.step == Step::backward ? -1 : 0;
          t.in_flight.push_back(in_flight[r]);
          t.peak_in_flight = std::max(t.peak_in_flight, in_flight[r]);
        }
        known[r][r] = static_cast<int64_t>(next[r]) + 1;
        known_after[r].push_back(known[r]);
        progress = true;
      }
    }
  }
  std::vector<std::string> stuck;
  for (size_t r = 0; r < s.ranks.size(); ++r)
    if (next[r] < s.ranks[r].size()) stuck.push_back(fmt::format("rank {} at {}", r, action_str(s.ranks[r][next[r]])));
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  CHECK(stuck.empty(), "schedule {} does not progress (deadlock): {}; the grid so far:\n{}", schedule_name(s.kind),
        fmt::join(stuck, "; "), grid(s, sim));
  for (const auto& [channel, q] : channels)
    CHECK(q.empty(), "schedule: {} message(s) from rank {} to rank {} are never received", q.size(), std::get<0>(channel),
          std::get<1>(channel));
  // A send is known received after the sender's first action whose clock covers the matching receive.
  sim.send_known_received.resize(n);
  for (size_t r = 0; r < n; ++r) {
    sim.send_known_received[r].assign(s.ranks[r].size(), -1);
    for (const auto& [send, at] : received_at[r]) {
      const auto [q, recv] = at;
      int64_t& done = sim.send_known_received[r][send];
      done = static_cast<int64_t>(s.ranks[r].size());
      for (size_t k = send + 1; k < s.ranks[r].size(); ++k)
        if (known_after[r][k][q] > static_cast<int64_t>(recv)) {
          done = static_cast<int64_t>(k);
          break;
        }
    }
  }
  return sim;
}

}  // namespace remat::parallel
