#include "search/search.h"

#include "base/workers.h"
#include "exec/executable.h"
#include "ir/text.h"
#include "plan/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <queue>

namespace remat::search {

namespace {


// Seconds per run of an IR program on the CPU kernels, in its planned arena: the best of a few runs after a
// warm-up run. One timed run let a slow moment of a shared machine decide the rates: the printed recompute
// estimate of one plan moved from 1.16 s to 23.2 s between two runs, and the rates choose between placements.
double seconds_per_run(const std::string& text) {
  ir::Graph g = ir::parse(text, "<rate measurement>");
  plan::Plan p = plan::build(g, {.workspace = exec::workspace_of(exec::cpu())});
  exec::Executable e(std::move(g), std::move(p));
  e.own_arguments();
  e.run();
  double best = std::numeric_limits<double>::infinity();
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    e.run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// What recomputation costs a placement: FLOPs (all, and the contractions') and bytes a device sends again.
struct Recompute {
  double flops = 0, gemm_flops = 0, sent = 0;
};

Recompute recompute_of(const compile::Compiled& c) {
  Recompute r{c.explanation.recompute_flops, c.explanation.recompute_gemm_flops, 0};
  for (const auto& [kind, row] : ir::communication(c.program)) r.sent += row.recomputed.sent;
  return r;
}

double cost_of(const Rates& r, const Recompute& recompute, double offloaded) {
  return recompute.gemm_flops / r.gemm_flops + (recompute.flops - recompute.gemm_flops) / r.other_flops +
         2 * offloaded / r.host_bandwidth + recompute.sent / r.ici_bandwidth;
}

// Under a pipeline a rank's chunks decide once for all the microbatches it runs (its residual records are one
// microbatch's): 1 without one.
double microbatches_of(const compile::Request& r) {
  return r.pipeline ? static_cast<double>(r.pipeline->shape.microbatches) : 1.0;
}

// A compile that only differentiates (recompute costs, the names' residuals): the gradients alone, or under a
// pipeline the rank's step, which holds them.
compile::Kind differentiated_kind(const compile::Request& r) {
  return r.pipeline ? compile::Kind::train_step : compile::Kind::grads;
}

// The state of one search: memoized differentiations (recompute cost per saved set) and plans (per placement).
class Searcher {
 public:
  Searcher(const compile::Request& request, const Limits& limits, const Rates& rates)
      : request_(request), limits_(limits), rates_(rates) {
    result_.limits = limits;
    result_.rates = rates;
    result_.names = searched_names(request, &result_.name_bytes);
    result_.memory_bound = lemma_;
    // Largest first: the memory bound prunes most near the root.
    std::vector<size_t> order(result_.names.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return result_.name_bytes[a] > result_.name_bytes[b]; });
    std::vector<std::string> names;
    std::vector<double> bytes;
    for (size_t i : order) names.push_back(result_.names[i]), bytes.push_back(result_.name_bytes[i]);
    result_.names = names;
    result_.name_bytes = bytes;
    for (bool keeps : group_choices(request)) {
      const Candidate& all_device = plan(std::vector<Residency>(names.size(), Residency::save), keeps);
      base_[keeps] = static_cast<double>(all_device.peak) - device_bytes(all_device.placement);
    }
  }

  // A plan below its memory bound (the lemma failed) found in any pass turns the bound off; the search then runs
  // again without it, planning every candidate cheaper than the answer (it can fail only once).
  Result run() {
    for (;;) {
      const bool lemma_before = lemma_;
      result_.best.reset();
      result_.cheaper.clear();
      find_best();
      if (result_.best) {
        const bool keeps = result_.best->group_keeps;
        for (size_t i = 0; i < result_.names.size(); ++i)
          for (Residency r : {Residency::save, Residency::offload, Residency::recompute}) {
            std::vector<Residency> p = result_.best->placement;
            if (p[i] == r) continue;
            p[i] = r;
            if (in_space(p, keeps) && cost(p, keeps) < result_.best->seconds) result_.cheaper.push_back(plan(p, keeps));
          }
        const Placement& p = result_.best->placement;
        if (groups_.size() > 1 && in_space(p, !keeps) && cost(p, !keeps) < result_.best->seconds)
          result_.cheaper.push_back(plan(p, !keeps));
      } else {
        find_smallest();
      }
      if (lemma_ == lemma_before) return result_;
    }
  }

 private:
  using Placement = std::vector<Residency>;

  // Device bytes of the searched names' residuals under p.
  double device_bytes(const Placement& p) const {
    double b = 0;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] == Residency::save) b += result_.name_bytes[i];
    return b;
  }
  double host_bytes(const Placement& p) const {
    double b = 0;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] == Residency::offload) b += result_.name_bytes[i];
    return b;
  }
  // The memory bound of the header: no plan of p (with G keeping or not) can be smaller.
  double device_bound(const Placement& p, bool keeps) const { return base_[keeps] + device_bytes(p); }
  bool within_bounds(const Placement& p, bool keeps) const {
    return (limits_.device <= 0 || !lemma_ || device_bound(p, keeps) <= static_cast<double>(limits_.device)) &&
           (limits_.host <= 0 || host_bytes(p) * host_held_ <= static_cast<double>(limits_.host));
  }

  // Recomputation of the placement saving exactly `saved` (a bit per name), G keeping or not: a differentiation,
  // no plan; memoized.
  Recompute recompute(uint64_t saved, bool keeps) {
    const auto key = std::pair(saved, keeps);
    auto it = recompute_.find(key);
    if (it != recompute_.end()) return it->second;
    Placement p(result_.names.size(), Residency::recompute);
    for (size_t i = 0; i < p.size(); ++i)
      if (saved >> i & 1) p[i] = Residency::save;
    compile::Request r = request_;
    r.model.remat_policy = placed(r.model, result_.names, p);
    if (r.model.layers_per_group > 0) r.model.group_remat_policy = group_placed(r.model, result_.names, p, keeps);
    r.kind = differentiated_kind(r);
    r.plan = false;
    const compile::Compiled c = compile::compile(r);
    ++result_.differentiated;
    return recompute_[key] = recompute_of(c);
  }
  static uint64_t saved_set(const Placement& p) {
    uint64_t s = 0;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] != Residency::recompute) s |= uint64_t{1} << i;
    return s;
  }
  // The space of the header: a keeping G with a P that offloads nothing.
  static bool in_space(const Placement& p, bool keeps) {
    return !keeps || std::find(p.begin(), p.end(), Residency::offload) == p.end();
  }
  double cost(const Placement& p, bool keeps) {
    return cost_of(rates_, recompute(saved_set(p), keeps), host_bytes(p));
  }

  const Candidate& plan(const Placement& p, bool keeps) {
    auto it = planned_.find({p, keeps});
    if (it != planned_.end()) return it->second;
    Candidate c = evaluate(request_, result_.names, p, limits_, rates_, keeps);
    ++result_.planned;
    // The lemma, checked wherever it can be: a plan below its bound turns the bound off.
    if (lemma_ && static_cast<double>(c.peak) < device_bound(p, keeps)) lemma_ = result_.lemma_held = false;
    return planned_[{p, keeps}] = std::move(c);
  }

  // Best-first branch and bound over G's choice (at the root) and the names in order; a node is G's choice and a
  // placement of the first `depth` names.
  void find_best() {
    struct Node {
      double cost, bound;
      bool keeps;
      Placement prefix;
      bool operator>(const Node& o) const { return std::pair(cost, bound) > std::pair(o.cost, o.bound); }
    };
    const size_t k = result_.names.size();
    // The cheapest completion of a prefix: the rest on device (with G fixed, saving never adds recompute: a
    // keeping G keeps it across groups, and nothing_saveable reruns the group whatever P keeps).
    auto node = [&](Placement prefix, bool keeps) {
      Placement full = prefix;
      full.resize(k, Residency::save);
      Placement lowest = prefix;  // the completion with the least device memory: the rest off device
      lowest.resize(k, Residency::recompute);
      return Node{cost(full, keeps), device_bound(lowest, keeps), keeps, std::move(prefix)};
    };
    std::priority_queue<Node, std::vector<Node>, std::greater<>> open;
    for (bool keeps : groups_) open.push(node({}, keeps));
    while (!open.empty()) {
      Node n = open.top();
      open.pop();
      if (result_.best && n.cost > result_.best->seconds) break;  // every placement left costs more
      Placement lowest = n.prefix;
      lowest.resize(k, Residency::recompute);
      if (!within_bounds(lowest, n.keeps)) continue;
      if (n.prefix.size() < k) {
        for (Residency r : {Residency::save, Residency::offload, Residency::recompute}) {
          Placement child = n.prefix;
          child.push_back(r);
          if (in_space(child, n.keeps)) open.push(node(std::move(child), n.keeps));
        }
        continue;
      }
      const Candidate& c = plan(n.prefix, n.keeps);
      // The planned step's cost is the one the search ordered by (the same differentiation, without the plan).
      ASSERT(std::abs(c.seconds - n.cost) <= 1e-9 * std::max(1e-30, std::abs(n.cost)));
      if (c.fits && (!result_.best || std::pair(c.seconds, c.peak) < std::pair(result_.best->seconds, result_.best->peak)))
        result_.best = c;  // equal cost: the lower peak
    }
  }

  // Nothing fits: the smallest peak, best bound first (the bound is the memory bound, or 0 without the lemma).
  void find_smallest() {
    const size_t k = result_.names.size();
    std::vector<std::pair<Placement, bool>> all;
    Placement p(k, Residency::recompute);
    std::function<void(size_t)> each = [&](size_t i) {
      if (i == k) {
        for (bool keeps : groups_)
          if (in_space(p, keeps)) all.emplace_back(p, keeps);
        return;
      }
      for (Residency r : {Residency::recompute, Residency::offload, Residency::save}) p[i] = r, each(i + 1);
    };
    each(0);
    auto bound = [&](const std::pair<Placement, bool>& q) { return device_bound(q.first, q.second); };
    std::stable_sort(all.begin(), all.end(), [&](const auto& a, const auto& b) { return bound(a) < bound(b); });
    std::optional<Candidate> smallest;  // within host_limit (every recompute placement is: one always exists)
    for (const auto& q : all) {
      if (smallest && lemma_ && bound(q) >= static_cast<double>(smallest->peak)) break;
      if (limits_.host > 0 && host_bytes(q.first) * host_held_ > static_cast<double>(limits_.host)) continue;
      const Candidate& c = plan(q.first, q.second);
      if ((limits_.host <= 0 || c.host <= limits_.host) && (!smallest || c.peak < smallest->peak)) smallest = c;
    }
    ASSERT(smallest.has_value());
    result_.smallest = *smallest;
  }

  compile::Request request_;
  Limits limits_;
  Rates rates_;
  Result result_;
  std::vector<bool> groups_ = group_choices(request_);  // G's choices searched (keeps or not)
  // Result::name_bytes are the step's (every microbatch's): the host arena holds at least one microbatch's.
  double host_held_ = 1 / microbatches_of(request_);
  // Per G choice: peak minus device_bytes with every name on device (-inf until planned: no bound before it).
  double base_[2] = {-INFINITY, -INFINITY};
  // Under a pipeline a rank's peak moves between its actions and the names' savings do not add up (observed:
  // offloading mlpwi with the other names recomputed saved 0.7% more than its bytes): no memory bound there.
  bool lemma_ = request_.pipeline == nullptr;
  std::map<std::pair<uint64_t, bool>, Recompute> recompute_;
  std::map<std::pair<Placement, bool>, Candidate> planned_;
};

}  // namespace

