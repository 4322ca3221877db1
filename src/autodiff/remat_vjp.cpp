// VJP of a remat region (jax.checkpoint), with the policy applied as JAX's partial evaluation does:
//  1. Inline the remat regions nested in the body (here and inside its scans): the outermost policy
//     decides every residual.
//  2. Differentiate the flattened body as a joint graph (forward part F, backward part K), as scan does.
//  3. Residuals are F values that K reads. Region inputs and outputs are available as they are. Each other
//     residual is saved (an extra region output), offloaded (an `offload` at the end of the body, a
//     `reload` before the backward) or recomputed, as the decider says (it must recompute the
//     parameter-derived ones).
//  4. The region's body becomes F plus the saved/offloaded outputs. Into the outer graph go the reloads,
//     clones of the F nodes that recomputed residuals need (marked `recomputed`, keeping their origin),
//     then K, all with values mapped to outer ones.
// A recomputed scan node is cloned whole, with the residual outputs its own VJP gave it, so the inner
// backward reads what the recompute produced and nothing runs a third time.
#include "autodiff/vjp.h"

#include "base/check.h"

#include <algorithm>
#include <unordered_map>

namespace remat::autodiff {

using namespace remat::ir;

namespace {

// The op a policy judges for output `k` of `n`: for a scan's stacked output, the producer inside the
// body (recursively), when there is one.
void resolve(const Graph*& graph, const Node*& node, size_t& output, int64_t& trips) {
  while (node->op == Op::scan) {
    const Graph& body = *node->body;
    ValueId inner = body.results[output];
    bool found = false;
    for (const Node& m : body.nodes) {
      for (size_t j = 0; j < m.outputs.size() && !found; ++j) {
        if (m.outputs[j] == inner) {
          trips *= node->attrs.integer("length");
          graph = &body;
          node = &m;
          output = j;
          found = true;
        }
      }
      if (found) break;
    }
    if (!found) return;  // a body param stacked as it is: the scan itself is the producer
  }
}

}  // namespace

std::vector<Cot> vjp_remat(Builder& b, size_t index, const Node& n, std::span<const Cot> out_cots, Context& ctx) {
  const std::string& policy = n.attrs.str("policy");
  CHECK(ctx.decider != nullptr,
        "{}: differentiating a remat region (policy '{}') needs a remat decider; pass one to autodiff::grad",
        describe_node(b.graph(), index), policy);
  Graph body = n.body->clone();
  ir::inline_remat_regions(body);
  const size_t np = body.params.size();

  // 2. The joint graph.
  Graph joint = std::move(body);
  const size_t num_forward = joint.nodes.size();
  const std::vector<ValueId> params = joint.params, results = joint.results;
  Builder jb(joint);
  std::vector<std::pair<ValueId, ValueId>> seeds;
  std::vector<ValueId> seed_param(results.size(), -1);
  for (size_t k = 0; k < results.size(); ++k) {
    if (!is_float(joint.type(results[k]).dtype) || !out_cots[k]) continue;
    seed_param[k] = joint.add_param(fmt::format("dr{}", k), joint.type(results[k]));
    seeds.emplace_back(results[k], seed_param[k]);
  }
  std::vector<bool> flags;
  for (size_t p = 0; p < np; ++p) flags.push_back(ctx.parameter_derived[static_cast<size_t>(n.inputs[p])]);
  std::vector<bool> diff_flags;
  for (size_t p = 0; p < np; ++p) diff_flags.push_back(ctx.differentiable[static_cast<size_t>(n.inputs[p])]);
  Context inner{ctx.decider, parameter_derived(joint, num_forward, flags), ctx.trip_count,
                differentiable(joint, num_forward, diff_flags)};
  std::vector<Cot> cots = backprop(jb, num_forward, seeds, params, inner);
  std::vector<ValueId> wanted;
  for (const Cot& c : cots)
    if (c) wanted.push_back(c->id);
  const std::vector<bool> live = live_backward(joint, num_forward, wanted);

  // 3. Residuals and their residency.
  std::vector<int> producer_of(joint.types.size(), -1);  // F node index
  std::vector<size_t> output_of(joint.types.size(), 0);
  for (size_t i = 0; i < num_forward; ++i)
    for (size_t k = 0; k < joint.nodes[i].outputs.size(); ++k) {
      producer_of[static_cast<size_t>(joint.nodes[i].outputs[k])] = static_cast<int>(i);
      output_of[static_cast<size_t>(joint.nodes[i].outputs[k])] = k;
    }
  const std::vector<bool> derived = parameter_derived(joint, num_forward, flags);
  std::vector<Residency> residency(joint.types.size(), Residency::save);
  std::vector<bool> is_residual(joint.types.size(), false);
  for (ValueId r : results) is_residual[static_cast<size_t>(r)] = true;  // region outputs exist outside anyway
  std::vector<ValueId> saved, offloaded, recomputed;  // in the order decided
  std::vector<ValueId> aliases;                      // checkpoint names on region inputs
  std::vector<ValueId> residuals;  // F values the backward reads, in first-use order
  auto note = [&](ValueId v) {
    size_t u = static_cast<size_t>(v);
    if (is_residual[u]) return;  // an output, or seen
    is_residual[u] = true;
    residuals.push_back(v);
  };
  for (size_t i = num_forward; i < joint.nodes.size(); ++i)
    if (live[i])
      for (ValueId v : joint.nodes[i].inputs) note(v);
  for (const Cot& c : cots)
    if (c) note(c->id);
  // Decide, as JAX's partial evaluation does, every value the backward needs: a value the policy keeps is a
  // residual; a recomputed one needs its producer's inputs, which are decided in turn. So a recompute
  // chain stops at the first value the policy saves (the backward of `minimal` recomputes x + out_proj from
  // the saved out_proj, not the attention behind it). Values are decided latest first, so that every
  // consumer of a value is decided before the value itself.
  std::vector<bool> available(joint.types.size(), false);  // without recomputing: inputs, outputs, kept residuals
  for (ValueId p : params) available[static_cast<size_t>(p)] = true;
  for (ValueId r : results) available[static_cast<size_t>(r)] = true;
  std::vector<bool> needed(num_forward, false), input_read(np, false), queued(joint.types.size(), false);
  auto earlier = [&](ValueId a, ValueId b) {  // heap order: the latest value on top
    auto key = [&](ValueId v) { return std::pair(producer_of[static_cast<size_t>(v)], output_of[static_cast<size_t>(v)]); };
    return key(a) < key(b);
  };
  std::vector<ValueId> heap;
  auto want = [&](ValueId v) {
    size_t u = static_cast<size_t>(v);
    auto p = std::find(params.begin(), params.end(), v);
    if (p != params.end()) input_read[static_cast<size_t>(p - params.begin())] = true;
    if (available[u] || queued[u] || producer_of[u] < 0) return;
    queued[u] = true;
    heap.push_back(v);
    std::push_heap(heap.begin(), heap.end(), earlier);
  };
  for (ValueId v : residuals) want(v);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), earlier);
    ValueId v = heap.back();
    heap.pop_back();
    size_t u = static_cast<size_t>(v);
    const Graph* graph = &joint;
    const Node* node = &joint.nodes[static_cast<size_t>(producer_of[u])];
    size_t output = output_of[u];
    int64_t trips = ctx.trip_count;
    resolve(graph, node, output, trips);
    const Node& made_by = joint.nodes[static_cast<size_t>(producer_of[u])];
    const bool alias = made_by.op == Op::name &&
                       std::find(params.begin(), params.end(), made_by.inputs[0]) != params.end();
    residency[u] = ctx.decider->decide(
        ResidualQuery{policy, *graph, *node, output, derived[u], trips, n.origin, producer_of[u], alias});
    if (alias) {  // name(input) is the input itself: no region output, no recompute
      aliases.push_back(v);
      want(made_by.inputs[0]);
      continue;
    }
    (residency[u] == Residency::save ? saved : residency[u] == Residency::offload ? offloaded : recomputed).push_back(v);
    if (residency[u] != Residency::recompute) continue;
    size_t m = static_cast<size_t>(producer_of[u]);
    if (needed[m]) continue;
    needed[m] = true;
    for (ValueId in : joint.nodes[m].inputs) want(in);
  }
  for (size_t p = 0; p < np; ++p)
    if (input_read[p])
      ctx.decider->note_input(policy, n.origin, static_cast<int>(p), n.body->param_names[p], joint.type(params[p]),
                              derived[static_cast<size_t>(params[p])], ctx.trip_count);

  // 4a. The region's forward: F, returning the saved residuals and host copies of the offloaded ones.
  auto forward = std::make_shared<Graph>();
  forward->name = n.body->name;
  forward->types = joint.types;
  forward->params = params;
  forward->param_names = n.body->param_names;
  forward->nodes.assign(joint.nodes.begin(), joint.nodes.begin() + static_cast<std::ptrdiff_t>(num_forward));
  forward->results = results;
  for (ValueId v : saved) forward->results.push_back(v);
  for (ValueId v : offloaded) {
    Node copy;
    copy.op = Op::offload;
    copy.inputs = {v};
    copy.outputs = {forward->new_value(joint.type(v))};
    copy.scope = n.scope;
    copy.origin = next_origin();
    forward->nodes.push_back(copy);
    forward->results.push_back(copy.outputs[0]);
  }
  std::unordered_map<ValueId, Tensor> env;  // joint value -> outer tensor
  for (size_t p = 0; p < np; ++p) env.emplace(params[p], b.wrap(n.inputs[p]));
  std::vector<Tensor> host;
  {
    Graph& g = b.graph();
    for (size_t k = 0; k < saved.size() + offloaded.size(); ++k) {
      ValueId out = g.new_value(joint.type(k < saved.size() ? saved[k] : offloaded[k - saved.size()]));
      g.nodes[index].outputs.push_back(out);
      if (k < saved.size()) env.emplace(saved[k], b.wrap(out));
      else host.push_back(b.wrap(out));
    }
    g.nodes[index].body = forward;
  }
  for (ValueId v : aliases) {
    const Node& m = joint.nodes[static_cast<size_t>(producer_of[static_cast<size_t>(v)])];
    env.emplace(v, env.at(m.inputs[0]));
  }
  for (size_t k = 0; k < results.size(); ++k) {
    env.emplace(results[k], b.wrap(n.outputs[k]));
    if (seed_param[k] >= 0) env.emplace(seed_param[k], *out_cots[k]);
  }

  // 4b. The backward in the outer graph: reloads, recompute clones, then K.
  auto emit_clone = [&](const Node& m, bool recompute) {
    std::vector<Tensor> ins;
    for (ValueId v : m.inputs) ins.push_back(env.at(v));
    b.set_scope(m.scope);
    std::shared_ptr<Graph> body = m.body ? std::make_shared<Graph>(m.body->clone()) : nullptr;
    if (body && recompute) mark_recomputed(*body);
    std::vector<Tensor> outs = b.emit(m.op, ins, m.attrs, body);
    Node& made = b.graph().nodes.back();
    made.recomputed = recompute;
    if (recompute) made.origin = m.origin;
    for (size_t k = 0; k < outs.size(); ++k) env.insert_or_assign(m.outputs[k], outs[k]);
  };
  for (size_t k = 0; k < offloaded.size(); ++k) {
    b.set_scope(n.scope);
    env.emplace(offloaded[k], b.emit1(Op::reload, std::array{host[k]}));
  }
  for (size_t i = 0; i < num_forward; ++i)
    if (needed[i]) emit_clone(joint.nodes[i], true);
  for (size_t i = num_forward; i < joint.nodes.size(); ++i)
    if (live[i]) emit_clone(joint.nodes[i], false);
  b.set_scope(n.scope);

  std::vector<Cot> in_cots(n.inputs.size());
  for (size_t p = 0; p < np; ++p)
    if (cots[p]) in_cots[p] = env.at(cots[p]->id);
  return in_cots;
}

}  // namespace remat::autodiff
