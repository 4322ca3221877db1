// VJP of a remat region (jax.checkpoint), with the policy applied as JAX's partial evaluation does:
//  1. Differentiate the body as a joint graph (forward part F, backward part K), as scan does
//     (partial_eval.h). A remat region nested in the body (a group's layers, inside its scan) is split by its
//     own policy on the way: its forward returns what its policy saves, which the enclosing scan stacks, and
//     its backward recomputes the rest. So this region's policy is asked about the nested forward's results
//     (a stacked residual is judged by its producer inside, a checkpoint name included), and a recompute of
//     the nested forward reruns it with the nested policy applied: an op runs at most three times (forward,
//     this region's recompute, the nested region's recompute), JAX's nested jax.checkpoint.
//  2. Residuals are F values that K reads. Region inputs and outputs are available as they are. Each other
//     residual is saved (an extra region output), offloaded (an `offload` at the end of the body, a
//     `reload` before the backward) or recomputed, as the decider says (it must recompute the
//     parameter-derived ones); a checkpoint name on a region input is that input.
//  3. The region's body becomes F plus the saved/offloaded outputs. Into the outer graph go the reloads,
//     clones of the F nodes that recomputed residuals need (marked `recomputed`, keeping their origin),
//     then K, all with values mapped to outer ones.
// A recomputed scan node is cloned whole, with the residual outputs its own VJP gave it, so the inner
// backward reads what the recompute produced and nothing runs a third time.
#include "autodiff/partial_eval.h"
#include "ir/text.h"

#include "base/check.h"

#include <algorithm>
#include <unordered_map>

namespace remat::autodiff {

using namespace remat::ir;

namespace {

// The checkpoint name a body param carries where it is used: a `name` of it in `body`, or in the body of a
// remat region it enters (a layer names its own input, decoder_layer_input), with the graph holding that
// `name`. Nulls if none.
std::pair<const Graph*, const Node*> name_of_param(const Graph& body, ValueId param) {
  for (const Node& m : body.nodes) {
    if (m.op == Op::name && m.inputs[0] == param) return {&body, &m};
    if (m.op != Op::remat) continue;
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      if (m.inputs[i] != param) continue;
      if (auto named = name_of_param(*m.body, m.body->params[i]); named.second) return named;
    }
  }
  return {nullptr, nullptr};
}

// The op a policy judges for output `k` of `n`: for a scan's stacked output or a nested remat region's
// result, the producer inside the body (recursively), when there is one; for a scan's stacked carry or xs
// slice, the checkpoint name the body gives it, when there is one.
void resolve(const Graph*& graph, const Node*& node, size_t& output, int64_t& trips) {
  while (node->op == Op::scan || node->op == Op::remat) {
    const Graph& body = *node->body;
    const ValueId inner = body.results[output];
    const int64_t times = node->op == Op::scan ? scan_attrs(node->attrs).length : 1;
    std::pair<const Graph*, const Node*> made{nullptr, nullptr};
    size_t made_output = 0;
    for (const Node& m : body.nodes)
      for (size_t j = 0; j < m.outputs.size() && made.second == nullptr; ++j)
        if (m.outputs[j] == inner) made = {&body, &m}, made_output = j;
    if (made.second == nullptr) made = name_of_param(body, inner), made_output = 0;
    if (made.second == nullptr) return;  // a body param returned as it is, unnamed: the region is the producer
    trips *= times;
    graph = made.first;
    node = made.second;
    output = made_output;
  }
}

// The residual rule of region `n`: the decider's answer for each F value (region inputs are available).
// Records which inputs the backward reads in `input_read`.
ResidualRule policy_rule(const Node& n, const Joint& joint, const Context& ctx, std::vector<bool>& input_read) {
  return [&n, &joint, &ctx, &input_read](const Candidate& c) {
    if (c.param >= 0) {
      input_read[static_cast<size_t>(c.param)] = true;
      return ResidualKind::available;
    }
    const Graph* graph = &joint.graph;
    const Node* node = &joint.graph.nodes[static_cast<size_t>(c.producer)];
    size_t output = c.output;
    int64_t trips = ctx.trip_count;
    resolve(graph, node, output, trips);
    const Node& made_by = joint.graph.nodes[static_cast<size_t>(c.producer)];
    const bool alias = made_by.op == Op::name &&
                       std::find(joint.params.begin(), joint.params.end(), made_by.inputs[0]) != joint.params.end();
    const Residency residency = ctx.decider->decide(ResidualQuery{
        .policy = n.attrs.get("policy"),
        .graph = *graph,
        .producer = *node,
        .output = output,
        .parameter_derived = joint.parameter_derived[static_cast<size_t>(c.value)],
        .trip_count = trips,
        .region = n.origin,
        .position = c.producer,
        .alias_of_input = alias,
    });
    if (alias) return ResidualKind::alias;  // name(input) is the input itself: no region output, no recompute
    return residency == Residency::save      ? ResidualKind::save
           : residency == Residency::offload ? ResidualKind::offload
                                             : ResidualKind::recompute;
  };
}

// Emits `m` (a node of the joint graph) into the outer graph, its values mapped through `env`.
void emit_mapped(Builder& b, const Node& m, std::unordered_map<ValueId, Tensor>& env) {
  std::vector<Tensor> ins;
  for (ValueId v : m.inputs) ins.push_back(env.at(v));
  b.set_scope(m.scope);
  std::vector<Tensor> outs = b.emit(m.op, ins, m.attrs, m.body);
  Node& made = b.graph().nodes.back();
  made.recomputed = m.recomputed;
  if (m.recomputed) made.origin = m.origin;  // a recompute clone keeps the identity of the op it recomputes
  for (size_t k = 0; k < outs.size(); ++k) env.insert_or_assign(m.outputs[k], outs[k]);
}

}  // namespace

