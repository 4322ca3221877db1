#include "trainer/trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

namespace remat::trainer {
namespace {

std::string action_name(const parallel::Action& a, bool chunks) {
  const std::string mb = chunks ? fmt::format("{}.{}", a.microbatch, a.chunk) : std::to_string(a.microbatch);
  switch (a.step) {
    case parallel::Step::forward: return "F" + mb;
    case parallel::Step::backward: return "B" + mb;
    case parallel::Step::weight: return "W" + mb;
    default: return fmt::format("{} {} (rank {})", parallel::step_name(a.step), mb, a.peer);
  }
}

nlohmann::json event(const std::string& name, double start, double end, double origin, int64_t rank, nlohmann::json args) {
  return {{"name", name}, {"ph", "X"}, {"pid", 0}, {"tid", rank}, {"ts", (start - origin) * 1e6},
          {"dur", (end - start) * 1e6}, {"args", std::move(args)}};
}

}  // namespace

RankTrace rank_trace(const exec::Profile& profile, const std::vector<train::ActionSpan>& actions, int64_t rank,
                     double start, double end) {
  RankTrace t;
  t.start = start;
  t.wall = end - start;
  bool chunks = false;
  for (const train::ActionSpan& a : actions) chunks = chunks || a.action.chunk > 0;
  // The action of each kernel call: the span holding its op's origin (spans are in tracing order, so their
  // origins increase); a recompute (its op's origin) belongs to the backward part of the same microbatch and
  // chunk running then: the one of the call before it, else the backward.
  int running = -1;
  auto index_of = [&](const ir::Node& n) -> int {
    const train::ActionSpan* span = train::action_of(actions, n.origin);
    if (!span) return -1;
    const parallel::Action& a = span->action;
    if (!n.recomputed || a.step != parallel::Step::forward) return running = static_cast<int>(span - actions.data());
    auto serves = [&](size_t k, parallel::Step step) {
      const parallel::Action& o = actions[k].action;
      return o.step == step && o.microbatch == a.microbatch && o.chunk == a.chunk;
    };
    if (running >= 0 && serves(static_cast<size_t>(running), parallel::Step::weight)) return running;
    for (size_t k = 0; k < actions.size(); ++k)
      if (serves(k, parallel::Step::backward)) return running = static_cast<int>(k);
    return -1;
  };
  std::map<int, std::pair<double, double>> spans;  // action -> first start, last end of its kernel calls
  for (const exec::Profile::Call& c : profile.timeline) {
    nlohmann::json args{{"scope", c.node->scope}};
    if (!c.operands.empty()) {  // a contraction: its operands' types and its rate, to set against the matmul floor
      std::vector<std::string> types;
      for (const ir::Type& o : c.operands) types.push_back(ir::type_str(o));
      args["operands"] = fmt::format("{}", fmt::join(types, " "));
      args["GFLOP/s"] = c.end > c.start ? c.flops / (c.end - c.start) / 1e9 : 0.0;
    }
    t.events.push_back(event(std::string(ir::op_name(c.node->op)), c.start, c.end, start, rank, std::move(args)));
    if (actions.empty()) {
      t.busy += c.end - c.start;
      continue;
    }
    const int a = index_of(*c.node);
    if (a < 0) continue;
    auto [it, fresh] = spans.try_emplace(a, c.start, c.end);
    it->second = {std::min(it->second.first, c.start), std::max(it->second.second, c.end)};
  }
  for (const auto& [a, span] : spans) {
    const parallel::Action& action = actions[static_cast<size_t>(a)].action;
    const bool compute = action.step == parallel::Step::forward || action.step == parallel::Step::backward ||
                         action.step == parallel::Step::weight;
    if (compute) {
      t.busy += span.second - span.first;
      t.first = t.first == 0 ? span.first : std::min(t.first, span.first);
      t.last = std::max(t.last, span.second);
    }
    t.events.push_back(event(action_name(action, chunks), span.first, span.second, start, rank,
                             {{"microbatch", action.microbatch}, {"chunk", action.chunk}}));
  }
  return t;
}

std::vector<double> bubbles(const std::vector<RankTrace>& ranks) {
  double first = 0, last = 0;
  for (const RankTrace& r : ranks)
    if (r.last > 0) first = first == 0 ? r.first : std::min(first, r.first), last = std::max(last, r.last);
  std::vector<double> out;
  for (const RankTrace& r : ranks) {
    const double span = last > first ? last - first : r.wall;
    out.push_back(span > 0 ? 1 - r.busy / span : 0);
  }
  return out;
}

nlohmann::json chrome_trace(const std::vector<RankTrace>& ranks) {
  double origin = ranks.empty() ? 0 : ranks[0].start;
  for (const RankTrace& r : ranks) origin = std::min(origin, r.start);
  const std::vector<double> idle = bubbles(ranks);
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r},
                      {"args", {{"name", fmt::format("rank {} (idle {:.1f}%)", r, 100 * idle[r])}}}});
    for (nlohmann::json e : ranks[r].events) {
      e["ts"] = e["ts"].get<double>() + (ranks[r].start - origin) * 1e6;
      events.push_back(std::move(e));
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

nlohmann::json to_json(const RankTrace& t) {
  return {{"events", t.events}, {"start", t.start}, {"wall", t.wall}, {"busy", t.busy}, {"first", t.first}, {"last", t.last}};
}

RankTrace rank_trace_from(const nlohmann::json& j) {
  return {j.at("events"),          j.at("start").get<double>(), j.at("wall").get<double>(),
          j.at("busy").get<double>(), j.at("first").get<double>(), j.at("last").get<double>()};
}

}  // namespace remat::trainer
