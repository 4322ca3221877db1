#include "trainer/curves.h"

#include "base/check.h"
#include "plan/report.h"
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

namespace remat::trainer {
namespace {

namespace fs = std::filesystem;

// The picture's layout, in pixels: three panels stacked over the shared step axis, the legend on the right.
constexpr double kWidth = 960, kLeft = 90, kRight = 190, kTop = 58, kPanelHeight = 170, kGap = 46, kBottom = 46;
constexpr double kPlotWidth = kWidth - kLeft - kRight;

struct Series {
  std::vector<Point> Curves::*points;
  const char* key;  // metrics.jsonl's name, the polyline's class
  bool dashed;
};
struct Panel {
  const char* label;
  bool from_zero;  // the y axis starts at 0 (rates); else at the lowest value (loss)
  std::vector<Series> series;
};
const std::vector<Panel>& panels() {
  static const std::vector<Panel> p = {
      {"loss (nats per token)", false, {{&Curves::loss, "loss", false}, {&Curves::validation_loss, "validation_loss", true}}},
      {"learning rate", true, {{&Curves::lr, "lr", false}}},
      {"tokens/s", true, {{&Curves::tokens_per_s, "tokens_per_s", false}}}};
  return p;
}

std::string xml_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

struct Range {
  double lo, hi;
  double fraction(double v) const { return (v - lo) / (hi - lo); }
};

// The range a panel shows of `values`, with a margin; never empty.
Range range_of(const std::vector<double>& values, bool from_zero) {
  if (values.empty()) return {0, 1};
  const double lo = from_zero ? 0 : *std::min_element(values.begin(), values.end());
  const double hi = std::max(lo, *std::max_element(values.begin(), values.end()));
  const double margin = hi > lo ? 0.05 * (hi - lo) : hi != 0 ? 0.05 * std::abs(hi) : 1;
  return {from_zero ? lo : lo - margin, hi + margin};
}

// Round values (1, 2 or 5 times a power of ten) in [r.lo, r.hi]: the coarsest such step that gives at least
// `count` of them (at most 2.5 times as many), none finer than `finest`.
std::vector<double> ticks(const Range& r, double count, double finest = 0) {
  const double raw = (r.hi - r.lo) / count, magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {2.0, 5.0})
    if (m * magnitude <= raw) step = m * magnitude;
  step = std::max(step, finest);
  std::vector<double> out;
  for (double k = std::ceil(r.lo / step); k * step <= r.hi; ++k) out.push_back(k * step);
  return out;
}

// Every k-th point and the last, at most kMaxPoints of them.
std::vector<Point> thinned(const std::vector<Point>& points) {
  const size_t stride = (points.size() + kMaxPoints - 1) / kMaxPoints;
  if (stride <= 1) return points;
  std::vector<Point> out;
  for (size_t i = 0; i < points.size(); i += stride) out.push_back(points[i]);
  if ((points.size() - 1) % stride != 0) out.push_back(points.back());
  return out;
}

}  // namespace

Curves read_curves(const fs::path& run_dir) {
  const fs::path file = run_dir / "metrics.jsonl";
  std::ifstream in(file);
  CHECK(in.good(), "cannot read '{}': remat plot takes run folders (base_output_directory/run_name) that hold "
        "metrics.jsonl", file.string());
  fs::path folder = fs::absolute(run_dir).lexically_normal();
  if (!folder.has_filename()) folder = folder.parent_path();  // "runs/x/"
  Curves c;
  c.name = folder.filename().string();
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    try {
      const nlohmann::json row = nlohmann::json::parse(line);
      const double step = row.at("step").get<double>();
      for (const Panel& p : panels())
        for (const Series& s : p.series)
          if (row.contains(s.key)) (c.*s.points).push_back({step, row.at(s.key).get<double>()});
    } catch (const nlohmann::json::exception& e) {
      CHECK(false, "'{}' line {} is not a row remat wrote ({})", file.string(), line_number, e.what());
    }
  }
  return c;
}

