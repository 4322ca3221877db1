#include "ir/sink_converts.h"

#include <unordered_map>

namespace remat::ir {

void sink_converts_into_scans(Graph& g) {
  std::vector<int> uses(g.types.size(), 0), producer(g.types.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (ValueId v : g.nodes[i].inputs) ++uses[static_cast<size_t>(v)];
    for (ValueId v : g.nodes[i].outputs) producer[static_cast<size_t>(v)] = static_cast<int>(i);
  }
  for (ValueId r : g.results) ++uses[static_cast<size_t>(r)];
  auto defined_by = [&](ValueId v, Op op) {
    return producer[static_cast<size_t>(v)] >= 0 && g.nodes[static_cast<size_t>(producer[static_cast<size_t>(v)])].op == op;
  };
  std::unordered_map<ValueId, ValueId> replaced;  // a sunk convert's output -> the value now holding it
  std::vector<bool> sunk(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    for (ValueId& v : n.inputs)
      if (auto it = replaced.find(v); it != replaced.end()) v = it->second;
    if (n.op != Op::convert_element_type) continue;
    // Walk back through single-use reshapes to a single-use stacked output of a scan.
    std::vector<ValueId> chain{n.inputs[0]};
    while (uses[static_cast<size_t>(chain.back())] == 1 && defined_by(chain.back(), Op::reshape))
      chain.push_back(g.nodes[static_cast<size_t>(producer[static_cast<size_t>(chain.back())])].inputs[0]);
    const ValueId out = chain.back();
    if (uses[static_cast<size_t>(out)] != 1 || !defined_by(out, Op::scan)) continue;
    Node& scan = g.nodes[static_cast<size_t>(producer[static_cast<size_t>(out)])];
    size_t k = 0;
    while (scan.outputs[k] != out) ++k;
    Graph& body = *scan.body;
    if (k < static_cast<size_t>(scan_attrs(scan.attrs).num_carry)) continue;
    bool offloaded = false;  // a host stack stays as it is: the convert reads it after a reload
    for (const Node& m : body.nodes) offloaded = offloaded || (m.op == Op::offload && m.outputs[0] == body.results[k]);
    if (offloaded) continue;
    // Appended last, the convert runs at the body's end: the narrow y (a body result until now) keeps its
    // lifetime, and the wide copy is the only new buffer, live for one step.
    const DType to = n.attrs.dtype("dtype");
    Node convert;
    convert.op = Op::convert_element_type;
    convert.inputs = {body.results[k]};
    convert.outputs = {body.new_value(Type{to, body.type(body.results[k]).shape})};
    convert.attrs = n.attrs;
    convert.scope = n.scope;
    convert.origin = n.origin;
    body.results[k] = convert.outputs[0];
    body.nodes.push_back(std::move(convert));
    for (ValueId v : chain) g.types[static_cast<size_t>(v)].dtype = to;  // the stack and its reshapes, now wide
    replaced.emplace(n.outputs[0], n.inputs[0]);
    uses[static_cast<size_t>(n.inputs[0])] = uses[static_cast<size_t>(n.outputs[0])];  // its readers move over
    sunk[i] = true;
  }
  for (ValueId& r : g.results)
    if (auto it = replaced.find(r); it != replaced.end()) r = it->second;
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!sunk[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  // Then inside every body, so a convert just sunk into a body can sink further into a nested scan.
  for (Node& n : g.nodes)
    if (n.body) sink_converts_into_scans(*n.body);
}

}  // namespace remat::ir