Rates measure(DType compute, double host_bandwidth, double ici_bandwidth) {
  const std::string t(dtype_name(compute));
  // Sizes past the caches, small enough that faulting in the arenas (slow here) stays well under 0.1 s.
  const int64_t n = 512, elements = int64_t{1} << 21, bytes = int64_t{16} << 20;
  Rates r;
  r.gemm_flops = 2.0 * n * n * n /
                 seconds_per_run(fmt::format("graph @gemm(%a: {0}[{1},{1}], %b: {0}[{1},{1}]) -> ({0}[{1},{1}]) {{\n"
                                             "  %0: {0}[{1},{1}] = dot_general(%a, %b) {{contract=[[1],[0]], batch=[[],[]]}}\n"
                                             "  return %0\n}}\n", t, n));
  r.other_flops = static_cast<double>(elements) /
                  seconds_per_run(fmt::format("graph @add(%a: f32[{0}], %b: f32[{0}]) -> (f32[{0}]) {{\n"
                                              "  %0: f32[{0}] = add(%a, %b)\n  return %0\n}}\n", elements));
  const int64_t words = bytes / 4;
  const double copies = host_bandwidth > 0 && ici_bandwidth > 0
                            ? 0
                            : 2.0 * static_cast<double>(bytes) /
                                  seconds_per_run(fmt::format("graph @copies(%a: f32[{0}]) -> (f32[{0}]) {{\n"
                                                              "  %0: f32[{0}] = offload(%a)\n"
                                                              "  %1: f32[{0}] = reload(%0)\n  return %1\n}}\n", words));
  r.host_bandwidth = host_bandwidth > 0 ? host_bandwidth : copies;
  r.ici_bandwidth = ici_bandwidth > 0 ? ici_bandwidth : copies;
  return r;
}

