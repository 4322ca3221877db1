// The Pareto frontier of the placement space (peak vs estimated cost), by exact solves at falling budgets, with
// MaxText's presets planned beside it.
#include "search/search.h"

#include "plan/report.h"

#include <fmt/format.h>

#include <algorithm>

namespace remat::search {

Frontier frontier(const compile::Request& request, const Limits& limits, const Rates& rates) {
  Frontier f;
  // The optimum under budget H has the least peak among the cheapest, so nothing under a budget below its
  // peak costs as little: each solve gives the next point, strictly cheaper in peak and dearer in cost.
  for (int64_t budget = 0;;) {
    const Result r = search(request, {.device = budget, .host = limits.host}, rates);
    if (!r.best) break;
    f.points.push_back(*r.best);
    budget = r.best->peak - 1;
    if (budget <= 0) break;
  }
  for (const std::string& preset : rematerialize::preset_names()) {
    Candidate c = evaluate_policy(request, nn::parse_remat_policy(preset, request.model),
                                  {.device = 0, .host = limits.host}, rates);
    f.presets.push_back(std::move(c));
  }
  return f;
}

bool Frontier::dominated(const Candidate& c) const {
  return std::any_of(points.begin(), points.end(), [&](const Candidate& p) {
    return p.peak <= c.peak && p.seconds <= c.seconds && (p.peak < c.peak || p.seconds < c.seconds);
  });
}

std::string Frontier::svg(const std::string& title) const {
  const double width = 960, height = 520, left = 90, right = 40, top = 40, bottom = 50;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  std::vector<const Candidate*> all;
  for (const Candidate& c : points) all.push_back(&c);
  for (const Candidate& c : presets) all.push_back(&c);
  double x0 = 1e300, x1 = 0, y1 = 0;
  for (const Candidate* c : all) {
    x0 = std::min(x0, static_cast<double>(c->peak));
    x1 = std::max(x1, static_cast<double>(c->peak));
    y1 = std::max(y1, c->seconds);
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= 0) y1 = 1;
  auto x_at = [&](double peak) { return left + plot_w * (peak - x0) / (x1 - x0); };
  auto y_at = [&](double s) { return top + plot_h * (1 - s / y1); };
  std::string out = plan::svg_begin(width, height, left, 20, title);
  std::string steps;  // the frontier as a staircase: cheaper placements need more memory
  for (size_t i = 0; i < points.size(); ++i) {
    const double x = x_at(static_cast<double>(points[i].peak)), y = y_at(points[i].seconds);
    if (i > 0) steps += fmt::format("{:.1f},{:.1f} ", x, y_at(points[i - 1].seconds));
    steps += fmt::format("{:.1f},{:.1f} ", x, y);
  }
  out += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n", steps);
  for (const Candidate& p : points)
    out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#1f77b4\"><title>{} peak {}, {:.4g} GFLOP "
                       "recompute, {} offloaded, est. {:.3g} s</title></circle>\n",
                       x_at(static_cast<double>(p.peak)), y_at(p.seconds), p.policy, plan::bytes_str(static_cast<double>(p.peak)),
                       p.recompute_flops / 1e9, plan::bytes_str(p.offloaded_bytes), p.seconds);
  for (size_t i = 0; i < presets.size(); ++i) {
    const Candidate& p = presets[i];
    const bool on = !dominated(p);
    const double x = x_at(static_cast<double>(p.peak)), y = y_at(p.seconds);
    out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"8\" height=\"8\" fill=\"{}\"/>"
                       "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\">{}{}</text>\n",
                       x - 4, y - 4, on ? "#2ca02c" : "#d62728", x + 6, y - 6 - 11.0 * static_cast<double>(i % 3), p.policy,
                       on ? " (on the frontier)" : p.fits ? "" : " (over host_limit)");
  }
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left, top, top + plot_h);
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", left, top + plot_h, left + plot_w);
  out += fmt::format("<text x=\"4\" y=\"{}\">{:.3g} s</text>\n<text x=\"4\" y=\"{}\">0 s</text>\n", top + 10, y1, top + plot_h);
  out += fmt::format("<text x=\"{}\" y=\"{}\">{}</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left,
                     top + plot_h + 16, plan::bytes_str(x0), left + plot_w, top + plot_h + 16, plan::bytes_str(x1));
  out += fmt::format("<text x=\"{}\" y=\"{}\">device peak; y: recompute + transfer time (est.); blue: the frontier; "
                     "squares: MaxText presets (green on it, red dominated)</text>\n</svg>\n",
                     left + 120, height - 10);
  return out;
}

}  // namespace remat::search