std::string curves_svg(const std::vector<Curves>& runs) {
  ASSERT(!runs.empty());
  const size_t n = panels().size();
  const double height = kTop + static_cast<double>(n) * kPanelHeight + static_cast<double>(n - 1) * kGap + kBottom;
  std::vector<double> steps;
  for (const Curves& run : runs)
    for (const Panel& p : panels())
      for (const Series& s : p.series)
        for (const Point& point : run.*s.points) steps.push_back(point.step);
  steps.push_back(1);  // the step axis shows at least 0 .. 1
  const Range x{0, *std::max_element(steps.begin(), steps.end())};
  const auto x_at = [&](double step) { return kLeft + kPlotWidth * x.fraction(step); };
  const std::string title = runs.size() == 1 ? fmt::format("run {}: loss, learning rate and tokens/s", runs[0].name)
                                             : fmt::format("{} runs: loss, learning rate and tokens/s", runs.size());
  std::string out = plan::svg_begin(kWidth, height, kLeft, 22, xml_escaped(title));
  for (size_t i = 0; i < n; ++i) {
    const Panel& p = panels()[i];
    const double top = kTop + static_cast<double>(i) * (kPanelHeight + kGap), bottom = top + kPanelHeight;
    std::vector<double> values;
    for (const Curves& run : runs)
      for (const Series& s : p.series)
        for (const Point& point : run.*s.points) values.push_back(point.value);
    const Range y = range_of(values, p.from_zero);
    const auto y_at = [&](double v) { return bottom - kPanelHeight * y.fraction(v); };
    out += fmt::format("<g class=\"panel\" data-panel=\"{}\">\n<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{}</text>\n",
                       p.series[0].key, kLeft, top - 8, p.label);
    for (double t : ticks(y, 3))
      out += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#dddddd\"/>"
                         "<text class=\"ytick\" x=\"{3}\" y=\"{1:.1f}\" dy=\"4\" text-anchor=\"end\">{4:g}</text>\n",
                         kLeft, y_at(t), kLeft + kPlotWidth, kLeft - 6, t);
    for (double t : ticks(x, 5, 1)) {
      out += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eeeeee\"/>\n", x_at(t), top, bottom);
      if (i + 1 == n)
        out += fmt::format("<text class=\"xtick\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.0f}</text>\n", x_at(t),
                           bottom + 16, t);
    }
    if (values.empty())
      out += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#777777\">no values yet</text>\n", kLeft + 10, top + 20);
    for (size_t r = 0; r < runs.size(); ++r)
      for (const Series& s : p.series) {
        const std::vector<Point> points = thinned(runs[r].*s.points);
        const char* colour = plan::kSvgColors[r % std::size(plan::kSvgColors)];
        std::string text;
        for (const Point& point : points) text += fmt::format("{:.1f},{:.1f} ", x_at(point.step), y_at(point.value));
        out += fmt::format("<polyline class=\"{}\" data-run=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{}\" "
                           "stroke-width=\"1.5\"{}/>\n", s.key, xml_escaped(runs[r].name), text, colour,
                           s.dashed ? " stroke-dasharray=\"6 3\"" : "");
        if (s.dashed || points.size() == 1)  // the evaluations are few, and one point draws no line: a dot each
          for (const Point& point : points)
            out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", x_at(point.step),
                               y_at(point.value), colour);
      }
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n</g>\n",
                       kLeft, top, kPlotWidth, kPanelHeight);
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n", kLeft + kPlotWidth / 2, height - 8);
  const double legend = kLeft + kPlotWidth + 20;
  std::vector<std::pair<std::string, std::string>> entries;  // (label, line attributes)
  for (size_t r = 0; r < runs.size(); ++r)
    entries.emplace_back(runs[r].name, fmt::format("stroke=\"{}\"", plan::kSvgColors[r % std::size(plan::kSvgColors)]));
  entries.emplace_back("training loss", "stroke=\"black\"");
  entries.emplace_back("validation loss", "stroke=\"black\" stroke-dasharray=\"6 3\"");
  for (size_t k = 0; k < entries.size(); ++k) {
    const double y = kTop + 10 + 20.0 * static_cast<double>(k);
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke-width=\"2\" {}/><text x=\"{}\" y=\"{}\">{}</text>\n",
                       legend, y, legend + 24, y, entries[k].second, legend + 30, y + 4, xml_escaped(entries[k].first));
  }
  return out + "</svg>\n";
}

void write_curves(const fs::path& run_dir) { train::write_text(run_dir / "curves.svg", curves_svg({read_curves(run_dir)})); }

}  // namespace remat::trainer
