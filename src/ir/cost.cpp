#include "ir/cost.h"

#include "base/check.h"

namespace remat::ir {
namespace {

// The operations per element of the ops whose cost is `counted`, as ops.h counts them.
double flops_per_element(const Node& n) {
  const bool masked = n.inputs.size() == (n.op == Op::softmax ? 2u : 3u);  // a softmax's scale and mask
  switch (n.op) {
    case Op::softmax: return masked ? 7 : 5;
    case Op::softmax_grad: return masked ? 11 : 9;
    case Op::log_softmax: return 5;
    case Op::log_softmax_grad: return 4;
    case Op::rope: return 3;
    case Op::rms_norm: return 4;
    case Op::swiglu: return 3;
    case Op::swiglu_grad: return 10;
    case Op::rms_norm_grad: return 10;
    case Op::target_log_prob: return 5;
    case Op::target_log_prob_grad: return 6;
    default: ASSERT(false);
  }
  return 0;
}

}  // namespace

double flops(const Graph& g, const Node& n) {
  auto elements = [&](ValueId v) { return static_cast<double>(g.type(v).num_elements()); };
  switch (op_traits(n.op).cost) {  // the op table's cost column
    case OpCost::none: return 0;
    case OpCost::per_output: return elements(n.outputs[0]);
    case OpCost::per_input: return elements(n.inputs[0]);
    case OpCost::per_update: return elements(n.inputs[2]);
    case OpCost::contraction: {  // 2 per multiply-add: 2 · (result elements) · (contracted size)
      double k = 1;
      for (int64_t d : n.attrs.int_lists("contract")[0]) k *= static_cast<double>(g.type(n.inputs[0]).shape[static_cast<size_t>(d)]);
      return 2 * elements(n.outputs[0]) * k;
    }
    case OpCost::attention: {  // per head and (query, key) pair visited: 2·Dh multiply-adds, 5 of them backward
      const Shape& q = g.type(n.inputs[0]).shape;
      const double T = static_cast<double>(q[1]), S = static_cast<double>(g.type(n.inputs[1]).shape[1]);
      const double pairs = n.attrs.boolean("causal") ? T * (T + 1) / 2 : T * S;
      return (n.op == Op::attention ? 4 : 10) * static_cast<double>(q[0] * q[2] * q[3]) * pairs;
    }
    case OpCost::counted: return flops_per_element(n) * elements(n.inputs[0]);
    case OpCost::body: return (n.op == Op::scan ? static_cast<double>(scan_attrs(n.attrs).length) : 1.0) * flops(*n.body);
  }
  return 0;
}

namespace {

void add_communication(const Graph& g, double trips, bool recomputed, CommunicationTable& out) {
  for (const Node& n : g.nodes) {
    if (n.body)
      add_communication(*n.body, trips * (n.op == Op::scan ? static_cast<double>(scan_attrs(n.attrs).length) : 1.0),
                        recomputed || n.recomputed, out);
    const bool message = n.op == Op::send || n.op == Op::recv;
    if (!message && op_traits(n.op).cls != OpClass::collective) continue;
    Communication c{.count = static_cast<int64_t>(trips)};
    if (message) {  // its bytes, sent by the sender only
      c.bytes = static_cast<double>(g.type(n.outputs[0]).bytes()) * trips;
      c.sent = n.op == Op::send ? c.bytes : 0;
    } else {
      const Type& operand = g.type(n.inputs[0]);
      const double ranks = static_cast<double>(n.attrs.integer("ranks"));
      const double parts = n.attrs.has("parts") ? static_cast<double>(n.attrs.integer("parts")) : ranks;
      const DType wire = n.op == Op::all_gather ? g.type(n.outputs[0]).dtype : operand.dtype;  // cast before the gather
      c.bytes = trips * static_cast<double>(operand.num_elements() * dtype_size(wire));
      const double share = n.op == Op::all_reduce ? 2 * (ranks - 1) / ranks : n.op == Op::reduce_scatter ? (ranks - 1) / parts : parts - 1;
      c.sent = share * c.bytes;
    }
    CommunicationTotals& row = out[{n.attrs.str("axis"), n.op}];
    row.all += c;
    if (recomputed || n.recomputed) row.recomputed += c;  // a recomputed region's body runs again whole
  }
}

}  // namespace

CommunicationTable communication(const Graph& g) {
  CommunicationTable out;
  add_communication(g, 1, false, out);
  return out;
}

CommunicationTotals communication_of(const CommunicationTable& t, Op op) {
  CommunicationTotals sum;
  for (const auto& [kind, row] : t)
    if (kind.op == op) sum.all += row.all, sum.recomputed += row.recomputed;
  return sum;
}

double flops(const Graph& g) {
  double total = 0;
  for (const Node& n : g.nodes) total += flops(g, n);
  return total;
}

}  // namespace remat::ir
