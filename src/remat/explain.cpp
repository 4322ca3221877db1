#include "remat/remat.h"

#include <fmt/format.h>

#include <algorithm>

namespace remat::rematerialize {
namespace {

// Counts executions by origin (as exec::Profile counts them: ir::for_each_op_run), the FLOPs of recomputed ops
// (all, and the contractions': dot_general, attention) and the contractions' FLOPs of the whole step. A
// recomputed region's body is marked recomputed too, so its ops are counted there, once; a fusion's ops are
// recomputed when the fusion is.
void count_runs(const ir::Graph& g, int64_t times, Explanation& e) {
  for (const ir::Node& n : g.nodes) {
    if (n.op == ir::Op::scan) {
      count_runs(*n.body, times * n.attrs.integer("length"), e);
    } else if (n.op == ir::Op::remat) {
      count_runs(*n.body, times, e);
    } else {
      ir::for_each_op_run(g, n, [&](const ir::Graph& holder, const ir::Node& m, int64_t runs) {
        e.runs[m.origin] += runs * times;
        const double f = static_cast<double>(times) * ir::flops(holder, m);
        const bool contraction = ir::op_traits(m.op).cls == ir::OpClass::contraction;  // dot_general, attention
        if (contraction) e.step_gemm_flops += f;
        if (!n.recomputed) return;
        e.recompute_flops += f;
        if (contraction) e.recompute_gemm_flops += f;
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
    out += fmt::format("remat region (policy {}), runs {}x per step\n", first.policy, first.trip_count);
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
  return {{"residuals", rows},
          {"bytes_per_step", {{"saved", saved_bytes()}, {"offloaded", offloaded_bytes()}}},
          {"flops", {{"forward", forward_flops}, {"step", step_flops}, {"recompute", recompute_flops}}}};
}

}  // namespace remat::rematerialize
