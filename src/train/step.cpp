#include "train/step.h"

#include "autodiff/autodiff.h"
#include "train/grad_norm.h"
#include "train/step_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <cmath>
#include <optional>
#include <numbers>
#include <numeric>

namespace remat::train {

using namespace ir;

namespace {

// Gradients of `loss` (times `scale`, when loss scaling: the gradients are then scaled too).
LossAndGrads trace_microbatch(Builder& b, const nn::ModelConfig& model, std::span<const Tensor> params, Tensor inputs,
                              Tensor targets, rematerialize::Decider& decider, std::optional<Tensor> scale) {
  Tensor loss = nn::trace_loss(b, model, params, inputs, targets);
  Tensor differentiated = scale ? loss * *scale : loss;
  std::vector<ValueId> wrt;
  for (Tensor p : params) wrt.push_back(p.id);
  LossAndGrads r{loss, {}, loss};
  for (ValueId g : autodiff::grad(b.graph(), differentiated.id, wrt, &decider, wrt)) r.grads.push_back(b.wrap(g));
  return r;
}

}  // namespace

// The means of loss and gradient sums over k microbatches on each rank of the model's mesh (every rank takes
// its own part of the batch). The loss sums are all-reduced over the mesh (in rank order from zero); so are
// the gradients of whole parameters, while FSDP shards' gradients arrive summed over every rank already (the
// transpose of each parameter's all_gather is a reduce_scatter over the whole mesh).
LossAndGrads mean_over(Builder& b, const nn::ModelConfig& model, const std::vector<nn::ParamSpec>& specs, LossAndGrads sums,
                       int64_t k) {
  const nn::Mesh& mesh = model.mesh;
  const int64_t ranks = mesh.batch_ranks();
  if (ranks > 1) {
    auto s = b.scope("data_parallel");
    sums.loss = all_reduce(sums.loss, mesh.batch_group(), ranks);
    for (size_t i = 0; i < sums.grads.size(); ++i)  // whole parameters: summed here; shards: already
      if (specs[i].shards == 1) sums.grads[i] = all_reduce(sums.grads[i], mesh.batch_group(), ranks);
  }
  if (k * ranks == 1) return sums;
  const double inv = 1.0 / static_cast<double>(k * ranks);
  sums.loss = sums.loss * inv;
  for (Tensor& g : sums.grads) g = g * inv;
  return sums;
}

namespace {

// Mean loss and gradients over the k microbatches of inputs/targets [k,B,T] of each rank of the model's mesh.
// The ranks' sums are all-reduced as ((0 + x_0) + x_1) + ..., the sum one process accumulating microbatch r
// of rank r in order forms: ranks each taking one microbatch train bit-identically to it.
LossAndGrads trace_accumulated(Builder& b, const nn::ModelConfig& model, std::span<const Tensor> params,
                               Tensor inputs, Tensor targets, rematerialize::Decider& decider,
                               std::optional<Tensor> scale = std::nullopt) {
  const int64_t k = inputs.dim(0);
  const Shape mb = {inputs.dim(1), inputs.dim(2)};
  if (k == 1)
    return mean_over(b, model, nn::param_specs(model),
                     trace_microbatch(b, model, params, reshape(inputs, mb), reshape(targets, mb), decider, scale), 1);
  std::vector<Tensor> consts(params.begin(), params.end());
  if (scale) consts.push_back(*scale);
  auto body = [&](Builder& bb, std::span<const Tensor> c, std::span<const Tensor> sums, std::span<const Tensor> xs) {
    std::span<const Tensor> ps = c.subspan(0, params.size());
    std::optional<Tensor> s = scale ? std::optional<Tensor>(c.back()) : std::nullopt;
    LossAndGrads r = trace_microbatch(bb, model, ps, xs[0], xs[1], decider, s);
    std::vector<Tensor> next{sums[0] + r.loss};
    for (size_t i = 0; i < r.grads.size(); ++i) next.push_back(sums[1 + i] + r.grads[i]);
    return next;
  };
  std::vector<Tensor> init{scalar(b, DType::f32, 0.0)};
  for (Tensor p : params) init.push_back(zeros_like(p));
  auto s = b.scope("accumulate");
  std::vector<Tensor> sums = scan(b, k, consts, init, std::array{inputs, targets}, body, "microbatch");
  return mean_over(b, model, nn::param_specs(model), {sums[0], {sums.begin() + 1, sums.end()}, sums[0]}, k);
}

}  // namespace

StepInputs declare(Builder& b, ir::Signature& sig, const std::vector<Declared>& params, const StepShape& shape,
                   const Arguments& with) {
  CHECK(shape.batch > 0 && shape.seq > 0 && shape.accumulation > 0,
        "per_device_batch_size ({}), max_target_length ({}) and gradient_accumulation_steps ({}) must be positive",
        shape.batch, shape.seq, shape.accumulation);
  auto param = [&](const std::string& name, const ir::Type& type, ir::Role role) {
    sig.args.push_back({name, role});
    return b.param(name, type);
  };
  StepInputs in;
  for (const Declared& p : params) {
    in.paths.push_back(p.name);
    in.params.push_back(param(p.name, p.type, ir::Role::parameter));
  }
  if (with.optimizer) {
    for (const Declared& p : params) in.m.push_back(param("opt_m/" + p.name, p.type, ir::Role::optimizer_state));
    for (const Declared& p : params) in.v.push_back(param("opt_v/" + p.name, p.type, ir::Role::optimizer_state));
    in.step = param("step", {DType::i32, {}}, ir::Role::step);
  }
  if (with.loss_scaling) {
    in.loss_scale = param("loss_scale", {DType::f32, {}}, ir::Role::loss_scale);
    in.loss_scale_count = param("loss_scale_count", {DType::i32, {}}, ir::Role::loss_scale);
  }
  Type tokens{DType::i32, {shape.accumulation, shape.batch, shape.seq}};
  if (with.inputs) in.inputs = param("inputs", tokens, ir::Role::batch);
  if (with.targets) in.targets = param("targets", tokens, ir::Role::batch);
  return in;
}

namespace {

std::vector<Declared> model_params(const nn::ModelConfig& model) {
  std::vector<Declared> out;
  for (const nn::ParamSpec& s : nn::param_specs(model)) out.push_back({s.path, s.type});
  return out;
}

// Adds a result: a named metric or output, or (`updates`) the new value of that argument, in its role.
void result(Builder& b, ir::Signature& sig, Tensor x, const std::string& name, ir::Role role) {
  b.result(x);
  sig.results.push_back({name, role});
}
void result_updating(Builder& b, ir::Signature& sig, Tensor x, const std::string& arg) {
  const int a = sig.arg(arg);
  b.result(x);
  sig.results.push_back({arg, sig.args[static_cast<size_t>(a)].role, a});
}


}  // namespace

Tensor learning_rate(Builder& b, const OptimizerConfig& o, Tensor step) {
  auto s = b.scope("lr_schedule");
  const double peak = o.learning_rate, low = peak * o.final_lr_fraction;
  const double warm = static_cast<double>(o.warmup_steps);
  const double decay = static_cast<double>(std::max<int64_t>(1, o.schedule_steps - o.warmup_steps));
  Tensor t = convert(step, DType::f32);
  Tensor warmup = (t + 1.0) * (peak / std::max(1.0, warm));
  Tensor progress = min((t + -warm) * (1.0 / decay), scalar(b, DType::f32, 1.0));
  Tensor cosine = (cos(progress * std::numbers::pi) + 1.0) * (0.5 * (peak - low)) + low;
  return select(compare(t, scalar(b, DType::f32, warm), "lt"), warmup, cosine);
}

Program grads_program(const nn::ModelConfig& model, const StepShape& shape, rematerialize::Decider* decider) {
  rematerialize::Decider local;
  Program prog;
  Graph& g = prog.graph;
  g.name = "grads";
  Builder b(g);
  StepInputs in = declare(b, prog.signature, model_params(model), shape, {});
  LossAndGrads r =
      trace_accumulated(b, model, in.params, in.inputs, in.targets, decider ? *decider : local);
  result(b, prog.signature, r.loss, "loss", ir::Role::metric);
  prog.signature.loss = r.forward_loss.id;
  for (size_t i = 0; i < r.grads.size(); ++i) result(b, prog.signature, r.grads[i], "grad/" + in.paths[i], ir::Role::output);
  sink_converts_into_scans(g);
  dce(g);
  return prog;
}

// The rest of the step from the mean loss and gradients of this rank's parameters (`parts`: where each lies
// in the model; `stages` ranks along the pipeline): loss-scale check, global-norm clipping, AdamW, the
// results. Every rank decides alike: the finiteness check and the norm are reduced over the mesh.
void update(Builder& b, ir::Signature& sig, const nn::ModelConfig& model, const OptimizerConfig& o, const StepInputs& in,
            LossAndGrads r, std::span<const GradPart> parts, int64_t stages) {
  const int64_t fsdp = model.mesh.size("fsdp"), tensor = model.mesh.size("tensor");
  auto s = b.scope("optimizer");
  std::optional<Tensor> finite;
  std::optional<Tensor> loss_scale;
  if (o.loss_scale.enabled) loss_scale = in.loss_scale;
  if (loss_scale) {  // the update is applied only if every unscaled gradient is finite
    auto ls = b.scope("loss_scale");
    // The scale is >= 1 (loss_scale_min), so g / scale is finite exactly when g is; and g / inf is ±0 for finite g
    // and NaN for inf or NaN: the sum of those squares is 0 exactly when every element is finite, in one pass and
    // without a mask array. The gradients are unscaled where the norm and AdamW read them, so no unscaled copy
    // of them exists either.
    Tensor bad = scalar(b, DType::f32, 0.0);
    for (Tensor grad : r.grads) {
      IntList all(static_cast<size_t>(grad.rank()));
      std::iota(all.begin(), all.end(), int64_t{0});
      Tensor inf = scalar(b, DType::f32, std::numeric_limits<double>::infinity());
      bad = bad + convert(sum_of_squares(grad, all, inf), DType::f32);
    }
    // Each rank checked its own shards and stages: every rank decides alike (0 or NaN, summed).
    if (fsdp > 1) bad = all_reduce(bad, "fsdp", fsdp);
    if (tensor > 1) bad = all_reduce(bad, "tensor", tensor);
    if (stages > 1) bad = all_reduce(bad, "stage", stages);
    finite = compare(bad, scalar(b, DType::f32, 0.0), "eq");
  }
  std::vector<GradPart> reduced(parts.begin(), parts.end());  // where each lies, with its gradient as reduced
  for (size_t i = 0; i < reduced.size(); ++i) reduced[i].grad = r.grads[i];
  Tensor norm = sqrt(squared_norm(b, model, reduced, stages, loss_scale));
  Tensor scale = o.clip_norm > 0 ? min(scalar(b, DType::f32, 1.0), scalar(b, DType::f32, o.clip_norm) / (norm + 1e-6))
                                 : scalar(b, DType::f32, 1.0);
  Tensor lr = learning_rate(b, o, in.step);
  Tensor t = convert(in.step, DType::f32) + 1.0;
  Tensor bias1 = 1.0 - pow(scalar(b, DType::f32, o.b1), t);
  Tensor bias2 = 1.0 - pow(scalar(b, DType::f32, o.b2), t);
  // One fused pass per parameter, in place (a skipped step, `finite` false, keeps the parameter and its moments).
  std::vector<Tensor> new_p, new_m, new_v;
  for (size_t i = 0; i < in.params.size(); ++i) {
    const auto [p2, m2, v2] = adamw(in.params[i], in.m[i], in.v[i], r.grads[i], scale, lr, bias1, bias2, finite,
                                    {.b1 = o.b1, .b2 = o.b2, .eps = o.eps, .weight_decay = o.weight_decay}, loss_scale);
    new_p.push_back(p2);
    new_m.push_back(m2);
    new_v.push_back(v2);
  }
  result(b, sig, r.loss, "loss", ir::Role::metric);
  sig.loss = r.forward_loss.id;
  result(b, sig, norm, "grad_norm", ir::Role::metric);
  result(b, sig, lr, "lr", ir::Role::metric);
  for (size_t i = 0; i < in.paths.size(); ++i) result_updating(b, sig, new_p[i], in.paths[i]);
  for (size_t i = 0; i < in.paths.size(); ++i) result_updating(b, sig, new_m[i], "opt_m/" + in.paths[i]);
  for (size_t i = 0; i < in.paths.size(); ++i) result_updating(b, sig, new_v[i], "opt_v/" + in.paths[i]);
  if (finite) {
    auto ls = b.scope("loss_scale");
    const LossScaleConfig& c = o.loss_scale;
    Tensor count = in.loss_scale_count + scalar(b, DType::i32, 1);
    Tensor grown = compare(count, scalar(b, DType::i32, static_cast<double>(c.period)), "ge");
    Tensor grow = select(*finite, grown, *finite);  // finite and due
    Tensor zero = scalar(b, DType::i32, 0);
    Tensor backoff = max(*loss_scale * (1.0 / c.factor), scalar(b, DType::f32, c.min_scale));
    result_updating(b, sig, select(*finite, select(grow, *loss_scale * c.factor, *loss_scale), backoff), "loss_scale");
    result_updating(b, sig, select(*finite, select(grow, zero, count), zero), "loss_scale_count");
    result(b, sig, convert(*finite, DType::f32), "finite", ir::Role::metric);
  }
}

Program step_program(const nn::ModelConfig& model, const StepShape& shape, const OptimizerConfig& o,
                     rematerialize::Decider* decider) {
  rematerialize::Decider local;
  Program prog;
  Graph& g = prog.graph;
  g.name = "train_step";
  Builder b(g);
  StepInputs in =
      declare(b, prog.signature, model_params(model), shape, {.optimizer = true, .loss_scaling = o.loss_scale.enabled});
  std::optional<Tensor> loss_scale;
  if (o.loss_scale.enabled) loss_scale = in.loss_scale;
  LossAndGrads r =
      trace_accumulated(b, model, in.params, in.inputs, in.targets, decider ? *decider : local, loss_scale);
  std::vector<GradPart> parts;
  for (size_t i = 0; i < r.grads.size(); ++i) parts.push_back({r.grads[i], i});
  update(b, prog.signature, model, o, in, r, parts, 1);
  fold_widening_converts(g);
  sink_converts_into_scans(g);
  dce(g);
  return prog;
}

namespace {
// nn's forward graphs take the model's parameters (by their paths), then batch inputs; one result.
ir::Signature forward_signature(const nn::ModelConfig& model, const Graph& g, const std::string& result, ir::Role role) {
  ir::Signature sig;
  for (const nn::ParamSpec& p : nn::param_specs(model)) sig.args.push_back({p.path, ir::Role::parameter});
  for (size_t i = sig.args.size(); i < g.param_names.size(); ++i) {
    ASSERT(g.param_names[i] == "inputs" || g.param_names[i] == "targets");
    sig.args.push_back({g.param_names[i], ir::Role::batch});
  }
  ASSERT(sig.args.size() == g.params.size() && g.results.size() == 1);
  for (size_t i = 0; i < sig.args.size(); ++i) ASSERT(sig.args[i].name == g.param_names[i]);
  sig.results.push_back({result, role});
  return sig;
}
}  // namespace

Program loss_program(const nn::ModelConfig& model, int64_t batch, int64_t seq) {
  Graph g = nn::loss_graph(model, batch, seq);
  ir::Signature sig = forward_signature(model, g, "loss", ir::Role::metric);
  sig.loss = g.results[0];
  return {std::move(g), std::move(sig), {}};
}

Program logits_program(const nn::ModelConfig& model, int64_t batch, int64_t seq) {
  Graph g = nn::logits_graph(model, batch, seq);
  ir::Signature sig = forward_signature(model, g, "logits", ir::Role::output);
  return {std::move(g), std::move(sig), {}};
}

}  // namespace remat::train
