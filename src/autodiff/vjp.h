// Internal to autodiff: the VJP rule table and the reverse sweep that scan's rule re-enters.
#pragma once

#include "ir/ir.h"

#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace remat::autodiff {

using Cot = std::optional<ir::Tensor>;  // nullopt: a zero cotangent (or none, for non-float values)

// One rule per op: input cotangents from output cotangents. Rules run with at least one output cotangent
// present; `n` is a copy of b.graph().nodes[index], safe while the rule appends nodes. Only scan's rule
// touches the forward node (it adds residual outputs).
using VjpRule = std::vector<Cot> (*)(ir::Builder& b, size_t index, const ir::Node& n, std::span<const Cot> out_cots);
VjpRule vjp_rule(ir::Op op);

// Reverse sweep over nodes [0, num_forward) of g, seeded with (value, cotangent) pairs. Returns the
// cotangent of each `wrt` value (nullopt where none reaches it).
std::vector<Cot> backprop(ir::Builder& b, size_t num_forward, std::span<const std::pair<ir::ValueId, ir::ValueId>> seeds,
                          std::span<const ir::ValueId> wrt);

// The scan rule (scan_vjp.cpp).
std::vector<Cot> vjp_scan(ir::Builder& b, size_t index, const ir::Node& n, std::span<const Cot> out_cots);

}  // namespace remat::autodiff
