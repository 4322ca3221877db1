#include "autodiff/autodiff.h"
#include "autodiff/vjp.h"

#include "base/check.h"

#include <unordered_map>

namespace remat::autodiff {

using namespace remat::ir;

std::vector<Cot> backprop(Builder& b, size_t num_forward, std::span<const std::pair<ValueId, ValueId>> seeds,
                          std::span<const ValueId> wrt) {
  std::unordered_map<ValueId, Tensor> cot;
  auto accumulate = [&](ValueId v, Tensor t) {
    auto [it, fresh] = cot.emplace(v, t);
    if (!fresh) it->second = it->second + t;
  };
  for (const auto& [v, c] : seeds) accumulate(v, b.wrap(c));
  std::string saved_scope = b.current_scope();
  for (size_t i = num_forward; i-- > 0;) {
    Node n = b.graph().nodes[i];  // a copy: rules append to the node list
    std::vector<Cot> out_cots;
    bool any = false;
    for (ValueId v : n.outputs) {
      auto it = cot.find(v);
      out_cots.push_back(it == cot.end() ? Cot{} : Cot{it->second});
      any = any || it != cot.end();
    }
    if (!any) continue;
    b.set_scope(n.scope);
    std::vector<Cot> in_cots = vjp_rule(n.op)(b, i, n, out_cots);
    ASSERT(in_cots.size() == n.inputs.size());
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (!in_cots[k] || !is_float(b.graph().type(n.inputs[k]).dtype)) continue;
      ASSERT(in_cots[k]->type() == b.graph().type(n.inputs[k]));
      accumulate(n.inputs[k], *in_cots[k]);
    }
  }
  b.set_scope(saved_scope);
  std::vector<Cot> result;
  for (ValueId v : wrt) {
    auto it = cot.find(v);
    result.push_back(it == cot.end() ? Cot{} : Cot{it->second});
  }
  return result;
}

std::vector<ValueId> grad(Graph& g, ValueId loss, std::span<const ValueId> wrt) {
  const Type& lt = g.type(loss);
  CHECK(lt.rank() == 0 && is_float(lt.dtype), "grad: the loss must be a floating-point scalar, got {}", type_str(lt));
  for (ValueId v : wrt)
    CHECK(is_float(g.type(v).dtype), "grad: cannot differentiate with respect to non-float value of type {}",
          type_str(g.type(v)));
  size_t num_forward = g.nodes.size();
  Builder b(g);
  Tensor one = full(b, lt, 1.0);
  std::pair<ValueId, ValueId> seed{loss, one.id};
  std::vector<Cot> cots = backprop(b, num_forward, std::span(&seed, 1), wrt);
  std::vector<ValueId> out;
  for (size_t i = 0; i < wrt.size(); ++i) out.push_back(cots[i] ? cots[i]->id : zeros_like(b.wrap(wrt[i])).id);
  return out;
}

Graph grad_graph(const Graph& f, std::span<const int> wrt_params) {
  CHECK(!f.results.empty(), "grad_graph: graph @{} has no results to differentiate", f.name);
  Graph g = f.clone();
  std::vector<ValueId> wrt;
  for (int p : wrt_params) {
    CHECK(p >= 0 && static_cast<size_t>(p) < f.params.size(), "grad_graph: param index {} out of range (@{} has {})",
          p, f.name, f.params.size());
    wrt.push_back(g.params[static_cast<size_t>(p)]);
  }
  std::vector<ValueId> grads = grad(g, g.results[0], wrt);
  g.results.insert(g.results.end(), grads.begin(), grads.end());
  dce(g);
  return g;
}

}  // namespace remat::autodiff
