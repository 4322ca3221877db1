#include "autodiff/partial_eval.h"

#include "base/check.h"

#include <algorithm>

namespace remat::autodiff {

using namespace remat::ir;

Joint differentiate(const JointRequest& request) {
  Joint j;
  j.graph = request.body.clone();
  Graph& g = j.graph;
  j.num_forward = g.nodes.size();
  j.params = g.params;
  j.results = g.results;
  std::vector<std::pair<ValueId, ValueId>> seeds;
  for (size_t k = 0; k < j.results.size(); ++k) {
    const std::string& name = request.seed_names[k];
    j.seeds.push_back(name.empty() ? -1 : g.add_param(name, g.type(j.results[k])));
    if (!name.empty()) seeds.emplace_back(j.results[k], j.seeds.back());
  }
  for (size_t k = 0; k < request.accumulators.size(); ++k) {
    const std::string& name = request.accumulators[k];
    j.accumulators.push_back(name.empty() ? -1 : g.add_param(name, g.type(j.params[k])));
  }
  j.parameter_derived = parameter_derived(g, j.num_forward, request.parameter_derived);
  Context inner{request.decider, j.parameter_derived, request.trip_count,
                differentiable(g, j.num_forward, request.differentiable)};
  Builder jb(g);
  for (const Cot& c : backprop(jb, j.num_forward, seeds, j.params, inner)) j.cots.push_back(c ? c->id : -1);
  j.producer.assign(g.types.size(), -1);
  j.output_of.assign(g.types.size(), 0);
  for (size_t i = 0; i < j.num_forward; ++i)
    for (size_t k = 0; k < g.nodes[i].outputs.size(); ++k) {
      j.producer[static_cast<size_t>(g.nodes[i].outputs[k])] = static_cast<int>(i);
      j.output_of[static_cast<size_t>(g.nodes[i].outputs[k])] = k;
    }
  return j;
}

Split partial_eval(Joint& joint, std::span<const ValueId> needed, std::span<const ValueId> known,
                   const ResidualRule& rule, Walk walk) {
  Graph& g = joint.graph;
  const std::vector<bool> live = live_backward(g, joint.num_forward, {needed.begin(), needed.end()});
  std::vector<int> param_index(g.types.size(), -1);
  for (size_t p = 0; p < joint.params.size(); ++p)
    param_index[static_cast<size_t>(joint.params[p])] = static_cast<int>(p);
  // Values past the producer map (made by the caller's backward nodes) are neither params nor F outputs.
  auto forward_value = [&](size_t u) {
    return u < joint.producer.size() && (param_index[u] >= 0 || joint.producer[u] >= 0);
  };
  std::vector<bool> seen(g.types.size(), false), recompute(joint.num_forward, false);
  for (ValueId v : known) seen[static_cast<size_t>(v)] = true;
  Split split;
  // latest_first: F outputs wait here, the latest on top. A decision only adds values made earlier (its
  // producer's inputs), so they come off in latest-first order overall. Params have no producer to order
  // by and are decided when first wanted.
  std::vector<ValueId> heap;
  auto earlier = [&](ValueId a, ValueId b) {
    auto key = [&](ValueId v) {
      return std::pair(joint.producer[static_cast<size_t>(v)], joint.output_of[static_cast<size_t>(v)]);
    };
    return key(a) < key(b);
  };
  std::function<void(ValueId)> want;
  auto decide = [&](ValueId v) {
    const size_t u = static_cast<size_t>(v);
    const ResidualKind kind = rule(Candidate{v, param_index[u], joint.producer[u], joint.output_of[u]});
    split.residuals.push_back({v, kind});
    if (kind != ResidualKind::recompute && kind != ResidualKind::alias) return;
    ASSERT(joint.producer[u] >= 0);
    const size_t m = static_cast<size_t>(joint.producer[u]);
    if (kind == ResidualKind::alias) return want(g.nodes[m].inputs[0]);
    if (recompute[m]) return;
    recompute[m] = true;
    for (ValueId in : g.nodes[m].inputs) want(in);
  };
  want = [&](ValueId v) {
    const size_t u = static_cast<size_t>(v);
    if (!forward_value(u) || seen[u]) return;
    seen[u] = true;
    if (walk == Walk::first_use || joint.producer[u] < 0) return decide(v);
    heap.push_back(v);
    std::push_heap(heap.begin(), heap.end(), earlier);
  };
  for (size_t i = joint.num_forward; i < g.nodes.size(); ++i)
    if (live[i])
      for (ValueId v : g.nodes[i].inputs) want(v);
  for (ValueId v : needed) want(v);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), earlier);
    ValueId v = heap.back();
    heap.pop_back();
    decide(v);
  }
  for (size_t i = 0; i < joint.num_forward; ++i) {
    if (!recompute[i]) continue;
    Node copy = g.nodes[i];  // same value ids: the backward defines them anew
    copy.recomputed = true;
    if (copy.body) {
      copy.body = std::make_shared<Graph>(copy.body->clone());
      mark_recomputed(*copy.body);
    }
    split.backward.push_back(std::move(copy));
  }
  for (size_t i = joint.num_forward; i < g.nodes.size(); ++i)
    if (live[i]) split.backward.push_back(std::move(g.nodes[i]));
  return split;
}

std::vector<ValueId> of_kind(const Split& split, ResidualKind kind) {
  std::vector<ValueId> values;
  for (const Residual& r : split.residuals)
    if (r.kind == kind) values.push_back(r.value);
  return values;
}

std::shared_ptr<Graph> forward_body(const Joint& joint, const Split& split, const Graph& body,
                                    const std::string& scope) {
  auto forward = std::make_shared<Graph>();
  forward->name = body.name;
  forward->types = joint.graph.types;
  forward->params = joint.params;
  forward->param_names = body.param_names;
  const auto forward_end = joint.graph.nodes.begin() + static_cast<std::ptrdiff_t>(joint.num_forward);
  forward->nodes.assign(joint.graph.nodes.begin(), forward_end);
  forward->results = joint.results;
  for (ValueId v : of_kind(split, ResidualKind::save)) forward->results.push_back(v);
  for (ValueId v : of_kind(split, ResidualKind::offload)) {
    Node copy;
    copy.op = Op::offload;
    copy.inputs = {v};
    copy.outputs = {forward->new_value(joint.graph.type(v))};
    copy.scope = scope;
    copy.origin = next_origin();
    forward->nodes.push_back(copy);
    forward->results.push_back(copy.outputs[0]);
  }
  return forward;
}

std::vector<Tensor> add_outputs(Builder& b, size_t index, std::shared_ptr<Graph> forward, std::span<const Type> types) {
  Graph& g = b.graph();
  std::vector<Tensor> outputs;
  for (const Type& t : types) {
    ValueId out = g.new_value(t);
    g.nodes[index].outputs.push_back(out);
    outputs.push_back(b.wrap(out));
  }
  g.nodes[index].body = std::move(forward);
  return outputs;
}

}  // namespace remat::autodiff
