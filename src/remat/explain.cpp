#include "remat/remat.h"

#include <fmt/format.h>

#include <algorithm>

namespace remat::rematerialize {
namespace {

// Counts executions by origin (as exec::Profile counts them: ir::for_each_op_run), the FLOPs of recomputed ops
// (all, and the contractions': dot_general, attention) and the contractions' FLOPs of the whole step. A
// recomputed region's body is marked recomputed too, so its ops are counted there, once; a fusion's ops are
// recomputed when the fusion is. A recomputed scan is a group's forward run again in its backward.
void count_runs(const ir::Graph& g, int64_t times, Explanation& e, bool group_rerun = false) {
  for (const ir::Node& n : g.nodes) {
    if (n.op == ir::Op::scan) {
      count_runs(*n.body, times * n.attrs.integer("length"), e, group_rerun || n.recomputed);
    } else if (n.op == ir::Op::remat) {
      count_runs(*n.body, times, e, group_rerun);
    } else {
      ir::for_each_op_run(g, n, [&](const ir::Graph& holder, const ir::Node& m, int64_t runs) {
        e.runs[m.origin] += runs * times;
        const double f = static_cast<double>(times) * ir::flops(holder, m);
        const bool contraction = ir::op_traits(m.op).cls == ir::OpClass::contraction;  // dot_general, attention
        if (contraction) e.step_gemm_flops += f;
        if (!n.recomputed) return;
        e.recompute_flops += f;
        if (contraction) e.recompute_gemm_flops += f;
        if (group_rerun) e.group_recompute_flops += f;
      });
    }
  }
}

std::string bytes_str(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

const char* residency_str(Residency r) {
  return r == Residency::save ? "save" : r == Residency::offload ? "offload" : "recompute";
}

// Adds the origins of the remat regions of `g` whose bodies hold another remat region (inside a scan).
bool find_group_regions(const ir::Graph& g, std::vector<uint64_t>& groups) {
  bool holds = false;
  for (const ir::Node& n : g.nodes) {
    if (!n.body) continue;
    const bool inner = find_group_regions(*n.body, groups);
    if (n.op == ir::Op::remat && inner) groups.push_back(n.origin);
    holds = holds || n.op == ir::Op::remat || inner;
  }
  return holds;
}

}  // namespace

std::map<uint64_t, int64_t> runs_per_step(const ir::Graph& step) {
  Explanation e;
  count_runs(step, 1, e);
  return e.runs;
}

Explanation explain(const std::vector<ResidualRecord>& records, const ir::Graph& forward, const ir::Graph& step) {
  Explanation e;
  e.residuals = records;
  // Regions in the order they were differentiated; rows of a region in forward order, inputs first.
  std::map<uint64_t, size_t> first_seen;
  for (size_t i = 0; i < records.size(); ++i) first_seen.emplace(records[i].region, i);
  std::stable_sort(e.residuals.begin(), e.residuals.end(), [&](const ResidualRecord& a, const ResidualRecord& b) {
    return std::pair(first_seen[a.region], a.position) < std::pair(first_seen[b.region], b.position);
  });
  count_runs(step, 1, e);
  find_group_regions(step, e.group_regions);  // the regions as differentiated (their origins are the records')
  e.forward_flops = ir::flops(forward);
  e.step_flops = ir::flops(step);
  return e;
}

namespace {
double step_bytes(const std::vector<ResidualRecord>& rows, Residency which) {
  double total = 0;
  for (const ResidualRecord& r : rows)
    if (r.residency == which && !(r.region_input && r.parameter_derived) && !r.alias)
      total += static_cast<double>(r.type.bytes()) * static_cast<double>(r.trip_count);
  return total;
}

// The double scan's two levels: what crosses groups (the group regions' decisions, per step) and what one
// group's backward holds (its layers' decisions, for the layers of one group).
struct Levels {
  int64_t groups = 0, layers = 0;
  double across_saved = 0, across_offloaded = 0, inside_saved = 0, inside_offloaded = 0;
};

Levels levels_of(const Explanation& e) {
  std::vector<ResidualRecord> outer, inner;
  Levels l;
  for (const ResidualRecord& r : e.residuals) {
    const bool group = std::find(e.group_regions.begin(), e.group_regions.end(), r.region) != e.group_regions.end();
    (group ? outer : inner).push_back(r);
    if (r.region_input) (group ? l.groups : l.layers) = r.trip_count;  // the region's runs (a stacked one's are more)
  }
  l.across_saved = step_bytes(outer, Residency::save);
  l.across_offloaded = step_bytes(outer, Residency::offload);
  const double per_group = l.groups > 0 ? 1.0 / static_cast<double>(l.groups) : 0;  // a layer's trip: every layer
  l.inside_saved = step_bytes(inner, Residency::save) * per_group;
  l.inside_offloaded = step_bytes(inner, Residency::offload) * per_group;
  return l;
}
}  // namespace

double Explanation::saved_bytes() const { return step_bytes(residuals, Residency::save); }
double Explanation::offloaded_bytes() const { return step_bytes(residuals, Residency::offload); }

std::string Explanation::text() const {
  std::string out;
  size_t i = 0;
  while (i < residuals.size()) {
    const ResidualRecord& first = residuals[i];
    size_t end = i;
    while (end < residuals.size() && residuals[end].region == first.region) ++end;
    const bool group = std::find(group_regions.begin(), group_regions.end(), first.region) != group_regions.end();
    out += fmt::format("{} (policy {}), runs {}x per step\n", group ? "group region" : "remat region", first.policy,
                       first.trip_count);
    out += fmt::format("  {:<56} {:<16} {:<5} {:>10}  {:<9} {:>9}  {}\n", "residual", "shape", "dtype", "bytes",
                       "decision", "runs/step", "rule");
    double saved = 0, offloaded = 0, recomputed = 0;
    for (size_t k = i; k < end; ++k) {
      const ResidualRecord& r = residuals[k];
      double b = static_cast<double>(r.type.bytes());
      if (!(r.region_input && r.parameter_derived) && !r.alias)
        (r.residency == Residency::save ? saved : r.residency == Residency::offload ? offloaded : recomputed) += b;
      auto runs_it = runs.find(r.origin);
      std::string run_count = r.region_input ? "-" : fmt::format("{}", runs_it == runs.end() ? 0 : runs_it->second);
      out += fmt::format("  {:<56} {:<16} {:<5} {:>10}  {:<9} {:>9}  {}\n", r.what, ir::shape_str(r.type.shape),
                         dtype_name(r.type.dtype), bytes_str(b), residency_str(r.residency), run_count, r.rule);
    }
    const double t = static_cast<double>(first.trip_count);
    out += fmt::format("  per layer: saved {}, offloaded {}, recomputed {}\n", bytes_str(saved), bytes_str(offloaded),
                       bytes_str(recomputed));
    out += fmt::format("  per step:  saved {}, offloaded {}, recomputed {}\n", bytes_str(saved * t),
                       bytes_str(offloaded * t), bytes_str(recomputed * t));
    i = end;
  }
  if (!group_regions.empty()) {
    const Levels l = levels_of(*this);
    out += fmt::format(
        "two levels: {} groups of {} layers\n"
        "  across groups (kept from the forward until the group's backward): saved {}, offloaded {}\n"
        "  inside one group's backward (its forward rerun keeps these for its {} layers): saved {}, offloaded {}\n"
        "  recompute: {:.3f} GFLOP rerunning the groups' forward, {:.3f} GFLOP in the layers' backward (an op runs "
        "at most 3x per layer)\n",
        l.groups, l.groups > 0 ? l.layers / l.groups : 0, bytes_str(l.across_saved), bytes_str(l.across_offloaded),
        l.groups > 0 ? l.layers / l.groups : 0, bytes_str(l.inside_saved), bytes_str(l.inside_offloaded),
        group_recompute_flops / 1e9, (recompute_flops - group_recompute_flops) / 1e9);
  }
  return out + "step: " + step_summary() + "\n";
}

std::string Explanation::step_summary() const {
  const double backward = step_flops - forward_flops - recompute_flops;
  return fmt::format(
      "saved {} on device, {} offloaded to host; {:.3f} GFLOP forward, {:.3f} GFLOP backward and update, "
      "{:.3f} GFLOP recompute ({:.1f}% of the step)",
      bytes_str(saved_bytes()), bytes_str(offloaded_bytes()), forward_flops / 1e9, backward / 1e9, recompute_flops / 1e9,
      step_flops > 0 ? 100 * recompute_flops / step_flops : 0.0);
}

nlohmann::json Explanation::json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const ResidualRecord& r : residuals) {
    auto runs_it = runs.find(r.origin);
    rows.push_back({{"policy", r.policy},
                    {"residual", r.what},
                    {"scope", r.scope},
                    {"shape", r.type.shape},
                    {"dtype", std::string(dtype_name(r.type.dtype))},
                    {"bytes", r.type.bytes()},
                    {"decision", residency_str(r.residency)},
                    {"rule", r.rule},
                    {"region_input", r.region_input},
                    {"region_runs_per_step", r.trip_count},
                    {"producer_runs_per_step", r.region_input || runs_it == runs.end() ? 0 : runs_it->second}});
  }
  nlohmann::json j = {{"residuals", rows},
                      {"bytes_per_step", {{"saved", saved_bytes()}, {"offloaded", offloaded_bytes()}}},
                      {"flops", {{"forward", forward_flops}, {"step", step_flops}, {"recompute", recompute_flops}}}};
  if (!group_regions.empty()) {
    const Levels l = levels_of(*this);
    j["groups"] = {{"groups", l.groups},
                   {"layers", l.layers},
                   {"across_groups", {{"saved", l.across_saved}, {"offloaded", l.across_offloaded}}},
                   {"inside_a_group", {{"saved", l.inside_saved}, {"offloaded", l.inside_offloaded}}},
                   {"recompute_flops", {{"group", group_recompute_flops}, {"layers", recompute_flops - group_recompute_flops}}}};
  }
  return j;
}

}  // namespace remat::rematerialize
