// A backward split into B (what the input's gradient needs) and W (the rest: the weights' gradients alone).
#include "autodiff/autodiff.h"

namespace remat::autodiff {

std::vector<bool> input_gradient_part(const ir::Graph& g, size_t first, ir::ValueId input_gradient) {
  std::vector<bool> part(g.nodes.size(), false);
  // Nodes only read values of earlier nodes: one walk from the last down marks every producer needed.
  std::vector<bool> needed(static_cast<size_t>(g.num_values()), false);
  needed[static_cast<size_t>(input_gradient)] = true;
  for (size_t i = g.nodes.size(); i-- > first;) {
    const ir::Node& n = g.nodes[i];
    for (ir::ValueId v : n.outputs) part[i] = part[i] || needed[static_cast<size_t>(v)];
    if (!part[i]) continue;
    for (ir::ValueId v : n.inputs) needed[static_cast<size_t>(v)] = true;
  }
  return part;
}

}  // namespace remat::autodiff
