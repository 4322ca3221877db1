#include "ir/inline.h"

#include <unordered_map>

namespace remat::ir {

bool inline_remat_regions(Graph& g) {
  bool changed = false;
  std::unordered_map<ValueId, ValueId> subst;
  auto map = [&](ValueId v) {
    auto it = subst.find(v);
    return it == subst.end() ? v : it->second;
  };
  std::vector<Node> out;
  for (Node& n : g.nodes) {
    for (ValueId& v : n.inputs) v = map(v);
    if (n.op == Op::scan) changed = inline_remat_regions(*n.body) || changed;
    if (n.op != Op::remat) {
      out.push_back(std::move(n));
      continue;
    }
    changed = true;
    Graph body = n.body->clone();
    inline_remat_regions(body);
    std::unordered_map<ValueId, ValueId> local;  // body value -> g value
    for (size_t i = 0; i < body.params.size(); ++i) local[body.params[i]] = n.inputs[i];
    for (Node& inner : body.nodes) {
      for (ValueId& v : inner.inputs) v = local.at(v);
      for (ValueId& v : inner.outputs) {
        ValueId fresh = g.new_value(body.type(v));
        local[v] = fresh;
        v = fresh;
      }
      out.push_back(std::move(inner));
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) subst[n.outputs[k]] = local.at(body.results[k]);
  }
  g.nodes = std::move(out);
  for (ValueId& r : g.results) r = map(r);
  return changed;
}

}  // namespace remat::ir
