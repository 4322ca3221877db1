// What XLA prints on a compile-time OOM, before running: total memory, arguments (parameters, optimizer
// state, batch), outputs and aliases, temporaries with fragmentation and lower bound, host bytes, the
// largest allocations with op, scope, checkpoint name, shape, dtype, size and live range, FLOPs, and what
// is live at the peak by category; as text, JSON, or an SVG timeline of live bytes stacked by category
// with the peak marked.
#pragma once

#include "ir/cost.h"
#include "plan/plan.h"

#include <nlohmann/json.hpp>

#include <array>

#include <string>

namespace remat::plan {

inline constexpr size_t kNumCategories = 7;  // of live bytes in the timeline (see Report::timeline)

struct ReportOptions {
  std::string title;             // first line, e.g. "model llama2-7b, batch 1 x 4096, remat_policy full"
  int64_t limit = 0;             // device bytes available (hbm_limit); 0: no limit
  int top = 20;                  // largest allocations listed
  double forward_flops = 0, backward_flops = 0, recompute_flops = 0;  // per step
};

struct Allocation {
  int64_t bytes;
  std::string op, scope, name, shape, dtype;
  int start, end;
  Space space;
};

struct Report {
  ReportOptions options;
  int64_t parameters = 0, optimizer_state = 0, batch = 0;  // argument bytes by kind
  int64_t donated = 0;            // outputs written into their arguments (aliases: no extra memory)
  int64_t outputs = 0;            // other outputs (in the arena)
  int64_t temporaries = 0;        // the device arena
  int64_t lower_bound = 0;        // max live device bytes (no fragmentation)
  int64_t host = 0;               // the host arena (offloaded residuals)
  int64_t total = 0;              // device: arguments + arena
  std::vector<Allocation> largest;
  ir::CommunicationTable communication;  // per step, one device's collectives by axis and kind
  // Live device bytes per schedule step, by category: parameters, optimizer state, batch, weight copies
  // (parameters or slices of them converted to another dtype, outside scan bodies), saved residuals,
  // gradients, temporaries (including scan bodies' sub-arenas).
  std::vector<std::array<int64_t, kNumCategories>> timeline;
  int peak_step = 0;

  bool fits() const { return options.limit <= 0 || total <= options.limit; }
  std::string text() const;
  nlohmann::json json() const;
  std::string svg() const;
  nlohmann::json peak_json() const;  // {"step": n, "parameters": bytes, "optimizer_state": ..., ...} at the peak
};

// One device's communication per step as text lines (each starting with `indent`): per axis and collective, the
// count, operand bytes and bytes sent, with the part recomputation runs again; "none" when there is none.
std::string communication_text(const ir::CommunicationTable& t, const std::string& indent);
// As JSON: {"by_op": {op: {count, bytes, sent, recomputed: {...}}}, "by_axis": {axis: {op: {...}}}}.
nlohmann::json communication_json(const ir::CommunicationTable& t);

// Arguments are counted by their role in `sig` (the step counter and loss-scale state with the batch).
Report report(const Plan& p, const ir::Graph& g, const ir::Signature& sig, const ReportOptions& options);

// remat's SVG pictures (the plan's timeline, the policy frontier, a run's loss curves) share one look: these
// colours, sans-serif 12 px text on white, a title line at the top.
inline constexpr const char* kSvgColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#edc948", "#e15759", "#b07aa1", "#9c9c9c"};
// The opening of such a picture: the root element, its white background and `title` at (title_x, title_y); the
// caller closes it with "</svg>\n".
std::string svg_begin(double width, double height, double title_x, double title_y, const std::string& title);

// "21.91 GiB"
std::string bytes_str(double bytes);
// Parses "16GiB", "16 GB", "512MiB", "1073741824" (bytes); errors name the config key.
int64_t parse_bytes(const std::string& text, const std::string& key);

}  // namespace remat::plan
