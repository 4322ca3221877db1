#include "ir/verify.h"

#include "base/check.h"
#include "ir/shape_rules.h"

#include <set>
#include <vector>

namespace remat::ir {

void verify(const Graph& g) {
  std::vector<bool> defined(g.types.size(), false);
  auto valid = [&](ValueId v) { return v >= 0 && static_cast<size_t>(v) < g.types.size(); };
  CHECK(g.params.size() == g.param_names.size(), "graph @{}: {} params but {} param names", g.name, g.params.size(),
        g.param_names.size());
  std::set<std::string> names;
  for (size_t i = 0; i < g.params.size(); ++i) {
    ValueId p = g.params[i];
    CHECK(valid(p) && !defined[static_cast<size_t>(p)], "graph @{}: parameter %{} has a bad or repeated value id {}",
          g.name, g.param_names[i], p);
    CHECK(names.insert(g.param_names[i]).second, "graph @{}: parameter name %{} is used twice", g.name,
          g.param_names[i]);
    defined[static_cast<size_t>(p)] = true;
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    std::string where = describe_node(g, i);
    std::vector<Type> in_types;
    for (ValueId v : n.inputs) {
      CHECK(valid(v) && defined[static_cast<size_t>(v)],
            "{}: reads value id {} before it is defined (nodes must be in topological order)", where, v);
      in_types.push_back(g.type(v));
    }
    CHECK((n.body != nullptr) == has_body(n.op), "{}: {}", where,
          n.body ? "only scan and remat nodes carry a body graph" : "needs a body graph");
    if (n.body) {
      try {
        verify(*n.body);
      } catch (const Error& e) {
        CHECK(false, "{}: in its body: {}", where, e.what());
      }
    }
    std::vector<Type> expect = infer_types(n.op, in_types, n.attrs, n.body.get(), where);
    CHECK(expect.size() == n.outputs.size(), "{}: has {} outputs but its op yields {}", where, n.outputs.size(),
          expect.size());
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ValueId v = n.outputs[k];
      CHECK(valid(v) && !defined[static_cast<size_t>(v)], "{}: output {} (value id {}) is defined twice", where, k, v);
      CHECK(g.type(v) == expect[k], "{}: output {} is declared {} but the op yields {}", where, k, type_str(g.type(v)),
            type_str(expect[k]));
      defined[static_cast<size_t>(v)] = true;
    }
  }
  for (size_t i = 0; i < g.results.size(); ++i) {
    ValueId r = g.results[i];
    CHECK(valid(r) && defined[static_cast<size_t>(r)], "graph @{}: result {} (value id {}) is never defined", g.name,
          i, r);
  }
}

}  // namespace remat::ir
