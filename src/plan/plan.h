// Public header of the memory planner (docs/policies.md, "The memory plan"): from a graph's shapes alone, a schedule, the live
// range of every buffer and its offset in one arena per memory space (device; host for offloaded values),
// so that the executor allocates each arena once and the planned peak is the real peak.
//
// Invariants:
//  - The graph has no remat regions (inline them first: ir::inline_remat_regions).
//  - reshape and name outputs alias their operand's storage; a value's buffer lives from its definition
//    to the last use of it or of any alias (results: to the end).
//  - A scan body is planned once, into its own sub-arena reused by every iteration; in the outer plan that
//    sub-arena is one buffer live at the scan's step. Stacked outputs are outer buffers, planned once. A
//    stacked result the body makes (not a param, not shared storage, not two results) is made in its slice
//    of the stacked output, with no buffer in the sub-arena: a scan of scans holds one copy of a stack.
//  - A convert_group's outputs share one buffer (at their offsets `within` it), live from the group's
//    step to the last use of any member.
//  - A kernel's workspace (Options::workspace) is a buffer of its node, live at that node's step only.
//  - Graph params are arguments (not in the arenas). A donated result (an updated parameter or moment)
//    is written into its argument's storage, never a second copy.
//
//   plan::Plan p = plan::build(graph, {.donate = {{3, 0}, ...}, .workspace = exec::workspace_of(exec::cpu())});
//   fmt::print("{}", plan::report(p, graph, {}).text());
#pragma once

#include "ir/ir.h"

#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace remat::plan {

enum class Space { device, host };

inline constexpr int64_t kAlignment = 64;  // every buffer starts on a 64-byte boundary
inline constexpr int kInSlice = -3;        // Plan::buffer_of of a stacked result made in place (see above)

struct Buffer {
  ir::ValueId value = -1;   // the value (alias root) it holds (a convert_group's first); -1: a scan's sub-arena
                            // or a kernel's workspace
  int node = -1;            // index (in the graph) of the node that defines it
  int64_t bytes = 0;        // rounded up to kAlignment
  int start = 0, end = 0;   // schedule positions, inclusive
  Space space = Space::device;
  int64_t offset = 0;       // in its space's arena
  bool workspace = false;   // the workspace of node `node`'s kernel, live at its step only
  int64_t requested = 0;    // a workspace's bytes as the backend asked (`bytes` is that rounded up)
};

struct Plan {
  std::vector<int> schedule;              // node indices in execution order
  std::vector<int> position;              // node index -> schedule position
  std::vector<int> buffer_of;             // value id -> buffer index; -1: argument (or donated), -2: none,
                                          // kInSlice: made in its slice of the enclosing scan's stacked output
  std::vector<ir::ValueId> root;          // value id -> the value whose storage it is (itself unless an alias)
  std::vector<int64_t> within;            // value id -> its byte offset inside its buffer (convert_group members)
  std::vector<Buffer> buffers;
  std::map<int, Plan> bodies;             // scan node index -> the body's plan
  std::map<int, int> body_buffer;         // scan node index -> its sub-arena buffer (device)
  std::map<int, int> body_host_buffer;    // scan node index -> its host sub-arena buffer, if any
  std::map<int, int> workspace_buffer;    // node index -> its kernel's workspace buffer, if it needs one
  std::vector<int> donated_param;         // result index -> param index it is written into, or -1
  std::vector<bool> in_slice;             // result index -> made in its slice of the stacked output (scan body)
  int64_t arena[2] = {0, 0};              // bytes per Space
  int64_t lower_bound[2] = {0, 0};        // max live bytes over the schedule, per Space
  std::vector<int64_t> live[2];           // live arena bytes at each schedule position, per Space
};

struct Options {
  // (result index, param index) pairs: the result may be written into the param's storage when the param
  // is dead by then (checked; otherwise it is an ordinary output).
  std::vector<std::pair<int, int>> donate = {};
  // Params that hold one value for the whole graph (all of a step's; a scan body's consts): nodes
  // computed from them alone are scheduled just before their first use.
  size_t invariant_params = SIZE_MAX;
  // A scan body's: results from this index on are stacked by the scan (its ys), each made in its slice when
  // it can be (Plan::in_slice).
  size_t stacked_results_from = SIZE_MAX;
  // Recomputed nodes are scheduled just before their first use (false for the body of a recomputed scan,
  // where every node is a recompute).
  bool float_recomputes = true;
  // Workspace bytes a kernel call of a node needs on operands of these types (the backend's answer:
  // operand copies, library scratchpads); planned as a buffer live at the node's step. Unset: none.
  std::function<int64_t(const ir::Node&, std::span<const ir::Type>)> workspace = {};
};

Plan build(const ir::Graph& g, const Options& options = {});

// The alloc/free event trace of a plan (golden tests): "alloc %v 256 B @0 [node #3 dot_general]" ...
std::string trace(const Plan& p, const ir::Graph& g);

}  // namespace remat::plan
