#include "ir/fold_widening.h"

#include "ir/dce.h"

#include <algorithm>
#include <optional>

namespace remat::ir {

namespace {

// Reader q of node n widens on load: sum_of_squares' x (not yet widening) or adamw's gradient.
bool widens_on_load(const Node& n, size_t q) {
  return (n.op == Op::sum_of_squares && q == 0 && !n.attrs.has("dtype")) || (n.op == Op::adamw && q == 3);
}

// The body's narrow y where it widens stacked output k as its last act: a convert whose output is that result
// alone (read by no node of the body, no other result), from a type it widens exactly. The convert is removed.
std::optional<ValueId> unwiden_result(Graph& body, size_t k) {
  const ValueId y = body.results[k];
  if (std::count(body.results.begin(), body.results.end(), y) != 1) return std::nullopt;
  auto convert = body.nodes.end();
  for (auto it = body.nodes.begin(); it != body.nodes.end(); ++it) {
    if (std::find(it->inputs.begin(), it->inputs.end(), y) != it->inputs.end()) return std::nullopt;
    if (it->outputs.size() == 1 && it->outputs[0] == y) convert = it;
  }
  if (convert == body.nodes.end() || convert->op != Op::convert_element_type ||
      !widens_exactly(body.type(convert->inputs[0]).dtype, body.type(y).dtype))
    return std::nullopt;
  const ValueId narrow = convert->inputs[0];
  body.nodes.erase(convert);
  body.results[k] = narrow;
  return narrow;
}

}  // namespace

bool fold_widening_converts(Graph& g) {
  const size_t values = g.types.size();
  std::vector<std::vector<std::pair<size_t, size_t>>> readers(values);  // (node, operand)
  std::vector<int> producer(values, -1);
  std::vector<bool> result(values, false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (size_t q = 0; q < g.nodes[i].inputs.size(); ++q)
      readers[static_cast<size_t>(g.nodes[i].inputs[q])].emplace_back(i, q);
    for (ValueId v : g.nodes[i].outputs) producer[static_cast<size_t>(v)] = static_cast<int>(i);
  }
  for (ValueId r : g.results) result[static_cast<size_t>(r)] = true;
  bool changed = false;
  for (size_t v = 0; v < values; ++v) {
    if (result[v] || readers[v].empty() || producer[v] < 0 ||
        !std::all_of(readers[v].begin(), readers[v].end(),
                     [&](const auto& r) { return widens_on_load(g.nodes[r.first], r.second); }))
      continue;
    Node& n = g.nodes[static_cast<size_t>(producer[v])];
    const DType wide = g.types[v].dtype;
    std::optional<ValueId> narrow;  // what the readers read instead
    if (n.op == Op::convert_element_type && widens_exactly(g.type(n.inputs[0]).dtype, wide)) {
      narrow = n.inputs[0];  // the convert is left dead (dce below)
    } else if (n.op == Op::scan) {
      const auto id = static_cast<ValueId>(v);
      const auto k = static_cast<size_t>(std::find(n.outputs.begin(), n.outputs.end(), id) - n.outputs.begin());
      if (k < static_cast<size_t>(scan_attrs(n.attrs).num_carry)) continue;
      if (const std::optional<ValueId> y = unwiden_result(*n.body, k)) {
        g.types[v].dtype = n.body->type(*y).dtype;  // the stack, now narrow
        narrow = id;
      }
    }
    if (!narrow) continue;
    for (const auto& [i, q] : readers[v]) {
      Node& reader = g.nodes[i];
      reader.inputs[q] = *narrow;
      if (reader.op == Op::sum_of_squares) reader.attrs.set("dtype", wide);
    }
    changed = true;
  }
  if (changed) dce(g);
  return changed;
}

}  // namespace remat::ir
