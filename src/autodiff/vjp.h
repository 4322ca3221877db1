// Internal to autodiff: the VJP rule table and the reverse sweep that scan's and remat's rules re-enter
// (through partial_eval.h).
#pragma once

#include "autodiff/autodiff.h"

#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace remat::autodiff {

using Cot = std::optional<ir::Tensor>;  // nullopt: a zero cotangent (or none, for non-float values)

// What a sweep knows beyond the graph: the decider for remat regions, and which values depend only on
// differentiated parameters and constants (indexed by value id of the swept graph).
struct Context {
  RematDecider* decider = nullptr;
  std::vector<bool> parameter_derived;
  int64_t trip_count = 1;  // executions per step of the swept graph (product of enclosing scan lengths)
  // Values that depend on a differentiated value: only these receive cotangents (the rest, e.g. rope
  // tables built from iota, would only feed dead gradients and ask for needless residuals).
  std::vector<bool> differentiable;
};

// One rule per op: input cotangents from output cotangents. Rules run with at least one output cotangent
// present; `n` is a copy of b.graph().nodes[index], safe while the rule appends nodes. Only the scan and
// remat rules touch the forward node (they add residual outputs).
using VjpRule = std::vector<Cot> (*)(ir::Builder& b, size_t index, const ir::Node& n, std::span<const Cot> out_cots,
                                     Context& ctx);
VjpRule vjp_rule(ir::Op op);

// Marks which values of g's forward nodes [0, num_forward) are parameter-derived, given the flags of g's params.
std::vector<bool> parameter_derived(const ir::Graph& g, size_t num_forward, const std::vector<bool>& param_flags);

// Marks which values of g's forward nodes depend on a param flagged in `param_flags`.
std::vector<bool> differentiable(const ir::Graph& g, size_t num_forward, const std::vector<bool>& param_flags);
// The same for the values `wrt` (params of g or outputs of its forward nodes).
std::vector<bool> differentiable(const ir::Graph& g, size_t num_forward, std::span<const ir::ValueId> wrt);

// The nodes of g past `num_forward` (the backward part) that contribute to `needed`.
std::vector<bool> live_backward(const ir::Graph& g, size_t num_forward, std::vector<ir::ValueId> needed);

// Reverse sweep over nodes [0, num_forward) of g, seeded with (value, cotangent) pairs. Returns the
// cotangent of each `wrt` value (nullopt where none reaches it).
std::vector<Cot> backprop(ir::Builder& b, size_t num_forward, std::span<const std::pair<ir::ValueId, ir::ValueId>> seeds,
                          std::span<const ir::ValueId> wrt, Context& ctx);

// Marks every node of a recompute clone's body (recursively) as recomputed.
void mark_recomputed(ir::Graph& g);

// The region rules (scan_vjp.cpp, remat_vjp.cpp).
std::vector<Cot> vjp_scan(ir::Builder& b, size_t index, const ir::Node& n, std::span<const Cot> out_cots, Context& ctx);
std::vector<Cot> vjp_remat(ir::Builder& b, size_t index, const ir::Node& n, std::span<const Cot> out_cots, Context& ctx);

}  // namespace remat::autodiff
