#include "compile/compile.h"

namespace remat::compile {

int64_t Compiled::total_bytes() const { return plan::argument_bytes(program) + plan.arena[0] + plan.arena[1]; }

Compiled compile(const Request& r) {
  Compiled c;
  const nn::names::Vocabulary names = nn::vocabulary(r.model);
  ir::Graph forward = nn::loss_graph(r.model, r.shape.batch, r.shape.seq);
  c.warnings = rematerialize::lint(forward, {.allow_unmatched = r.allow_unmatched, .names = names});
  rematerialize::Decider own(names);
  rematerialize::Decider& decider = r.decider != nullptr ? *r.decider : own;
  train::Program traced;
  switch (r.program) {
    case Program::train_step: traced = train::step_program(r.model, r.shape, r.optimizer, &decider); break;
    case Program::grads: traced = train::grads_program(r.model, r.shape, &decider); break;
    case Program::loss: traced = train::loss_program(r.model, r.shape.batch, r.shape.seq); break;
    case Program::logits: traced = train::logits_program(r.model, r.shape.batch, r.shape.seq); break;
  }
  c.explanation = rematerialize::explain(decider.records(), forward, traced.graph);
  ir::inline_remat_regions(traced.graph);
  c.plan = plan::build(traced.graph, {.donate = traced.signature.updates(), .workspace = exec::workspace_of(*r.backend)});
  for (const auto& [result, arg] : traced.signature.updates())  // the caller relies on in-place updates
    ASSERT(c.plan.donated_param[static_cast<size_t>(result)] == arg);
  c.program = std::move(traced.graph);
  c.signature = std::move(traced.signature);
  return c;
}

}  // namespace remat::compile
