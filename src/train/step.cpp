#include "train/step.h"

#include "autodiff/autodiff.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <numbers>

namespace remat::train {

using namespace ir;

namespace {

struct LossAndGrads {
  Tensor loss;
  std::vector<Tensor> grads;
};

// Gradients of `loss` (times `scale`, when loss scaling: the gradients are then scaled too).
LossAndGrads trace_microbatch(Builder& b, const nn::ModelConfig& model, std::span<const Tensor> params, Tensor inputs,
                              Tensor targets, rematerialize::Decider& decider, std::optional<Tensor> scale) {
  Tensor loss = nn::trace_loss(b, model, params, inputs, targets);
  Tensor differentiated = scale ? loss * *scale : loss;
  std::vector<ValueId> wrt;
  for (Tensor p : params) wrt.push_back(p.id);
  LossAndGrads r{loss, {}};
  for (ValueId g : autodiff::grad(b.graph(), differentiated.id, wrt, &decider, wrt)) r.grads.push_back(b.wrap(g));
  return r;
}

// The means of loss and gradient sums over k microbatches on each rank of the model's mesh (every rank takes
// its own part of the batch). The loss sums are all-reduced over the mesh (in rank order from zero); so are
// the gradients of whole parameters, while FSDP shards' gradients arrive summed over every rank already (the
// transpose of each parameter's all_gather is a reduce_scatter over the whole mesh).
LossAndGrads mean_over(Builder& b, const nn::ModelConfig& model, LossAndGrads sums, int64_t k) {
  const nn::Mesh& mesh = model.mesh;
  const int64_t ranks = mesh.ranks();
  if (ranks > 1) {
    auto s = b.scope("data_parallel");
    sums.loss = all_reduce(sums.loss, mesh.group(), ranks);
    const std::vector<nn::ParamSpec> specs = nn::param_specs(model);
    for (size_t i = 0; i < sums.grads.size(); ++i)  // whole parameters: summed here; shards: already
      if (specs[i].shards == 1) sums.grads[i] = all_reduce(sums.grads[i], mesh.group(), ranks);
  }
  if (k * ranks == 1) return sums;
  const double inv = 1.0 / static_cast<double>(k * ranks);
  sums.loss = sums.loss * inv;
  for (Tensor& g : sums.grads) g = g * inv;
  return sums;
}

// Mean loss and gradients over the k microbatches of inputs/targets [k,B,T] of each rank of the model's mesh.
// The ranks' sums are all-reduced as ((0 + x_0) + x_1) + ..., the sum one process accumulating microbatch r
// of rank r in order forms: ranks each taking one microbatch train bit-identically to it.
LossAndGrads trace_accumulated(Builder& b, const nn::ModelConfig& model, std::span<const Tensor> params,
                               Tensor inputs, Tensor targets, rematerialize::Decider& decider,
                               std::optional<Tensor> scale = std::nullopt) {
  const int64_t k = inputs.dim(0);
  const Shape mb = {inputs.dim(1), inputs.dim(2)};
  if (k == 1)
    return mean_over(b, model, trace_microbatch(b, model, params, reshape(inputs, mb), reshape(targets, mb), decider, scale), 1);
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
  return mean_over(b, model, {sums[0], {sums.begin() + 1, sums.end()}}, k);
}

struct StepInputs {
  std::vector<std::string> paths;  // the parameters' names (moments are opt_m/<path>, opt_v/<path>)
  std::vector<Tensor> params;
  Tensor inputs, targets;
  Tensor loss_scale, loss_scale_count;  // with loss scaling
};

// Declares the step's arguments as graph params, each with its role in `sig`.
StepInputs declare(Builder& b, ir::Signature& sig, const nn::ModelConfig& model, const StepShape& shape,
                   std::vector<Tensor>* m, std::vector<Tensor>* v, Tensor* step, bool loss_scaling = false) {
  CHECK(shape.batch > 0 && shape.seq > 0 && shape.accumulation > 0,
        "per_device_batch_size ({}), max_target_length ({}) and gradient_accumulation_steps ({}) must be positive",
        shape.batch, shape.seq, shape.accumulation);
  auto param = [&](const std::string& name, const ir::Type& type, ir::Role role) {
    sig.args.push_back({name, role});
    return b.param(name, type);
  };
  StepInputs in;
  std::vector<nn::ParamSpec> specs = nn::param_specs(model);
  for (const auto& s : specs) {
    in.paths.push_back(s.path);
    in.params.push_back(param(s.path, s.type, ir::Role::parameter));
  }
  if (m)
    for (const auto& s : specs) m->push_back(param("opt_m/" + s.path, s.type, ir::Role::optimizer_state));
  if (v)
    for (const auto& s : specs) v->push_back(param("opt_v/" + s.path, s.type, ir::Role::optimizer_state));
  if (step) *step = param("step", {DType::i32, {}}, ir::Role::step);
  if (loss_scaling) {
    in.loss_scale = param("loss_scale", {DType::f32, {}}, ir::Role::loss_scale);
    in.loss_scale_count = param("loss_scale_count", {DType::i32, {}}, ir::Role::loss_scale);
  }
  Type tokens{DType::i32, {shape.accumulation, shape.batch, shape.seq}};
  in.inputs = param("inputs", tokens, ir::Role::batch);
  in.targets = param("targets", tokens, ir::Role::batch);
  return in;
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

Tensor sum_all(Tensor x) {
  IntList axes(static_cast<size_t>(x.rank()));
  for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
  return axes.empty() ? x : reduce_sum(x, axes);
}

// The sum of a gradient's squares, the same bits whether it is whole or sharded over `fsdp` ranks: summed
// over every dimension but the embed one first (each of those sums reads the same elements in the same
// order either way), the shards' partial sums gathered, then summed.
Tensor squared_sum(Tensor grad, const nn::ParamSpec& spec, int64_t fsdp) {
  const auto embed = std::find(spec.axes.begin(), spec.axes.end(), "embed");
  ASSERT(spec.shards == 1 || embed != spec.axes.end());
  if (embed == spec.axes.end()) return sum_all(square(grad));
  const int64_t e = embed - spec.axes.begin();
  IntList others;
  for (int64_t d = 0; d < grad.rank(); ++d)
    if (d != e) others.push_back(d);
  Tensor partial = reduce_sum(square(grad), others);  // [embed]
  if (spec.shards > 1) {
    ASSERT(spec.shard_dim == e && spec.shards == fsdp);
    partial = all_gather(partial, "fsdp", fsdp, 0);
  }
  return reduce_sum(partial, {0});
}

// lr(step): linear warmup over warmup_steps, then cosine decay to final_lr_fraction * peak.
Tensor schedule(Builder& b, const OptimizerConfig& o, Tensor step) {
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

}  // namespace

double learning_rate_at(const OptimizerConfig& o, int64_t step) {
  const double peak = o.learning_rate, low = peak * o.final_lr_fraction;
  if (step < o.warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(std::max<int64_t>(1, o.warmup_steps));
  const double decay = static_cast<double>(std::max<int64_t>(1, o.schedule_steps - o.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / decay);
  return low + 0.5 * (peak - low) * (1 + std::cos(std::numbers::pi * progress));
}

Program grads_program(const nn::ModelConfig& model, const StepShape& shape, rematerialize::Decider* decider) {
  rematerialize::Decider local(nn::vocabulary(model));
  ASSERT(decider == nullptr || decider->names() == nn::vocabulary(model));
  Program prog;
  Graph& g = prog.graph;
  g.name = "grads";
  Builder b(g);
  StepInputs in = declare(b, prog.signature, model, shape, nullptr, nullptr, nullptr);
  LossAndGrads r =
      trace_accumulated(b, model, in.params, in.inputs, in.targets, decider ? *decider : local);
  result(b, prog.signature, r.loss, "loss", ir::Role::metric);
  for (size_t i = 0; i < r.grads.size(); ++i) result(b, prog.signature, r.grads[i], "grad/" + in.paths[i], ir::Role::output);
  sink_converts_into_scans(g);
  dce(g);
  return prog;
}

Program step_program(const nn::ModelConfig& model, const StepShape& shape, const OptimizerConfig& o,
                     rematerialize::Decider* decider) {
  rematerialize::Decider local(nn::vocabulary(model));
  ASSERT(decider == nullptr || decider->names() == nn::vocabulary(model));
  Program prog;
  Graph& g = prog.graph;
  ir::Signature& sig = prog.signature;
  g.name = "train_step";
  Builder b(g);
  std::vector<Tensor> m, v;
  Tensor step;
  StepInputs in = declare(b, sig, model, shape, &m, &v, &step, o.loss_scale.enabled);
  const std::vector<nn::ParamSpec> specs = nn::param_specs(model);
  const int64_t fsdp = model.mesh.size("fsdp");
  std::optional<Tensor> loss_scale;
  if (o.loss_scale.enabled) loss_scale = in.loss_scale;
  LossAndGrads r =
      trace_accumulated(b, model, in.params, in.inputs, in.targets, decider ? *decider : local, loss_scale);
  auto s = b.scope("optimizer");
  std::optional<Tensor> finite;
  if (loss_scale) {  // unscale; the update is applied only if every gradient is finite
    auto ls = b.scope("loss_scale");
    Tensor bad = scalar(b, DType::f32, 0.0);
    for (Tensor& grad : r.grads) {
      grad = grad / broadcast_to(convert(*loss_scale, grad.dtype()), grad.shape());
      // x * 0 is 0 for finite x and NaN for inf or NaN.
      Tensor nonfinite = compare(grad * 0.0, zeros_like(grad), "ne");
      bad = bad + sum_all(convert(nonfinite, DType::f32));
    }
    if (fsdp > 1) bad = all_reduce(bad, "fsdp", fsdp);  // each rank checked its shards: every rank decides alike
    finite = compare(bad, scalar(b, DType::f32, 0.0), "eq");
  }
  Tensor sq = scalar(b, DType::f32, 0.0);
  for (size_t i = 0; i < r.grads.size(); ++i) sq = sq + squared_sum(r.grads[i], specs[i], fsdp);
  Tensor norm = sqrt(sq);
  Tensor scale = o.clip_norm > 0 ? min(scalar(b, DType::f32, 1.0), scalar(b, DType::f32, o.clip_norm) / (norm + 1e-6))
                                 : scalar(b, DType::f32, 1.0);
  Tensor lr = schedule(b, o, step);
  Tensor t = convert(step, DType::f32) + 1.0;
  Tensor bias1 = 1.0 - pow(scalar(b, DType::f32, o.b1), t);
  Tensor bias2 = 1.0 - pow(scalar(b, DType::f32, o.b2), t);
  std::vector<Tensor> new_p, new_m, new_v;
  for (size_t i = 0; i < in.params.size(); ++i) {
    Tensor p = in.params[i];
    Tensor grad = r.grads[i] * scale;
    Tensor m2 = m[i] * o.b1 + grad * (1.0 - o.b1);
    Tensor v2 = v[i] * o.b2 + square(grad) * (1.0 - o.b2);
    Tensor decayed = p - p * (lr * o.weight_decay);
    Tensor update = (m2 / bias1) / (sqrt(v2 / bias2) + o.eps);
    Tensor p2 = decayed - update * lr;
    if (finite) {  // a skipped step keeps the parameter and its moments
      Tensor keep = broadcast_to(*finite, p.shape());
      p2 = select(keep, p2, p);
      m2 = select(keep, m2, m[i]);
      v2 = select(keep, v2, v[i]);
    }
    new_p.push_back(p2);
    new_m.push_back(m2);
    new_v.push_back(v2);
  }
  result(b, sig, r.loss, "loss", ir::Role::metric);
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
  return {std::move(g), std::move(sig)};
}

Program logits_program(const nn::ModelConfig& model, int64_t batch, int64_t seq) {
  Graph g = nn::logits_graph(model, batch, seq);
  ir::Signature sig = forward_signature(model, g, "logits", ir::Role::output);
  return {std::move(g), std::move(sig)};
}

}  // namespace remat::train
