#include "autodiff/autodiff.h"
#include "autodiff/vjp.h"

#include "base/check.h"

#include <algorithm>
#include <unordered_map>

namespace remat::autodiff {

using namespace remat::ir;

void mark_recomputed(Graph& g) {
  for (Node& n : g.nodes) {
    n.recomputed = true;
    if (n.body) mark_recomputed(*n.body);
  }
}

std::vector<bool> parameter_derived(const Graph& g, size_t num_forward, const std::vector<bool>& param_flags) {
  std::vector<bool> d(g.types.size(), false);
  for (size_t i = 0; i < g.params.size() && i < param_flags.size(); ++i)
    d[static_cast<size_t>(g.params[i])] = param_flags[i];  // params past the flags (seeds) are not derived
  for (size_t i = 0; i < num_forward; ++i) {
    const Node& n = g.nodes[i];
    if (n.op == Op::convert_group) {  // output k is input k, converted
      for (size_t k = 0; k < n.outputs.size(); ++k) d[static_cast<size_t>(n.outputs[k])] = d[static_cast<size_t>(n.inputs[k])];
      continue;
    }
    // A node without inputs (full, iota) is a constant; one that is effectful (recv: a message) is not. An
    // effectful op with inputs (an FSDP all_gather of weights) is weight-derived as its inputs are.
    bool all = !(ir::is_effectful(n.op) && n.inputs.empty());
    for (ValueId v : n.inputs) all = all && d[static_cast<size_t>(v)];
    for (ValueId v : n.outputs) d[static_cast<size_t>(v)] = all;
  }
  return d;
}

std::vector<bool> differentiable(const Graph& g, size_t num_forward, std::span<const ValueId> wrt) {
  std::vector<bool> d(g.types.size(), false);
  for (ValueId v : wrt) d[static_cast<size_t>(v)] = is_float(g.type(v).dtype);
  for (size_t i = 0; i < num_forward; ++i) {
    const Node& n = g.nodes[i];
    bool any = false;
    for (ValueId v : n.inputs) any = any || d[static_cast<size_t>(v)];
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const bool from = n.op == Op::convert_group ? d[static_cast<size_t>(n.inputs[k])] : any;  // pairwise
      const size_t out = static_cast<size_t>(n.outputs[k]);
      d[out] = d[out] || (from && is_float(g.type(n.outputs[k]).dtype));  // a node's output may itself be wrt
    }
  }
  return d;
}

std::vector<bool> differentiable(const Graph& g, size_t num_forward, const std::vector<bool>& param_flags) {
  std::vector<ValueId> wrt;
  for (size_t i = 0; i < g.params.size() && i < param_flags.size(); ++i)
    if (param_flags[i]) wrt.push_back(g.params[i]);
  return differentiable(g, num_forward, std::span<const ValueId>(wrt));
}

std::vector<bool> live_backward(const Graph& g, size_t num_forward, std::vector<ValueId> needed) {
  std::vector<bool> want(g.types.size(), false), live(g.nodes.size(), false);
  for (ValueId v : needed) want[static_cast<size_t>(v)] = true;
  for (size_t i = g.nodes.size(); i-- > num_forward;) {
    const Node& n = g.nodes[i];
    for (ValueId v : n.outputs) live[i] = live[i] || want[static_cast<size_t>(v)];
    if (live[i])
      for (ValueId v : n.inputs) want[static_cast<size_t>(v)] = true;
  }
  return live;
}

