#include "ir/instantiate.h"

#include "base/check.h"

namespace remat::ir {

namespace {

std::string under(const std::string& prefix, const std::string& scope) {
  if (prefix.empty()) return scope;
  return scope.empty() ? prefix : prefix + "/" + scope;
}

uint64_t origin_of(Instance& instance, uint64_t origin) {
  auto [it, fresh] = instance.origins.try_emplace(origin, 0);
  if (fresh) it->second = instance.keep_origins ? origin : next_origin();
  return it->second;
}

// A deep copy of a body with its ops' scopes and origins those of the instance (its values are its own).
std::shared_ptr<Graph> body_of(const Graph& body, const std::string& prefix, Instance& instance) {
  auto copy = std::make_shared<Graph>(body);
  for (Node& n : copy->nodes) {
    n.scope = under(prefix, n.scope);
    n.origin = origin_of(instance, n.origin);
    if (n.body) n.body = body_of(*n.body, prefix, instance);
  }
  return copy;
}

}  // namespace

void instantiate(Builder& b, const Graph& from, size_t first, size_t last, Instance& instance,
                 const std::vector<bool>* only, bool taken) {
  ASSERT(first <= last && last <= from.nodes.size());
  Graph& g = b.graph();
  const std::string prefix = b.current_scope();
  for (size_t i = first; i < last; ++i) {
    if (only && (*only)[i] != taken) continue;
    const Node& t = from.nodes[i];
    Node n;
    n.op = t.op;
    for (ValueId v : t.inputs) {
      auto it = instance.values.find(v);
      ASSERT(it != instance.values.end());  // the caller maps the template's params, the copies the rest
      n.inputs.push_back(it->second.id);
    }
    for (ValueId v : t.outputs) {
      n.outputs.push_back(g.new_value(from.type(v)));
      instance.values.insert_or_assign(v, b.wrap(n.outputs.back()));
    }
    n.attrs = t.attrs;
    n.scope = under(prefix, t.scope);
    n.body = t.body ? body_of(*t.body, prefix, instance) : nullptr;
    n.origin = origin_of(instance, t.origin);
    n.recomputed = t.recomputed;
    g.nodes.push_back(std::move(n));
  }
}

}  // namespace remat::ir