rematerialize::Policy placed(const nn::ModelConfig& model, const std::vector<std::string>& names,
                             const std::vector<Residency>& placement) {
  std::vector<std::pair<std::string, Residency>> where;
  for (size_t i = 0; i < names.size(); ++i) where.emplace_back(names[i], placement[i]);
  return rematerialize::custom_policy(where, nn::policy_spelling(model));
}

std::vector<std::string> searched_names(const compile::Request& request, std::vector<double>* bytes) {
  const nn::names::Vocabulary v = nn::vocabulary(request.model);
  std::vector<std::string> candidates;
  for (const nn::names::Name& n : nn::names::kAll)
    if (!n.maxtext.empty() && nn::names::carries(n, v)) candidates.emplace_back(n.maxtext);
  compile::Request r = request;
  r.model.remat_policy = placed(r.model, candidates, std::vector<Residency>(candidates.size(), Residency::save));
  r.kind = differentiated_kind(r);
  r.plan = false;
  const compile::Compiled c = compile::compile(r);
  const double runs = microbatches_of(request);
  std::vector<std::string> names;
  const std::string layer_policy = r.model.remat_policy.described();  // a group's records are its own policy's
  for (const std::string& name : candidates) {
    const std::string spelled(nn::names::from_maxtext(name, v.naming));
    double b = 0;
    bool decided = false;
    for (const rematerialize::ResidualRecord& rec : c.explanation.residuals)
      if (rec.what == spelled && !rec.alias && !rec.region_input && rec.policy == layer_policy) {
        decided = true;
        b += static_cast<double>(rec.type.bytes()) * static_cast<double>(rec.trip_count);
      }
    if (!decided) continue;  // an alias of a region input (kept with it), or never read by the backward
    names.push_back(name);
    if (bytes) bytes->push_back(b * runs);
  }
  return names;
}

