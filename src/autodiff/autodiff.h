// Reverse-mode automatic differentiation over the IR (DESIGN §3).
// grad() appends the backward pass to the same graph: for each node in reverse order its VJP rule emits
// IR that maps output cotangents to input cotangents; cotangents of a value read twice are summed with
// `add`. Backward nodes carry their forward node's scope. Differentiating a scan augments the forward scan
// to also emit its per-iteration residuals (stacked [length, ...]) and adds a reverse scan over the body's
// VJP. Only floating-point values carry cotangents.
//
//   ir::Graph step = autodiff::grad_graph(loss_graph, {0, 1});  // results: loss, d/dparam0, d/dparam1
#pragma once

#include "ir/ir.h"

#include <span>
#include <utility>
#include <vector>

namespace remat::autodiff {

// Appends d(loss)/d(wrt[i]) for a scalar floating-point `loss`. A value that does not reach the loss gets
// a zero gradient. Returns one value id per entry of `wrt`.
std::vector<ir::ValueId> grad(ir::Graph& g, ir::ValueId loss, std::span<const ir::ValueId> wrt);

// A new graph whose results are f's results followed by the gradient of f's first result (a scalar)
// with respect to f's params at `wrt_params` (indices into f.params). Dead code is removed.
ir::Graph grad_graph(const ir::Graph& f, std::span<const int> wrt_params);

}  // namespace remat::autodiff
