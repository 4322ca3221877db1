#include "plan/report.h"

#include "base/check.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <iterator>

namespace remat::plan {
namespace {

using ir::Graph;
using ir::Node;
using ir::Op;

enum Category { kParameters, kOptimizer, kBatch, kWeightCopies, kResiduals, kGradients, kTemporaries };
const char* kCategoryNames[] = {"parameters",      "optimizer state", "batch",      "weight copies",
                                "saved residuals", "gradients",       "temporaries"};
const char* kCategoryKeys[] = {"parameters",      "optimizer_state", "batch",      "weight_copies",
                               "saved_residuals", "gradients",       "temporaries"};  // in the JSON
static_assert(std::size(kCategoryNames) == kNumCategories && std::size(kSvgColors) == kNumCategories &&
              std::size(kCategoryKeys) == kNumCategories);

// The step counter and the loss-scale state are a few bytes; they count with the batch.
Category argument_kind(ir::Role role) {
  switch (role) {
    case ir::Role::parameter: return kParameters;
    case ir::Role::optimizer_state: return kOptimizer;
    case ir::Role::step:
    case ir::Role::loss_scale:
    case ir::Role::batch:
    case ir::Role::metric:
    case ir::Role::output: return kBatch;
  }
  return kBatch;
}

// The checkpoint name a buffer's value carries, if any: a name op aliasing it, or, for a scan's stacked
// output, the name its body result carries.
std::string checkpoint_name(const Graph& g, const Plan& p, const Buffer& b) {
  if (b.value < 0) return "";
  for (const Node& n : g.nodes)
    if (n.op == Op::name && p.root[static_cast<size_t>(n.outputs[0])] == b.value) return n.attrs.str("name");
  const Node& def = g.nodes[static_cast<size_t>(b.node)];
  if (def.op == Op::scan) {
    size_t k = static_cast<size_t>(std::find(def.outputs.begin(), def.outputs.end(), b.value) - def.outputs.begin());
    ir::ValueId r = def.body->results[k];
    for (const Node& m : def.body->nodes)
      if (m.op == Op::name && m.outputs[0] == r) return m.attrs.str("name");
  }
  return "";
}

// The `top` largest buffers, largest first (in plan order among equals).
std::vector<Allocation> largest(const Plan& p, const Graph& g, int top) {
  std::vector<Allocation> out;
  std::vector<const Buffer*> order;
  for (const Buffer& b : p.buffers) order.push_back(&b);
  std::stable_sort(order.begin(), order.end(), [](const Buffer* a, const Buffer* b) { return a->bytes > b->bytes; });
  for (const Buffer* b : order) {
    if (static_cast<int>(out.size()) >= top) break;
    const Node& def = g.nodes[static_cast<size_t>(b->node)];
    Allocation a;
    a.bytes = b->bytes;
    a.op = b->workspace  ? fmt::format("{} (workspace)", ir::op_name(def.op))
           : b->value < 0 ? "scan body (sub-arena)"
                          : std::string(ir::op_name(def.op));
    a.scope = def.scope;
    a.name = checkpoint_name(g, p, *b);
    std::vector<std::string> shapes;  // a convert_group's buffer holds all its outputs
    for (ir::ValueId v : def.op == Op::convert_group ? def.outputs : std::vector<ir::ValueId>{b->value})
      if (b->value >= 0) shapes.push_back(ir::shape_str(g.type(v).shape));
    a.shape = fmt::format("{}", fmt::join(shapes, ","));
    a.dtype = b->value < 0 ? "" : std::string(dtype_name(g.type(b->value).dtype));
    a.start = b->start;
    a.end = b->end;
    a.space = b->space;
    out.push_back(a);
  }
  return out;
}

}  // namespace

std::string bytes_str(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

int64_t parse_bytes(const std::string& text, const std::string& key) {
  double value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(begin, end, value);
  std::string unit(p, end);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }), unit.end());
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1},         {"B", 1},         {"KB", 1e3},         {"MB", 1e6},        {"GB", 1e9},
      {"TB", 1e12},    {"KiB", 1 << 10}, {"MiB", 1 << 20},    {"GiB", 1 << 30},   {"TiB", 1099511627776.0}};
  for (const auto& [u, scale] : units)
    if (ec == std::errc() && unit == u && value >= 0) return static_cast<int64_t>(value * scale);
  CHECK(false, "config key '{}' expects a size such as 16GiB, 512MiB, 80GB or a byte count, got '{}'", key, text);
  return 0;
}