rematerialize::Policy group_placed(const nn::ModelConfig& model, const std::vector<std::string>& names,
                                   const std::vector<Residency>& placement, bool keeps) {
  using Kind = rematerialize::Policy::Kind;
  if (!keeps) return rematerialize::policy_of(Kind::nothing_saveable);
  const nn::names::Naming naming = nn::vocabulary(model).naming;
  std::vector<std::string> kept{std::string(nn::names::from_maxtext("decoder_layer_input", naming))};
  for (size_t i = 0; i < names.size(); ++i)
    if (placement[i] != Residency::recompute) kept.emplace_back(nn::names::from_maxtext(names[i], naming));
  return rematerialize::policy_of(Kind::save_only_these_names, std::move(kept));
}

std::vector<bool> group_choices(const compile::Request& request) {
  if (request.model.layers_per_group > 0) return {false, true};
  return {false};
}

Candidate evaluate(const compile::Request& request, const std::vector<std::string>& names,
                   const std::vector<Residency>& placement, const Limits& limits, const Rates& rates,
                   bool group_keeps) {
  compile::Request r = request;
  if (r.model.layers_per_group > 0) r.model.group_remat_policy = group_placed(r.model, names, placement, group_keeps);
  Candidate k = evaluate_policy(r, placed(request.model, names, placement), limits, rates);
  k.placement = placement;
  k.group_keeps = group_keeps;
  if (r.model.layers_per_group > 0) k.group_policy = r.model.group_remat_policy.written;
  return k;
}

