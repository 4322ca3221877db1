// VJP of scan. With body f(consts c, carries h, xs x) -> (h', y):
//  1. Differentiate the body (partial_eval.h): the joint graph J seeded with new params dh' and dy, plus
//     accumulators dc for the consts' gradients.
//  2. Partial evaluation decides the residuals, the forward values that J's backward part reads. Consts and
//     xs are passed to the reverse scan as they are; parameter-derived intermediates are recomputed in the
//     backward body; carries and other intermediates become extra stacked outputs ([length, ...]) of the
//     forward scan, whose body is replaced by J's forward part with those extra results.
//  3. A reverse scan runs J's backward part: consts = residual consts; carries = (dc, dh); xs = (residual
//     xs, stacked residuals, dy). It yields dc (summed over iterations), dh0 and the stacked dx.
// A nested scan in the body is differentiated inside step 1, so its residuals become residuals of the
// outer scan and are stacked [outer, inner, ...].
#include "autodiff/partial_eval.h"

#include "base/check.h"

#include <algorithm>

namespace remat::autodiff {

using namespace remat::ir;

namespace {

// Per-param flags of the body from the outer inputs' flags; a carry's flag is then iterated to a fixed
// point with what the body makes of it: weight-derived only if the body keeps it so (AND), differentiable
// if the body makes it so (OR).
template <class Analysis>
std::vector<bool> carry_fixed_point(const Node& n, size_t nc, size_t nh, const std::vector<bool>& outer,
                                    Analysis analysis, bool weight_derived) {
  const Graph& body = *n.body;
  std::vector<bool> flags;
  for (size_t p = 0; p < body.params.size(); ++p) flags.push_back(outer[static_cast<size_t>(n.inputs[p])]);
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<bool> d = analysis(body, body.nodes.size(), flags);
    for (size_t k = 0; k < nh; ++k) {
      bool next = weight_derived ? flags[nc + k] && d[static_cast<size_t>(body.results[k])]
                                 : flags[nc + k] || d[static_cast<size_t>(body.results[k])];
      if (next != flags[nc + k]) flags[nc + k] = next, changed = true;
    }
  }
  return flags;
}

// J for the scan node `n`: its body seeded with dh' (carries) and dy (ys), with accumulators dc (consts).
Joint joint_of(const Node& n, const ScanAttrs& scan, const Context& ctx) {
  const Graph& body = *n.body;
  const size_t nc = static_cast<size_t>(scan.num_consts), nh = static_cast<size_t>(scan.num_carry);
  auto float_value = [&](ValueId v) { return is_float(body.type(v).dtype); };
  std::vector<std::string> seed_names, accumulators;
  for (size_t k = 0; k < body.results.size(); ++k)
    seed_names.push_back(!float_value(body.results[k]) ? ""
                         : k < nh                        ? fmt::format("dh{}", k)
                                                         : fmt::format("dy{}", k - nh));
  // A const gets a gradient accumulator only if it can receive a cotangent (not a table built from iota).
  for (size_t k = 0; k < nc; ++k)
    accumulators.push_back(float_value(body.params[k]) && ctx.differentiable[static_cast<size_t>(n.inputs[k])]
                               ? fmt::format("dc{}", k)
                               : "");
  return differentiate({
      .body = body,
      .seed_names = seed_names,
      .accumulators = accumulators,
      .parameter_derived = carry_fixed_point(n, nc, nh, ctx.parameter_derived, parameter_derived, true),
      .differentiable = carry_fixed_point(
          n, nc, nh, ctx.differentiable,
          [](const Graph& g, size_t f, const std::vector<bool>& flags) { return differentiable(g, f, flags); }, false),
      .decider = ctx.decider,
      .trip_count = ctx.trip_count * scan.length,
  });
}

// The backward body's results, appended to J: the carried gradients (dc plus this iteration's, dh), then dx.
std::vector<ValueId> backward_results(Joint& joint, size_t nc, size_t nh) {
  Builder jb(joint.graph);
  auto cot_or_zero = [&](size_t p) {
    return joint.cots[p] >= 0 ? jb.wrap(joint.cots[p]) : zeros_like(jb.wrap(joint.params[p]));
  };
  std::vector<ValueId> results;
  for (size_t k = 0; k < nc; ++k)
    if (ValueId dc = joint.accumulators[k]; dc >= 0)
      results.push_back(joint.cots[k] >= 0 ? (jb.wrap(dc) + jb.wrap(joint.cots[k])).id : dc);
  for (size_t k = 0; k < nh; ++k)
    if (joint.seeds[k] >= 0) results.push_back(cot_or_zero(nc + k).id);
  for (size_t p = nc + nh; p < joint.params.size(); ++p)
    if (is_float(joint.graph.type(joint.params[p]).dtype)) results.push_back(cot_or_zero(p).id);
  return results;
}

// What the reverse scan reads, in the order of its body's params.
struct ReverseInputs {
  std::vector<size_t> consts, xs;  // body param indices read as they are
  std::vector<ValueId> stacked;    // stacked by the forward scan
};

// The reverse scan's body: J's recompute clones and live backward nodes over params (consts, dc, dh, xs,
// stacked residuals r, dy), returning `results`.
std::shared_ptr<Graph> backward_body(const Graph& body, const Joint& joint, Split& split, size_t nh,
                                     const ReverseInputs& in, std::span<const ValueId> results) {
  auto backward = std::make_shared<Graph>();
  backward->name = body.name + "_bwd";
  backward->types = joint.graph.types;
  auto add = [&](ValueId v, std::string name) {
    backward->params.push_back(v);
    backward->param_names.push_back(std::move(name));
  };
  auto add_joint_param = [&](ValueId v) {  // a seed or accumulator, under its name in J
    if (v < 0) return;
    const Graph& g = joint.graph;
    add(v, g.param_names[static_cast<size_t>(std::find(g.params.begin(), g.params.end(), v) - g.params.begin())]);
  };
  for (size_t p : in.consts) add(body.params[p], body.param_names[p]);
  for (ValueId dc : joint.accumulators) add_joint_param(dc);
  for (size_t k = 0; k < nh; ++k) add_joint_param(joint.seeds[k]);
  for (size_t p : in.xs) add(body.params[p], body.param_names[p]);
  for (size_t r = 0; r < in.stacked.size(); ++r) add(in.stacked[r], fmt::format("r{}", r));
  for (size_t k = nh; k < joint.seeds.size(); ++k) add_joint_param(joint.seeds[k]);
  backward->nodes = std::move(split.backward);
  backward->results.assign(results.begin(), results.end());
  return backward;
}

}  // namespace

