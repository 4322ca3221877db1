// A simulated schedule as a text grid and as an SVG picture.
#include "parallel/parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace remat::parallel {
namespace {

std::string label(const Schedule& s, const Action& a) {
  const char kind = a.step == Step::forward ? 'F' : a.step == Step::weight ? 'W' : 'B';
  std::string l = fmt::format("{}{}", kind, a.microbatch);
  return s.shape.chunks > 1 ? l + fmt::format(".{}", a.chunk) : l;
}

// The time of one column: the shortest compute action.
double unit_of(const Simulation& t) {
  double unit = 0;
  for (const RankTimeline& r : t.ranks)
    for (const Slot& c : r.compute)
      if (c.end > c.start && (unit == 0 || c.end - c.start < unit)) unit = c.end - c.start;
  return unit > 0 ? unit : 1;
}

}  // namespace

std::string grid(const Schedule& s, const Simulation& t) {
  const double unit = unit_of(t);
  const size_t columns = static_cast<size_t>(std::ceil(t.makespan / unit - 1e-9));
  size_t width = 2;
  for (const std::vector<Action>& r : s.ranks)
    for (const Action& a : r) width = std::max(width, label(s, a).size());
  std::string out = fmt::format("{} schedule: {} stages x {} chunk(s), {} microbatches; a column is one forward\n",
                                schedule_name(s.kind), s.shape.stages, s.shape.chunks, s.shape.microbatches);
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    std::vector<std::string> cells(columns, ".");
    for (const Slot& c : t.ranks[r].compute) {
      const size_t from = static_cast<size_t>(std::lround(c.start / unit)), to = static_cast<size_t>(std::lround(c.end / unit));
      for (size_t i = from; i < to && i < columns; ++i) cells[i] = label(s, c.action);
    }
    out += fmt::format("rank {:>2} |", r);
    for (const std::string& c : cells) out += fmt::format(" {:<{}}", c, width);
    out += "\n";
  }
  for (size_t r = 0; r < t.ranks.size(); ++r)
    out += fmt::format("rank {:>2}: at most {} microbatch-chunk(s) in flight, bubble {:.1f}%\n", r,
                       t.ranks[r].peak_in_flight, t.makespan > 0 ? 100 * t.bubble(r) : 0.0);
  return out;
}

std::string svg(const Schedule& s, const Simulation& t) {
  const double scale = 600 / std::max(t.makespan, 1e-9), row = 28, left = 60;
  const double width = left + 600 + 10, height = row * static_cast<double>(t.ranks.size()) + 30;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"monospace\" font-size=\"10\">\n"
      "<text x=\"4\" y=\"14\">{} schedule: {} stages x {} chunk(s), {} microbatches</text>\n",
      width, height, schedule_name(s.kind), s.shape.stages, s.shape.chunks, s.shape.microbatches);
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    const double y = 22 + row * static_cast<double>(r);
    out += fmt::format("<text x=\"4\" y=\"{}\">rank {}</text>\n", y + 16, r);
    for (const Slot& c : t.ranks[r].compute) {
      const char* fill = c.action.step == Step::forward ? "#8ab6e6" : c.action.step == Step::weight ? "#b6d98a" : "#e6a88a";
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"white\"/>"
          "<text x=\"{:.2f}\" y=\"{}\">{}</text>\n",
          left + c.start * scale, y, (c.end - c.start) * scale, row - 4, fill,
          left + c.start * scale + 2, y + 16, label(s, c.action));
    }
  }
  return out + "</svg>\n";
}

}  // namespace remat::parallel