Candidate evaluate_policy(const compile::Request& request, const rematerialize::Policy& policy, const Limits& limits,
                          const Rates& rates) {
  compile::Request r = request;
  r.model.remat_policy = policy;
  r.kind = compile::Kind::train_step;
  r.plan = true;
  const compile::Compiled c = compile::compile(r);
  const plan::Report rep = plan::report(c.plan, c.program, c.signature, {});
  Candidate k;
  k.policy = policy.written;
  k.peak = rep.total;
  k.host = rep.host;
  k.recompute_flops = c.explanation.recompute_flops;
  k.recompute_gemm_flops = c.explanation.recompute_gemm_flops;
  k.step_flops = c.explanation.step_flops;
  k.offloaded_bytes = c.explanation.offloaded_bytes() * microbatches_of(r);
  const Recompute recompute = recompute_of(c);
  k.recomputed_sent = recompute.sent;
  k.seconds = cost_of(rates, recompute, k.offloaded_bytes);
  k.fits = (limits.device <= 0 || k.peak <= limits.device) && (limits.host <= 0 || k.host <= limits.host);
  return k;
}

Result search(const compile::Request& request, const Limits& limits, const Rates& rates) {
  CHECK(request.pipeline == nullptr || request.model.stage_remat_policies.empty(),
        "remat_policy=auto under a pipeline places each rank's names itself: drop pipeline_stage_remat_policies, "
        "or give remat_policy a policy");
  return Searcher(request, limits, rates).run();
}

std::vector<Result> search_ranks(const compile::Request& request, const Limits& limits, const Rates& rates) {
  ASSERT(request.pipeline != nullptr);
  std::vector<Result> ranks(static_cast<size_t>(request.pipeline->shape.stages));
  for_each_parallel(request.pipeline->shape.stages, [&](int64_t r) {
    compile::Request rank = request;
    rank.stage = r;
    ranks[static_cast<size_t>(r)] = search(rank, limits, rates);
  });
  return ranks;
}