std::vector<Cot> vjp_scan(Builder& b, size_t index, const Node& n, std::span<const Cot> out_cots, Context& ctx) {
  const Graph& body = *n.body;
  const ScanAttrs scan = scan_attrs(n.attrs);
  const size_t nc = static_cast<size_t>(scan.num_consts), nh = static_cast<size_t>(scan.num_carry);
  auto float_value = [&](ValueId v) { return is_float(body.type(v).dtype); };

  // 1. The joint graph.
  Joint joint = joint_of(n, scan, ctx);
  const std::vector<ValueId> results = backward_results(joint, nc, nh);

  // 2. Residuals, in order of first use by the backward part. Parameter-derived intermediates (a cast of a
  // weight slice, a broadcast of a table) are never stacked: the backward body recomputes them.
  ReverseInputs in;
  auto rule = [&](const Candidate& c) {
    const size_t p = static_cast<size_t>(c.param);
    if (c.param >= 0 && (p < nc || p >= nc + nh)) {  // read by every iteration, or its own slice
      (p < nc ? in.consts : in.xs).push_back(p);
      return ResidualKind::available;
    }
    const bool weight_derived = c.param < 0 && joint.parameter_derived[static_cast<size_t>(c.value)];
    return weight_derived ? ResidualKind::recompute : ResidualKind::save;
  };
  Split split = partial_eval(joint, results, {}, rule, Walk::first_use);

  // 3. The forward scan also emits the stacked residuals.
  in.stacked = of_kind(split, ResidualKind::save);
  std::vector<Type> stacked_types;
  for (ValueId v : in.stacked) {
    stacked_types.push_back(joint.graph.type(v));
    stacked_types.back().shape.insert(stacked_types.back().shape.begin(), scan.length);
  }
  const std::vector<Tensor> stacked = add_outputs(b, index, forward_body(joint, split, body, n.scope), stacked_types);

  // 4. The reverse scan in the outer graph.
  auto outer_in = [&](size_t p) { return b.wrap(n.inputs[p]); };
  auto seed_or_zero = [&](size_t k) { return out_cots[k] ? *out_cots[k] : zeros_like(b.wrap(n.outputs[k])); };
  std::vector<Tensor> inputs;
  for (size_t p : in.consts) inputs.push_back(outer_in(p));
  for (size_t k = 0; k < nc; ++k)
    if (joint.accumulators[k] >= 0) inputs.push_back(zeros_like(outer_in(k)));
  for (size_t k = 0; k < nh; ++k)
    if (joint.seeds[k] >= 0) inputs.push_back(seed_or_zero(k));
  const int64_t num_carry = static_cast<int64_t>(inputs.size() - in.consts.size());
  for (size_t p : in.xs) inputs.push_back(outer_in(p));
  inputs.insert(inputs.end(), stacked.begin(), stacked.end());
  for (size_t k = nh; k < joint.seeds.size(); ++k)
    if (joint.seeds[k] >= 0) inputs.push_back(seed_or_zero(k));
  Attrs attrs;
  ScanAttrs{scan.length, static_cast<int64_t>(in.consts.size()), num_carry, !scan.reverse}.write(attrs);
  std::shared_ptr<Graph> backward = backward_body(body, joint, split, nh, in, results);
  std::vector<Tensor> outs = b.emit(Op::scan, inputs, std::move(attrs), std::move(backward));

  // Gradients of the consts (summed), of the initial carries, of the xs (stacked).
  std::vector<Cot> cots(n.inputs.size());
  size_t o = 0;
  for (size_t p = 0; p < nc + nh; ++p)
    if ((p < nc ? joint.accumulators[p] : joint.seeds[p - nc]) >= 0) cots[p] = outs[o++];
  for (size_t p = nc + nh; p < body.params.size(); ++p)
    if (float_value(body.params[p])) cots[p] = outs[o++];
  ASSERT(o == outs.size());
  return cots;
}

}  // namespace remat::autodiff
