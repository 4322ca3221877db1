#include "compile/compile.h"

#include <algorithm>

namespace remat::compile {

Compiled compile(const Request& r) {
  check_pass_name(r.dump_ir_after);
  Compiled c;
  train::Program traced;
  if (r.kind == Kind::train_step || r.kind == Kind::grads) {  // differentiated: remat regions are split
    ir::Graph forward = nn::loss_graph(r.model, r.shape.batch, r.shape.seq);
    c.warnings = rematerialize::lint(forward, r.model.remat_policy, {.allow_unmatched = r.allow_unmatched});
    if (r.model.layers_per_group > 0)  // the group's policy sees the same names (its layers')
      for (std::string& w : rematerialize::lint(forward, r.model.group_remat_policy, {.allow_unmatched = r.allow_unmatched}))
        c.warnings.push_back(std::move(w));
    std::vector<rematerialize::Policy> linted{r.model.remat_policy};
    for (const rematerialize::Policy& p : r.model.stage_remat_policies) {  // each stage's layers carry the same names
      if (std::any_of(linted.begin(), linted.end(), [&](const auto& l) { return rematerialize::same_policy(l, p); })) continue;
      linted.push_back(p);
      for (std::string& w : rematerialize::lint(forward, p, {.allow_unmatched = r.allow_unmatched}))
        c.warnings.push_back(std::move(w));
    }
    rematerialize::Decider own;
    rematerialize::Decider& decider = r.decider != nullptr ? *r.decider : own;
    CHECK(r.pipeline == nullptr || r.kind == Kind::train_step, "compile: under a pipeline, gradients come with the train step");
    traced = r.pipeline ? train::pipeline_step_program(r.model, r.shape, r.optimizer, *r.pipeline, r.stage, &decider)
             : r.kind == Kind::train_step ? train::step_program(r.model, r.shape, r.optimizer, &decider)
                                          : train::grads_program(r.model, r.shape, &decider);
    c.explanation = rematerialize::explain(decider.records(), forward, traced.graph);
    if (r.pipeline) {  // this rank's forwards, every microbatch: the ops traced by its forward actions
      double f = 0;
      for (const ir::Node& n : traced.graph.nodes) {
        const train::ActionSpan* a = train::action_of(traced.actions, n.origin);
        if (!n.recomputed && a && a->action.step == parallel::Step::forward) f += ir::flops(traced.graph, n);
      }
      c.explanation.forward_flops = f;
    }
  } else {  // forward only: a remat region is a call of its body
    CHECK(r.pipeline == nullptr || r.kind == Kind::loss || r.kind == Kind::logits,
          "compile: generation with a KV cache runs without pipeline stages");
    if (r.pipeline)
      traced = train::pipeline_forward_program(r.model, r.shape.batch, r.shape.seq, r.pipeline->shape, r.stage,
                                               r.kind == Kind::logits ? train::Forward::logits : train::Forward::loss);
    else if (r.kind == Kind::prefill)
      traced = train::prefill_program(r.model, r.shape.batch, r.shape.seq, r.max_length);
    else if (r.kind == Kind::decode)
      traced = train::decode_program(r.model, r.shape.batch, r.max_length);
    else
      traced = r.kind == Kind::loss ? train::loss_program(r.model, r.shape.batch, r.shape.seq)
                                    : train::logits_program(r.model, r.shape.batch, r.shape.seq);
  }
  if (!r.plan) return c;
  std::vector<Pass> list;  // compile::passes() but those the request turns off
  for (const Pass& p : passes()) {
    const bool off = (p.run == ir::insert_finite_checks && !r.check_finite) || (p.run == ir::fuse && !r.fuse);
    if (!off) list.push_back(p);
  }
  run_passes(traced.graph, list, {.verify = r.verify_passes, .dump_after = r.dump_ir_after});
  if (r.fuse && !c.explanation.runs.empty()) c.explanation.runs = rematerialize::runs_per_step(traced.graph);  // as they run
  // The debugging form donates nothing: its checked results are views, and its arguments stay as they were.
  const std::vector<std::pair<int, int>> donate = r.check_finite ? std::vector<std::pair<int, int>>{} : traced.signature.updates();
  c.plan = plan::build(traced.graph, {.donate = donate, .workspace = exec::workspace_of(*r.backend)});
  for (const auto& [result, arg] : donate)  // the caller relies on in-place updates
    ASSERT(c.plan.donated_param[static_cast<size_t>(result)] == arg);
  c.program = std::move(traced.graph);
  c.signature = std::move(traced.signature);
  c.actions = std::move(traced.actions);
  return c;
}

}  // namespace remat::compile