Report report(const Plan& p, const Graph& g, const ir::Signature& sig, const ReportOptions& options) {
  ASSERT(sig.args.size() == g.params.size() && sig.results.size() == g.results.size());
  Report r;
  r.options = options;
  r.communication = ir::communication(g);
  std::array<int64_t, kNumCategories> args{};
  for (size_t i = 0; i < g.params.size(); ++i)
    args[argument_kind(sig.args[i].role)] += g.type(g.params[i]).bytes();
  r.parameters = args[kParameters];
  r.optimizer_state = args[kOptimizer];
  r.batch = args[kBatch];
  for (size_t k = 0; k < g.results.size(); ++k) {
    int64_t b = g.type(g.results[k]).bytes();
    (p.donated_param[k] >= 0 ? r.donated : r.outputs) += b;
  }
  r.temporaries = p.arena[0];
  r.lower_bound = p.lower_bound[0];
  r.host = p.arena[1];
  r.total = r.parameters + r.optimizer_state + r.batch + r.temporaries;

  // Categories of arena buffers: weight copies are parameters (or slices of them) converted to another
  // dtype; saved residuals cross the loss (defined up to it, read after it); after the loss, weight-shaped
  // values outside the optimizer are gradients; the rest are temporaries. Buffers inside a scan body are
  // its sub-arena, one temporary (per_layer's casts; with gradient accumulation, the whole model's).
  std::vector<int> producer(g.types.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ir::ValueId v : g.nodes[i].outputs) producer[static_cast<size_t>(v)] = static_cast<int>(i);
  // The loss as the forward made it (the program records it: before any sum over ranks, mean or scaling).
  int loss_step = 0;
  if (sig.loss >= 0) {
    const int made_by = producer[static_cast<size_t>(sig.loss)];
    ASSERT(made_by >= 0 || std::find(g.params.begin(), g.params.end(), sig.loss) != g.params.end());
    if (made_by >= 0) loss_step = p.position[static_cast<size_t>(made_by)];
  }
  std::vector<ir::Type> weight_types;
  for (size_t i = 0; i < g.params.size(); ++i)
    if (argument_kind(sig.args[i].role) == kParameters) weight_types.push_back(g.type(g.params[i]));
  const int steps = static_cast<int>(p.schedule.size());
  std::array<int64_t, kNumCategories> at_start{};
  for (int c : {kParameters, kOptimizer, kBatch}) at_start[static_cast<size_t>(c)] = args[static_cast<size_t>(c)];
  r.timeline.assign(static_cast<size_t>(steps + 1), at_start);
  auto of_parameter = [&](ir::ValueId v) {  // a parameter, or a view or slice of one
    for (int d; (d = producer[static_cast<size_t>(v)]) >= 0;) {
      const Node& n = g.nodes[static_cast<size_t>(d)];
      if (n.op != Op::reshape && n.op != Op::name && n.op != Op::slice && n.op != Op::dynamic_slice) return false;
      v = n.inputs[0];
    }
    auto it = std::find(g.params.begin(), g.params.end(), v);
    return it != g.params.end() && argument_kind(sig.args[static_cast<size_t>(it - g.params.begin())].role) == kParameters;
  };
  auto weight_copy = [&](const Buffer& b) {
    if (b.value < 0) return false;
    const Node& def = g.nodes[static_cast<size_t>(b.node)];
    return (def.op == Op::convert_element_type || def.op == Op::convert_group) &&
           std::all_of(def.inputs.begin(), def.inputs.end(), of_parameter);
  };
  for (const Buffer& b : p.buffers) {
    if (b.space != Space::device) continue;
    Category c = kTemporaries;
    if (weight_copy(b)) {
      c = kWeightCopies;
    } else if (b.start <= loss_step && b.end > loss_step && b.value >= 0) {
      c = kResiduals;
    } else if (b.start > loss_step && b.value >= 0) {
      const Node& def = g.nodes[static_cast<size_t>(b.node)];
      // A weight's shape, in its type or a narrower one (a bf16 gradient the optimizer widens on load)
      const ir::Type& t = g.type(b.value);
      const bool weight_shaped = std::any_of(weight_types.begin(), weight_types.end(), [&](const ir::Type& w) {
        return w.shape == t.shape && (w.dtype == t.dtype || widens_exactly(t.dtype, w.dtype));
      });
      if (weight_shaped && def.scope.rfind("optimizer", 0) != 0) c = kGradients;
    }
    for (int s = b.start; s <= b.end; ++s) r.timeline[static_cast<size_t>(s)][c] += b.bytes;
  }
  int64_t best = -1;
  for (int s = 0; s <= steps; ++s) {
    int64_t sum = 0;
    for (int64_t x : r.timeline[static_cast<size_t>(s)]) sum += x;
    if (sum > best) best = sum, r.peak_step = s;
  }

  r.largest = largest(p, g, options.top);
  return r;
}