Result search_group_sizes(const compile::Request& request, const Limits& limits, const Rates& rates) {
  CHECK(request.pipeline == nullptr, "searching the group size (layers_per_group) under a pipeline is not supported: "
        "give layers_per_group, and remat_policy=auto places each rank's names");
  CHECK(request.model.scan_layers, "searching the group size (layers_per_group) needs scan_layers=true: groups are a "
        "scan of scans");
  std::optional<Result> chosen;
  for (int64_t size = 0; size <= request.model.num_decoder_layers; ++size) {
    if (size > 0 && request.model.num_decoder_layers % size != 0) continue;
    compile::Request r = request;
    r.model.layers_per_group = size;
    Result got = search(r, limits, rates);
    got.layers_per_group = size;
    const auto better = [&] {
      if (!chosen) return true;
      if (got.best.has_value() != chosen->best.has_value()) return got.best.has_value();
      if (!got.best) return got.smallest.peak < chosen->smallest.peak;
      return std::pair(got.best->seconds, got.best->peak) < std::pair(chosen->best->seconds, chosen->best->peak);
    };
    if (better()) chosen = std::move(got);
  }
  return *chosen;
}

std::string Result::text() const {
  auto str = [](double b) { return plan::bytes_str(b); };
  std::string out;
  const std::string limit = fmt::format("hbm_limit {}{}", limits.device > 0 ? str(static_cast<double>(limits.device)) : "unlimited",
                                        limits.host > 0 ? fmt::format(", host_limit {}", str(static_cast<double>(limits.host))) : "");
  if (!best) {
    out += fmt::format("remat_policy=auto: nothing fits {}: the smallest peak any placement of {} reaches is {} ({}{})\n",
                       limit, fmt::join(names, ", "), str(static_cast<double>(smallest.peak)), smallest.policy,
                       (smallest.group_policy.empty() ? "" : ", group_remat_policy " + smallest.group_policy) +
                           (layers_per_group ? fmt::format(", layers_per_group {}", *layers_per_group) : ""));
    return out;
  }
  const Candidate& b = *best;
  out += fmt::format("remat_policy=auto under {}: the cheapest placement that fits (searched {} names{}: {} plans, {} "
                     "differentiations{})\n",
                     limit, names.size(), b.group_policy.empty() ? "" : " and the group policy", planned, differentiated, !memory_bound ? "; no memory bound under a pipeline: every cheaper candidate planned"
                     : lemma_held ? "" : "; the memory bound did not hold, every candidate was planned");
  if (layers_per_group) out += fmt::format("  layers_per_group: {}\n", *layers_per_group);
  out += fmt::format("  remat_policy: {}\n", b.policy);
  if (!b.group_policy.empty()) out += fmt::format("  group_remat_policy: {}\n", b.group_policy);
  out += fmt::format("  peak {}, host {}; recompute {:.4g} GFLOP ({:.1f}% of the step){}, offloaded {} per step; est. {:.3g} s per "
                     "step for recompute and transfers\n",
                     str(static_cast<double>(b.peak)), str(static_cast<double>(b.host)), b.recompute_flops / 1e9,
                     b.step_flops > 0 ? 100 * b.recompute_flops / b.step_flops : 0.0,
                     b.recomputed_sent > 0 ? fmt::format(" and {} sent again in its collectives", str(b.recomputed_sent)) : "",
                     str(b.offloaded_bytes), b.seconds);
  if (cheaper.empty()) out += "  nothing cheaper exists in this space\n";
  else out += "  each cheaper one-name change does not fit:\n";
  for (const Candidate& c : cheaper) {
    std::string change = c.group_keeps != b.group_keeps ? "group_remat_policy=" + c.group_policy : "";
    for (size_t i = 0; i < names.size(); ++i)
      if (c.placement[i] != b.placement[i]) change = fmt::format("{}={}", names[i], rematerialize::custom_word(c.placement[i]));
    const bool over_device = limits.device > 0 && c.peak > limits.device;
    out += fmt::format("    {:<24} est. {:.3g} s, {}\n", change, c.seconds,
                       over_device ? fmt::format("peak {} > {}", str(static_cast<double>(c.peak)), str(static_cast<double>(limits.device)))
                                   : fmt::format("host {} > {}", str(static_cast<double>(c.host)), str(static_cast<double>(limits.host))));
  }
  return out;
}

}  // namespace remat::search