std::vector<Cot> vjp_remat(Builder& b, size_t index, const Node& n, std::span<const Cot> out_cots, Context& ctx) {
  CHECK(ctx.decider != nullptr,
        "{}: differentiating a remat region (policy {}) needs a remat decider; pass one to autodiff::grad",
        describe_node(b.graph(), index), print_attr(n.attrs.get("policy")));
  const Graph& body = *n.body;
  const size_t np = body.params.size();

  // 1. The joint graph.
  std::vector<std::string> seed_names;
  for (size_t k = 0; k < body.results.size(); ++k)
    seed_names.push_back(is_float(body.type(body.results[k]).dtype) && out_cots[k] ? fmt::format("dr{}", k) : "");
  std::vector<bool> flags, diff_flags;
  for (ValueId v : n.inputs) {
    flags.push_back(ctx.parameter_derived[static_cast<size_t>(v)]);
    diff_flags.push_back(ctx.differentiable[static_cast<size_t>(v)]);
  }
  Joint joint = differentiate({.body = body, .seed_names = seed_names, .accumulators = {}, .parameter_derived = flags,
                               .differentiable = diff_flags, .decider = ctx.decider, .trip_count = ctx.trip_count});

  // 2. Residuals and their residency, decided as JAX's partial evaluation does: a value the policy keeps is a
  // residual; a recomputed one needs its producer's inputs, which are decided in turn. So a recompute chain
  // stops at the first value the policy saves (the backward of `minimal` recomputes x + out_proj from the
  // saved out_proj, not the attention behind it). The region's outputs exist outside: nobody is asked.
  std::vector<ValueId> wanted;
  for (ValueId c : joint.cots)
    if (c >= 0) wanted.push_back(c);
  std::vector<bool> input_read(np, false);
  Split split = partial_eval(joint, wanted, joint.results, policy_rule(n, joint, ctx, input_read), Walk::latest_first);
  // A kept residual whose producer is recomputed anyway (a group's inner scan, rerun for the layer inputs its
  // policy does not keep) comes from that rerun: a kept copy would be held across the region for nothing.
  std::vector<bool> rerun(joint.num_forward, false);
  for (const Node& m : split.backward)
    if (m.recomputed && !m.outputs.empty() && static_cast<size_t>(m.outputs[0]) < joint.producer.size())
      if (const int f = joint.producer[static_cast<size_t>(m.outputs[0])]; f >= 0) rerun[static_cast<size_t>(f)] = true;
  for (Residual& r : split.residuals) {
    const int f = joint.producer[static_cast<size_t>(r.value)];
    if ((r.kind == ResidualKind::save || r.kind == ResidualKind::offload) && f >= 0 && rerun[static_cast<size_t>(f)]) {
      r.kind = ResidualKind::recompute;
      ctx.decider->rerun(n.origin, f);
    }
  }
  for (size_t p = 0; p < np; ++p)
    if (const ValueId v = joint.params[p]; input_read[p])
      ctx.decider->note_input(n.attrs.get("policy"), n.origin, static_cast<int>(p), n.body->param_names[p],
                              joint.graph.type(v), joint.parameter_derived[static_cast<size_t>(v)], ctx.trip_count);

  // 3a. The region's forward: F, returning the saved residuals and host copies of the offloaded ones.
  const std::vector<ValueId> saved = of_kind(split, ResidualKind::save);
  const std::vector<ValueId> offloaded = of_kind(split, ResidualKind::offload);
  std::vector<Type> types;
  for (ValueId v : saved) types.push_back(joint.graph.type(v));
  for (ValueId v : offloaded) types.push_back(joint.graph.type(v));
  const std::vector<Tensor> kept = add_outputs(b, index, forward_body(joint, split, *n.body, n.scope), types);
  std::unordered_map<ValueId, Tensor> env;  // joint value -> outer tensor
  for (size_t p = 0; p < np; ++p) env.emplace(joint.params[p], b.wrap(n.inputs[p]));
  for (size_t k = 0; k < saved.size(); ++k) env.emplace(saved[k], kept[k]);
  for (ValueId v : of_kind(split, ResidualKind::alias))
    env.emplace(v, env.at(joint.graph.nodes[static_cast<size_t>(joint.producer[static_cast<size_t>(v)])].inputs[0]));
  for (size_t k = 0; k < joint.results.size(); ++k) {
    env.emplace(joint.results[k], b.wrap(n.outputs[k]));
    if (joint.seeds[k] >= 0) env.emplace(joint.seeds[k], *out_cots[k]);
  }

  // 3b. The backward in the outer graph: reloads, recompute clones, then K.
  for (size_t k = 0; k < offloaded.size(); ++k) {
    b.set_scope(n.scope);
    env.emplace(offloaded[k], b.emit1(Op::reload, std::array{kept[saved.size() + k]}));
  }
  for (const Node& m : split.backward) emit_mapped(b, m, env);
  b.set_scope(n.scope);
  std::vector<Cot> in_cots(n.inputs.size());
  for (size_t p = 0; p < np; ++p)
    if (joint.cots[p] >= 0) in_cots[p] = env.at(joint.cots[p]);
  return in_cots;
}

}  // namespace remat::autodiff
