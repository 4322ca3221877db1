// VJP of scan. With body f(consts c, carries h, xs x) -> (h', y):
//  1. Differentiate a copy of the body ("joint" graph J): forward nodes, then their VJP seeded with new
//     params dh' and dy, plus accumulators dc for the consts' gradients.
//  2. Residuals are forward values that J's backward part reads. Consts and xs are passed to the reverse
//     scan as they are; parameter-derived intermediates are recomputed in the backward body; carries and
//     other intermediates become extra stacked outputs ([length, ...]) of the forward scan, whose body is
//     replaced by J's forward part with those extra results.
//  3. A reverse scan runs J's backward part: consts = residual consts; carries = (dc, dh); xs = (residual
//     xs, stacked residuals, dy). It yields dc (summed over iterations), dh0 and the stacked dx.
// A nested scan in the body is differentiated inside step 1, so its residuals become residuals of the
// outer scan and are stacked [outer, inner, ...].
#include "autodiff/vjp.h"

#include "base/check.h"

#include <functional>

namespace remat::autodiff {

using namespace remat::ir;

std::vector<Cot> vjp_scan(Builder& b, size_t index, const Node& n, std::span<const Cot> out_cots, Context& ctx) {
  const Graph& body = *n.body;
  const int64_t length = n.attrs.integer("length");
  const size_t nc = static_cast<size_t>(n.attrs.integer("num_consts"));
  const size_t nh = static_cast<size_t>(n.attrs.integer("num_carry"));
  const size_t np = body.params.size();
  const size_t ny = body.results.size() - nh;

  // 1. The joint graph.
  Graph joint = body.clone();
  const size_t num_forward = joint.nodes.size();
  Builder jb(joint);
  std::vector<std::pair<ValueId, ValueId>> seeds;
  std::vector<ValueId> dh(nh, -1), dy(ny, -1), dc(nc, -1);
  for (size_t k = 0; k < nh + ny; ++k) {
    const Type& t = body.type(body.results[k]);
    if (!is_float(t.dtype)) continue;
    ValueId p = joint.add_param(k < nh ? fmt::format("dh{}", k) : fmt::format("dy{}", k - nh), t);
    (k < nh ? dh[k] : dy[k - nh]) = p;
    seeds.emplace_back(body.results[k], p);
  }
  for (size_t k = 0; k < nc; ++k)
    if (is_float(body.type(body.params[k]).dtype)) dc[k] = joint.add_param(fmt::format("dc{}", k), body.type(body.params[k]));
  // Per-param flags of the body from the outer inputs' flags; a carry's flag is then iterated to a fixed
  // point with what the body makes of it: weight-derived only if the body keeps it so (AND), differentiable
  // if the body makes it so (OR).
  auto carry_fixed_point = [&](const std::vector<bool>& outer, auto analysis, bool weight_derived) {
    std::vector<bool> flags;
    for (size_t p = 0; p < np; ++p) flags.push_back(outer[static_cast<size_t>(n.inputs[p])]);
    for (bool changed = true; changed;) {
      changed = false;
      std::vector<bool> d = analysis(joint, num_forward, flags);
      for (size_t k = 0; k < nh; ++k) {
        bool next = weight_derived ? flags[nc + k] && d[static_cast<size_t>(body.results[k])]
                                   : flags[nc + k] || d[static_cast<size_t>(body.results[k])];
        if (next != flags[nc + k]) flags[nc + k] = next, changed = true;
      }
    }
    return flags;
  };
  const std::vector<bool> flags = carry_fixed_point(ctx.parameter_derived, parameter_derived, true);
  const std::vector<bool> diff_flags = carry_fixed_point(ctx.differentiable, [](const ir::Graph& g, size_t n, const std::vector<bool>& f) { return differentiable(g, n, f); }, false);
  Context inner{ctx.decider, parameter_derived(joint, num_forward, flags), ctx.trip_count * length,
                differentiable(joint, num_forward, diff_flags)};
  std::vector<Cot> cots = backprop(jb, num_forward, seeds, body.params, inner);
  auto cot_or_zero = [&](size_t p) { return cots[p] ? *cots[p] : zeros_like(jb.wrap(body.params[p])); };
  std::vector<ValueId> carry_out, ys_out;
  for (size_t k = 0; k < nc; ++k)
    if (dc[k] >= 0) carry_out.push_back(cots[k] ? (jb.wrap(dc[k]) + *cots[k]).id : dc[k]);
  for (size_t k = 0; k < nh; ++k)
    if (dh[k] >= 0) carry_out.push_back(cot_or_zero(nc + k).id);
  for (size_t p = nc + nh; p < np; ++p)
    if (is_float(body.type(body.params[p]).dtype)) ys_out.push_back(cot_or_zero(p).id);

  // 2. Residuals, in order of first use by the backward part.
  std::vector<int> param_index(joint.types.size(), -1);
  std::vector<bool> forward_value(joint.types.size(), false);
  for (size_t p = 0; p < np; ++p) {
    param_index[static_cast<size_t>(body.params[p])] = static_cast<int>(p);
    forward_value[static_cast<size_t>(body.params[p])] = true;
  }
  for (size_t i = 0; i < num_forward; ++i)
    for (ValueId v : joint.nodes[i].outputs) forward_value[static_cast<size_t>(v)] = true;
  // Parameter-derived intermediates (a cast of a weight slice, a broadcast of a table) are never stacked:
  // the backward body recomputes them from the consts and xs they come from.
  const std::vector<bool> derived = parameter_derived(joint, num_forward, flags);
  std::vector<int> producer(joint.types.size(), -1);
  for (size_t i = 0; i < num_forward; ++i)
    for (ValueId v : joint.nodes[i].outputs) producer[static_cast<size_t>(v)] = static_cast<int>(i);
  std::vector<bool> seen(joint.types.size(), false), recompute(num_forward, false);
  std::vector<size_t> const_res, xs_res;  // body param indices
  std::vector<ValueId> stacked_res;       // carries and intermediates, stacked by the forward scan
  std::function<void(ValueId)> note = [&](ValueId v) {
    if (!forward_value[static_cast<size_t>(v)] || seen[static_cast<size_t>(v)]) return;
    seen[static_cast<size_t>(v)] = true;
    int p = param_index[static_cast<size_t>(v)];
    int made_by = producer[static_cast<size_t>(v)];
    if (p >= 0 && static_cast<size_t>(p) < nc) {
      const_res.push_back(static_cast<size_t>(p));
    } else if (p >= 0 && static_cast<size_t>(p) >= nc + nh) {
      xs_res.push_back(static_cast<size_t>(p));
    } else if (made_by >= 0 && derived[static_cast<size_t>(v)]) {
      recompute[static_cast<size_t>(made_by)] = true;
      for (ValueId in : joint.nodes[static_cast<size_t>(made_by)].inputs) note(in);
    } else {
      stacked_res.push_back(v);
    }
  };
  std::vector<ValueId> needed = carry_out;
  needed.insert(needed.end(), ys_out.begin(), ys_out.end());
  const std::vector<bool> live = live_backward(joint, num_forward, needed);
  for (size_t i = num_forward; i < joint.nodes.size(); ++i)
    if (live[i])
      for (ValueId v : joint.nodes[i].inputs) note(v);
  for (ValueId v : carry_out) note(v);
  for (ValueId v : ys_out) note(v);

  // 3. The forward scan also emits the stacked residuals.
  auto forward = std::make_shared<Graph>();
  forward->name = body.name;
  forward->types = joint.types;
  forward->params = body.params;
  forward->param_names = body.param_names;
  forward->nodes.assign(joint.nodes.begin(), joint.nodes.begin() + static_cast<std::ptrdiff_t>(num_forward));
  forward->results = body.results;
  forward->results.insert(forward->results.end(), stacked_res.begin(), stacked_res.end());
  std::vector<Tensor> stacked_outer;
  {
    Graph& g = b.graph();
    for (ValueId v : stacked_res) {
      Type t = joint.type(v);
      t.shape.insert(t.shape.begin(), length);
      ValueId outer = g.new_value(t);
      g.nodes[index].outputs.push_back(outer);
      stacked_outer.push_back(b.wrap(outer));
    }
    g.nodes[index].body = forward;
  }

  // 4. The backward body.
  auto backward = std::make_shared<Graph>();
  backward->name = body.name + "_bwd";
  backward->types = joint.types;
  auto add = [&](ValueId v, std::string name) {
    backward->params.push_back(v);
    backward->param_names.push_back(std::move(name));
  };
  for (size_t p : const_res) add(body.params[p], body.param_names[p]);
  for (size_t k = 0; k < nc; ++k)
    if (dc[k] >= 0) add(dc[k], fmt::format("dc{}", k));
  for (size_t k = 0; k < nh; ++k)
    if (dh[k] >= 0) add(dh[k], fmt::format("dh{}", k));
  for (size_t p : xs_res) add(body.params[p], body.param_names[p]);
  for (size_t r = 0; r < stacked_res.size(); ++r) add(stacked_res[r], fmt::format("r{}", r));
  for (size_t k = 0; k < ny; ++k)
    if (dy[k] >= 0) add(dy[k], fmt::format("dy{}", k));
  for (size_t i = 0; i < num_forward; ++i) {
    if (!recompute[i]) continue;
    Node copy = joint.nodes[i];  // same value ids: the backward body defines them anew
    copy.recomputed = true;
    if (copy.body) {
      copy.body = std::make_shared<Graph>(copy.body->clone());
      mark_recomputed(*copy.body);
    }
    backward->nodes.push_back(std::move(copy));
  }
  for (size_t i = num_forward; i < joint.nodes.size(); ++i)
    if (live[i]) backward->nodes.push_back(std::move(joint.nodes[i]));
  backward->results = carry_out;
  backward->results.insert(backward->results.end(), ys_out.begin(), ys_out.end());

  // 5. The reverse scan in the outer graph.
  auto outer_in = [&](size_t p) { return b.wrap(n.inputs[p]); };
  auto seed_or_zero = [&](size_t k) {
    return out_cots[k] ? *out_cots[k] : zeros_like(b.wrap(n.outputs[k]));
  };
  std::vector<Tensor> inputs;
  for (size_t p : const_res) inputs.push_back(outer_in(p));
  int64_t num_carry = 0;
  for (size_t k = 0; k < nc; ++k)
    if (dc[k] >= 0) inputs.push_back(zeros_like(outer_in(k))), ++num_carry;
  for (size_t k = 0; k < nh; ++k)
    if (dh[k] >= 0) inputs.push_back(seed_or_zero(k)), ++num_carry;
  for (size_t p : xs_res) inputs.push_back(outer_in(p));
  inputs.insert(inputs.end(), stacked_outer.begin(), stacked_outer.end());
  for (size_t k = 0; k < ny; ++k)
    if (dy[k] >= 0) inputs.push_back(seed_or_zero(nh + k));
  Attrs attrs;
  attrs.set("length", length)
      .set("num_consts", static_cast<int64_t>(const_res.size()))
      .set("num_carry", num_carry)
      .set("reverse", !n.attrs.boolean("reverse"));
  std::vector<Tensor> outs = b.emit(Op::scan, inputs, std::move(attrs), backward);

  std::vector<Cot> result(n.inputs.size());
  size_t o = 0;
  for (size_t k = 0; k < nc; ++k)
    if (dc[k] >= 0) result[k] = outs[o++];
  for (size_t k = 0; k < nh; ++k)
    if (dh[k] >= 0) result[nc + k] = outs[o++];
  for (size_t p = nc + nh; p < np; ++p)
    if (is_float(body.type(body.params[p]).dtype)) result[p] = outs[o++];
  ASSERT(o == outs.size());
  return result;
}

}  // namespace remat::autodiff