std::string Report::text() const {
  std::string out;
  if (!options.title.empty()) out += options.title + "\n";
  if (!fits())
    out += fmt::format("Out of memory: needs {} of {} (over by {})\n", bytes_str(static_cast<double>(total)),
                       bytes_str(static_cast<double>(options.limit)), bytes_str(static_cast<double>(total - options.limit)));
  out += fmt::format("Total device memory: {}\n", bytes_str(static_cast<double>(total)));
  out += fmt::format("  arguments: {} (parameters {}, optimizer state {}, batch {})\n",
                     bytes_str(static_cast<double>(parameters + optimizer_state + batch)),
                     bytes_str(static_cast<double>(parameters)), bytes_str(static_cast<double>(optimizer_state)),
                     bytes_str(static_cast<double>(batch)));
  out += fmt::format("  outputs and aliases: {} written in place into their arguments (donated); {} other outputs\n",
                     bytes_str(static_cast<double>(donated)), bytes_str(static_cast<double>(outputs)));
  out += fmt::format("  temporaries (arena): {}; lower bound {}; fragmentation {}\n",
                     bytes_str(static_cast<double>(temporaries)), bytes_str(static_cast<double>(lower_bound)),
                     temporaries > 0 ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(temporaries - lower_bound) /
                                                                 static_cast<double>(temporaries))
                                     : std::string("0%"));
  std::vector<std::string> parts;
  int64_t live = 0;
  for (size_t c = 0; c < kNumCategories; ++c)
    if (int64_t b = timeline.empty() ? 0 : timeline[static_cast<size_t>(peak_step)][c]; b > 0) {
      parts.push_back(fmt::format("{} {}", kCategoryNames[c], bytes_str(static_cast<double>(b))));
      live += b;
    }
  out += fmt::format("  live at the peak (schedule step {}): {} = {}\n", peak_step, bytes_str(static_cast<double>(live)),
                     fmt::join(parts, " + "));
  out += fmt::format("Host memory (offloaded residuals): {}\n", bytes_str(static_cast<double>(host)));
  out += fmt::format("FLOPs per step: forward {:.4g} G, backward and update {:.4g} G, recompute {:.4g} G\n",
                     options.forward_flops / 1e9, options.backward_flops / 1e9, options.recompute_flops / 1e9);
  out += "Communication per step (count, operand bytes, bytes each device sends; what recomputation runs again):\n" +
         communication_text(communication, "  ");
  out += fmt::format("Largest program allocations ({}):\n", largest.size());
  for (size_t i = 0; i < largest.size(); ++i) {
    const Allocation& a = largest[i];
    out += fmt::format("  {:>2}. {:>11}  {}{}{}{}  [{}, {}]{}\n", i + 1, bytes_str(static_cast<double>(a.bytes)), a.op,
                       a.name.empty() ? "" : " '" + a.name + "'", a.shape.empty() ? "" : " " + a.dtype + a.shape,
                       a.scope.empty() ? "" : " scope=" + a.scope, a.start, a.end,
                       a.space == Space::host ? " host" : "");
  }
  return out;
}

// Live device bytes by category at the peak step.
nlohmann::json Report::peak_json() const {
  nlohmann::json j = {{"step", peak_step}};
  for (size_t c = 0; c < kNumCategories; ++c)
    j[kCategoryKeys[c]] = timeline.empty() ? 0 : timeline[static_cast<size_t>(peak_step)][c];
  return j;
}

nlohmann::json Report::json() const {
  nlohmann::json largest_rows = nlohmann::json::array();
  for (const Allocation& a : largest)
    largest_rows.push_back({{"bytes", a.bytes}, {"op", a.op}, {"scope", a.scope}, {"name", a.name}, {"shape", a.shape},
                            {"dtype", a.dtype}, {"live", {a.start, a.end}},
                            {"space", a.space == Space::host ? "host" : "device"}});
  return {{"title", options.title},
          {"total", total},
          {"limit", options.limit},
          {"fits", fits()},
          {"arguments", {{"parameters", parameters}, {"optimizer_state", optimizer_state}, {"batch", batch}}},
          {"outputs", {{"donated", donated}, {"other", outputs}}},
          {"temporaries", temporaries},
          {"lower_bound", lower_bound},
          {"host", host},
          {"flops", {{"forward", options.forward_flops}, {"backward", options.backward_flops}, {"recompute", options.recompute_flops}}},
          {"communication", communication_json(communication)},
          {"peak", peak_json()},
          {"largest", largest_rows}};
}

