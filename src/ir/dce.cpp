#include "ir/dce.h"

#include <vector>

namespace remat::ir {
namespace {

// Drops the outputs of a scan or remat node that nobody reads (a scan keeps its carries) and the
// inputs its cleaned body no longer reads. Whether it dropped anything.
bool prune_region(Node& n, const std::vector<bool>& live) {
  Graph& body = *n.body;
  const bool scan = n.op == Op::scan;
  ScanAttrs s = scan ? scan_attrs(n.attrs) : ScanAttrs{};
  const size_t nc = scan ? static_cast<size_t>(s.num_consts) : n.inputs.size();
  const size_t nh = static_cast<size_t>(s.num_carry);
  const size_t had_inputs = n.inputs.size(), had_outputs = n.outputs.size();
  std::vector<ValueId> outputs, results;
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    if (k < nh || live[static_cast<size_t>(n.outputs[k])]) {
      outputs.push_back(n.outputs[k]);
      results.push_back(body.results[k]);
    }
  }
  n.outputs = std::move(outputs);
  body.results = std::move(results);
  const bool body_changed = dce(body);
  std::vector<bool> used(body.types.size(), false);
  for (const Node& b : body.nodes)
    for (ValueId v : b.inputs) used[static_cast<size_t>(v)] = true;
  for (ValueId v : body.results) used[static_cast<size_t>(v)] = true;
  std::vector<ValueId> inputs, params;
  std::vector<std::string> names;
  int64_t consts = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    bool carry = i >= nc && i < nc + nh;  // carries stay: their count fixes the body's signature
    if (carry || used[static_cast<size_t>(body.params[i])]) {
      inputs.push_back(n.inputs[i]);
      params.push_back(body.params[i]);
      names.push_back(body.param_names[i]);
      if (i < nc) ++consts;
    }
  }
  n.inputs = std::move(inputs);
  body.params = std::move(params);
  body.param_names = std::move(names);
  if (scan) {
    s.num_consts = consts;
    s.write(n.attrs);
  }
  return body_changed || n.inputs.size() != had_inputs || n.outputs.size() != had_outputs;
}

// Drops the operands of a convert_group whose outputs nobody reads. Whether it dropped any.
bool prune_group(Node& n, const std::vector<bool>& live) {
  std::vector<ValueId> inputs, outputs;
  for (size_t k = 0; k < n.outputs.size(); ++k)
    if (live[static_cast<size_t>(n.outputs[k])]) {
      inputs.push_back(n.inputs[k]);
      outputs.push_back(n.outputs[k]);
    }
  const bool changed = outputs.size() != n.outputs.size();
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return changed;
}

// Whether running `n` has an effect: an effectful op, or a region whose body holds one.
bool has_effects(const Node& n) {
  if (is_effectful(n.op)) return true;
  if (n.body)
    for (const Node& m : n.body->nodes)
      if (has_effects(m)) return true;
  return false;
}

}  // namespace

bool dce(Graph& g) {
  bool changed = false;
  std::vector<bool> live(g.types.size(), false);
  for (ValueId r : g.results) live[static_cast<size_t>(r)] = true;
  std::vector<Node> kept;
  for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) {
    Node& n = *it;
    bool any = has_effects(n);  // an effect is its own reason to run
    for (ValueId v : n.outputs) any = any || live[static_cast<size_t>(v)];
    if (!any) continue;
    if (has_body(n.op)) changed = prune_region(n, live) || changed;
    if (n.op == Op::convert_group) changed = prune_group(n, live) || changed;
    for (ValueId v : n.inputs) live[static_cast<size_t>(v)] = true;
    kept.push_back(std::move(n));
  }
  changed = changed || kept.size() != g.nodes.size();
  g.nodes.assign(std::make_move_iterator(kept.rbegin()), std::make_move_iterator(kept.rend()));
  return changed;
}

}  // namespace remat::ir
