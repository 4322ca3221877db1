#include "ir/cost.h"

namespace remat::ir {

double flops(const Graph& g, const Node& n) {
  auto elements = [&](ValueId v) { return static_cast<double>(g.type(v).num_elements()); };
  switch (n.op) {
    case Op::dot_general: {
      double k = 1;
      for (int64_t d : n.attrs.int_lists("contract")[0]) k *= static_cast<double>(g.type(n.inputs[0]).shape[static_cast<size_t>(d)]);
      return 2 * elements(n.outputs[0]) * k;
    }
    case Op::scan: return static_cast<double>(n.attrs.integer("length")) * flops(*n.body);
    case Op::remat: return flops(*n.body);
    case Op::reduce_sum:
    case Op::reduce_max: return elements(n.inputs[0]);
    case Op::broadcast_in_dim: case Op::reshape: case Op::transpose: case Op::slice: case Op::dynamic_slice:
    case Op::dynamic_update_slice: case Op::concatenate: case Op::iota: case Op::full: case Op::gather:
    case Op::name: case Op::offload: case Op::reload: case Op::convert_element_type:
    case Op::convert_group:
      return 0;
    case Op::scatter_add: return elements(n.inputs[2]);
    default: return elements(n.outputs[0]);  // elementwise
  }
}

double flops(const Graph& g) {
  double total = 0;
  for (const Node& n : g.nodes) total += flops(g, n);
  return total;
}

}  // namespace remat::ir