namespace {

nlohmann::json communication_row(const ir::CommunicationTotals& c) {
  auto one = [](const ir::Communication& x) { return nlohmann::json{{"count", x.count}, {"bytes", x.bytes}, {"sent", x.sent}}; };
  nlohmann::json j = one(c.all);
  j["recomputed"] = one(c.recomputed);
  return j;
}

}  // namespace

std::string communication_text(const ir::CommunicationTable& t, const std::string& indent) {
  if (t.empty()) return indent + "none\n";
  std::string out;
  for (const auto& [kind, c] : t) {
    out += fmt::format("{}{:<10} {:<15} x{:<6} {:>11} {:>11} sent", indent, kind.axis, ir::op_name(kind.op), c.all.count,
                       bytes_str(c.all.bytes), bytes_str(c.all.sent));
    if (c.recomputed.count > 0)
      out += fmt::format("   recomputed x{} {} ({} sent)", c.recomputed.count, bytes_str(c.recomputed.bytes),
                         bytes_str(c.recomputed.sent));
    out += "\n";
  }
  return out;
}

nlohmann::json communication_json(const ir::CommunicationTable& t) {
  nlohmann::json by_op = nlohmann::json::object(), by_axis = nlohmann::json::object();
  for (const auto& [kind, c] : t) {
    by_axis[kind.axis][std::string(ir::op_name(kind.op))] = communication_row(c);
    if (!by_op.contains(ir::op_name(kind.op)))
      by_op[std::string(ir::op_name(kind.op))] = communication_row(ir::communication_of(t, kind.op));
  }
  return {{"by_op", by_op}, {"by_axis", by_axis}};
}

std::string svg_begin(double width, double height, double title_x, double title_y, const std::string& title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"{}\">{}</text>\n",
      width, height, title_x, title_y, title);
}

std::string Report::svg() const {
  const double width = 960, height = 420, left = 80, right = 200, top = 30, bottom = 40;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  int64_t peak = 0;
  for (const auto& row : timeline) {
    int64_t s = 0;
    for (int64_t x : row) s += x;
    peak = std::max(peak, s);
  }
  const size_t n = timeline.size();
  auto x_at = [&](size_t s) { return left + plot_w * (n <= 1 ? 0.0 : static_cast<double>(s) / static_cast<double>(n - 1)); };
  auto y_at = [&](int64_t b) { return top + plot_h * (1.0 - (peak > 0 ? static_cast<double>(b) / static_cast<double>(peak) : 0)); };
  std::string out =
      svg_begin(width, height, left, 18, options.title.empty() ? "live device bytes over the schedule" : options.title);
  std::vector<int64_t> below(n, 0);
  for (int c = 0; c < static_cast<int>(kNumCategories); ++c) {
    std::string points;
    for (size_t s = 0; s < n; ++s) points += fmt::format("{:.1f},{:.1f} ", x_at(s), y_at(below[s] + timeline[s][static_cast<size_t>(c)]));
    for (size_t s = n; s-- > 0;) points += fmt::format("{:.1f},{:.1f} ", x_at(s), y_at(below[s]));
    for (size_t s = 0; s < n; ++s) below[s] += timeline[s][static_cast<size_t>(c)];
    out += fmt::format("<polygon points=\"{}\" fill=\"{}\" stroke=\"none\"/>\n", points, kSvgColors[c]);
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                       width - right + 16, top + 20.0 * c, kSvgColors[c], width - right + 34, top + 20.0 * c + 11, kCategoryNames[c]);
  }
  out += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"black\" stroke-dasharray=\"4\"/>\n",
                     x_at(static_cast<size_t>(peak_step)), top, top + plot_h);
  out += fmt::format("<text x=\"{:.1f}\" y=\"{}\">peak {} at step {}</text>\n", x_at(static_cast<size_t>(peak_step)) + 4,
                     top + 14, bytes_str(static_cast<double>(peak)), peak_step);
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left, top, top + plot_h);
  out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", left, top + plot_h, left + plot_w);
  out += fmt::format("<text x=\"4\" y=\"{}\">{}</text>\n<text x=\"4\" y=\"{}\">0</text>\n", top + 10,
                     bytes_str(static_cast<double>(peak)), top + plot_h);
  out += fmt::format("<text x=\"{}\" y=\"{}\">schedule step (0 .. {})</text>\n</svg>\n", left + plot_w / 2 - 60,
                     height - 10, n - 1);
  return out;
}

}  // namespace remat::plan
