// The prefill and decode programs of generation (step.h): nn's graphs with their typed signatures.
#include "train/step.h"

#include "ir/ir.h"

namespace remat::train {
namespace {

Program with_signature(ir::Graph g, const nn::ModelConfig& model, std::string_view prefix) {
  ir::dce(g);  // the training tables' causal mask, unread
  ir::Signature sig;
  for (const nn::ParamSpec& p : nn::param_specs(model)) sig.args.push_back({p.path, ir::Role::parameter});
  for (size_t i = sig.args.size(); i < g.param_names.size(); ++i) sig.args.push_back({g.param_names[i], ir::Role::batch});
  for (size_t i = 0; i < sig.args.size(); ++i) ASSERT(sig.args[i].name == g.param_names[i]);
  for (const char* name : {"logits", "cache/key", "cache/value"})
    sig.results.push_back({name == std::string_view("logits") ? name : std::string(prefix) + name, ir::Role::output});
  ASSERT(sig.results.size() == g.results.size());
  return {std::move(g), std::move(sig), {}};
}

}  // namespace

Program prefill_program(const nn::ModelConfig& model, int64_t batch, int64_t prompt, int64_t max_length) {
  return with_signature(nn::prefill_graph(model, batch, prompt, max_length), model, "");
}

Program decode_program(const nn::ModelConfig& model, int64_t batch, int64_t max_length) {
  return with_signature(nn::decode_graph(model, batch, max_length), model, "new_");
}

}  // namespace remat::train