std::vector<Cot> backprop(Builder& b, size_t num_forward, std::span<const std::pair<ValueId, ValueId>> seeds,
                          std::span<const ValueId> wrt, Context& ctx) {
  std::unordered_map<ValueId, Tensor> cot;
  // The sweep ends once no cotangent waits on a node output it has not reached (the rest flow to params):
  // differentiating a microbatch late in a long program visits its own nodes, not the whole program.
  const std::vector<ValueId>& params = b.graph().params;
  int64_t pending = 0;
  auto accumulate = [&](ValueId v, Tensor t) {
    auto [it, fresh] = cot.emplace(v, t);
    if (!fresh) it->second = it->second + t;
    else if (std::find(params.begin(), params.end(), v) == params.end()) ++pending;
  };
  for (const auto& [v, c] : seeds) accumulate(v, b.wrap(c));
  std::string saved_scope = b.current_scope();
  for (size_t i = num_forward; i-- > 0 && pending > 0;) {
    std::vector<Cot> out_cots;
    bool any = false;
    for (ValueId v : b.graph().nodes[i].outputs) {
      auto it = cot.find(v);
      out_cots.push_back(it == cot.end() ? Cot{} : Cot{it->second});
      any = any || it != cot.end();
    }
    if (!any) continue;
    pending -= std::count_if(out_cots.begin(), out_cots.end(), [](const Cot& c) { return c.has_value(); });
    const Node n = b.graph().nodes[i];  // a copy: rules append to the node list
    b.set_scope(n.scope);
    std::vector<Cot> in_cots = vjp_rule(n.op)(b, i, n, out_cots, ctx);
    ASSERT(in_cots.size() == n.inputs.size());
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (!in_cots[k] || !ctx.differentiable[static_cast<size_t>(n.inputs[k])]) continue;
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

std::vector<ValueId> vjp(Graph& g, std::span<const std::pair<ValueId, ValueId>> seeds, std::span<const ValueId> wrt,
                         RematDecider* decider, std::span<const ValueId> weights) {
  const size_t num_forward = g.nodes.size();
  std::vector<bool> defined(g.types.size(), false);  // params and node outputs so far
  for (ValueId v : g.params) defined[static_cast<size_t>(v)] = true;
  for (const Node& n : g.nodes)
    for (ValueId v : n.outputs) defined[static_cast<size_t>(v)] = true;
  for (ValueId v : wrt) {
    CHECK(v >= 0 && static_cast<size_t>(v) < g.types.size() && defined[static_cast<size_t>(v)],
          "vjp: value id {} is not a value of @{}", v, g.name);
    CHECK(is_float(g.type(v).dtype), "vjp: cannot differentiate with respect to non-float value of type {}",
          type_str(g.type(v)));
  }
  for (const auto& [v, c] : seeds)
    CHECK(g.type(v) == g.type(c), "vjp: the cotangent of a {} value is a {}", type_str(g.type(v)), type_str(g.type(c)));
  Builder b(g);
  Context ctx{decider, {}, 1, {}};
  std::vector<bool> flags(g.params.size(), false);
  for (ValueId v : weights)
    for (size_t i = 0; i < g.params.size(); ++i)
      if (g.params[i] == v) flags[i] = true;
  ctx.parameter_derived = parameter_derived(g, num_forward, flags);
  ctx.differentiable = differentiable(g, num_forward, wrt);
  std::vector<Cot> cots = backprop(b, num_forward, seeds, wrt, ctx);
  std::vector<ValueId> out;
  for (size_t i = 0; i < wrt.size(); ++i) out.push_back(cots[i] ? cots[i]->id : zeros_like(b.wrap(wrt[i])).id);
  return out;
}

std::vector<ValueId> grad(Graph& g, ValueId loss, std::span<const ValueId> wrt, RematDecider* decider,
                          std::span<const ValueId> weights) {
  const Type& lt = g.type(loss);
  CHECK(lt.rank() == 0 && is_float(lt.dtype), "grad: the loss must be a floating-point scalar, got {}", type_str(lt));
  for (ValueId v : wrt)
    CHECK(std::find(g.params.begin(), g.params.end(), v) != g.params.end(),
          "grad: differentiate with respect to graph params (value id {} of @{} is not one)", v, g.name);
  Builder b(g);
  // The seed is added after the forward, so vjp's backward starts past it: a constant 1 the scheduler places.
  const std::pair<ValueId, ValueId> seed{loss, full(b, lt, 1.0).id};
  std::vector<ValueId> out = vjp(g, std::span(&seed, 1), wrt, decider, weights);
  return out;
}

Graph grad_graph(const Graph& f, std::span<const int> wrt_params, RematDecider* decider,
                 std::span<const int> weight_params) {
  CHECK(!f.results.empty(), "grad_graph: graph @{} has no results to differentiate", f.name);
  Graph g = f.clone();
  std::vector<ValueId> wrt;
  for (int p : wrt_params) {
    CHECK(p >= 0 && static_cast<size_t>(p) < f.params.size(), "grad_graph: param index {} out of range (@{} has {})",
          p, f.name, f.params.size());
    wrt.push_back(g.params[static_cast<size_t>(p)]);
  }
  std::vector<ValueId> weights;
  for (int p : weight_params) weights.push_back(g.params.at(static_cast<size_t>(p)));
  std::vector<ValueId> grads = grad(g, g.results[0], wrt, decider, weights);
  g.results.insert(g.results.end(), grads.begin(), grads.end());
  dce(g);
  return g;
}

}  // namespace remat::autodiff
