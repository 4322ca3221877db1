#include "ir/finite_checks.h"

#include "base/check.h"

#include <map>

namespace remat::ir {

bool insert_finite_checks(Graph& g) {
  bool changed = false;
  std::map<ValueId, std::string> names;  // value -> the checkpoint name a `name` op gives it
  for (const Node& n : g.nodes)
    if (n.op == Op::name) names[n.inputs[0]] = n.attrs.str("name");
  std::map<ValueId, ValueId> checked;  // value -> its check's output
  std::vector<Node> nodes;
  for (Node& n : g.nodes) {
    ASSERT(n.op != Op::remat);
    for (ValueId& v : n.inputs)
      if (auto it = checked.find(v); it != checked.end()) v = it->second;
    if (n.op == Op::scan) changed = insert_finite_checks(*n.body) || changed;
    const bool computes = !is_view(n.op) && !is_region(n.op);
    std::vector<ValueId> outputs = n.outputs;
    std::string what = fmt::format("{}{}", op_name(n.op), n.scope.empty() ? "" : fmt::format(" (scope '{}')", n.scope));
    nodes.push_back(std::move(n));
    if (!computes) continue;
    for (ValueId v : outputs) {
      if (!is_float(g.type(v).dtype)) continue;
      Node check;
      check.op = Op::check_finite;
      check.inputs = {v};
      check.outputs = {g.new_value(g.type(v))};
      check.scope = nodes.back().scope;
      check.origin = next_origin();
      auto name = names.find(v);
      check.attrs.set("of", name == names.end() ? what : fmt::format("{}, checkpoint name '{}'", what, name->second));
      checked[v] = check.outputs[0];
      changed = true;
      nodes.push_back(std::move(check));
    }
  }
  g.nodes = std::move(nodes);
  for (ValueId& r : g.results)
    if (auto it = checked.find(r); it != checked.end()) r = it->second;
  return changed;
}

}  // namespace remat::ir
