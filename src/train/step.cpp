#include "train/step.h"

#include "autodiff/autodiff.h"
#include "train/grad_norm.h"

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

struct LossAndGrads {
  Tensor loss;
  std::vector<Tensor> grads;
  Tensor forward_loss;  // the loss before the means over microbatches and ranks (the program's Signature::loss)
};

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

struct StepInputs {
  std::vector<std::string> paths;  // the parameters' argument names (moments are opt_m/<path>, opt_v/<path>)
  std::vector<Tensor> params;
  std::vector<Tensor> m, v;        // with the optimizer
  Tensor step;                     // with the optimizer
  Tensor inputs, targets;
  Tensor loss_scale, loss_scale_count;  // with loss scaling
};

struct Declared {
  std::string name;  // the argument's name
  ir::Type type;
};

// Which arguments a program takes beside its parameters.
struct Arguments {
  bool optimizer = false;     // the parameters' moments and the step counter
  bool loss_scaling = false;  // the loss scale and its counter
  bool inputs = true, targets = true;  // the batch
};

// Declares the step's arguments as graph params, each with its role in `sig`: `params`, then those `with` asks for.
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
  rematerialize::Decider local(nn::remat_policies(model));
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

namespace {

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

}  // namespace

Program step_program(const nn::ModelConfig& model, const StepShape& shape, const OptimizerConfig& o,
                     rematerialize::Decider* decider) {
  rematerialize::Decider local(nn::remat_policies(model));
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
  sink_converts_into_scans(g);
  dce(g);
  return prog;
}

const ActionSpan* action_of(const std::vector<ActionSpan>& actions, uint64_t origin) {
  auto it = std::upper_bound(actions.begin(), actions.end(), origin,
                             [](uint64_t o, const ActionSpan& a) { return o < a.first; });
  return it == actions.begin() || origin >= std::prev(it)->end ? nullptr : &*std::prev(it);
}

std::vector<nn::StagePart> pipeline_parts(const nn::ModelConfig& model, const parallel::PipelineShape& shape, int64_t rank) {
  const int64_t p = shape.stages, K = shape.virtual_stages();
  CHECK(model.num_decoder_layers % K == 0, "{} decoder layers do not split into {} pipeline stages of equal size",
        model.num_decoder_layers, K);
  const int64_t per = model.num_decoder_layers / K;
  std::vector<nn::StagePart> parts;
  for (int64_t j = 0; j < shape.chunks; ++j) {
    const int64_t k = j * p + rank;
    parts.push_back({k * per, per, k == 0, k == K - 1});
  }
  return parts;
}

std::string rank_remat_policy(const nn::ModelConfig& model, const parallel::PipelineShape& shape, int64_t rank) {
  std::vector<std::string> written;
  for (const nn::StagePart& part : pipeline_parts(model, shape, rank)) {
    const std::string& w = nn::stage_remat_policy(model, part).written;
    if (std::find(written.begin(), written.end(), w) == written.end()) written.push_back(w);
  }
  return fmt::format("{}", fmt::join(written, " | "));
}

std::string pipeline_arg_name(const nn::ParamSpec& spec, const nn::StagePart& part) {
  if (!spec.stacked()) return spec.path;
  return fmt::format("{}[{}:{}]", spec.path, part.first_layer, part.first_layer + part.num_layers);
}

namespace {

// What one chunk of a pipeline rank holds while the step's actions are traced.
struct Chunk {
  nn::StagePart part;
  std::vector<nn::ParamSpec> specs;
  size_t first_param = 0;                  // its parameters' place among the rank's
  std::vector<Tensor> in, out, dout, din;  // per microbatch: input (received or embedded), output, their gradients
  std::vector<Tensor> loss;                // per microbatch, on the last stage: the loss (times the loss scale)
  std::vector<Tensor> grad_sums;           // over the microbatches done, in order
};

// A forward action: the chunk's stage on microbatch `mb` from `x` (embedded or received); on the last stage the
// loss, summed into `loss_sum` and kept (times `loss_scale` when given) as the backward's seed.
void forward_action(Builder& b, const nn::ModelConfig& model, Chunk& c, size_t mb, std::span<const Tensor> params,
                    Tensor x, std::optional<Tensor> targets, std::optional<Tensor> loss_scale, Tensor& loss_sum) {
  ASSERT(x.b != nullptr);
  c.in[mb] = x;
  Tensor y = nn::trace_stage(b, model, c.part, params, x, targets);
  if (!c.part.head) {
    c.out[mb] = y;
    return;
  }
  const std::string action_scope = b.current_scope();
  b.set_scope("pipeline/loss_sum");  // it outlives the microbatch
  loss_sum = loss_sum + y;
  b.set_scope(action_scope);
  c.loss[mb] = loss_scale ? y * *loss_scale : y;
}

// A backward action: the chunk's vjp for the action's microbatch, seeded with 1 on the (scaled) loss, as grad
// seeds it, or with the gradient the next stage sent; its input's gradient kept for sending, its parameters'
// added to the chunk's sums in microbatch order (`m` microbatches). `weights`: every parameter of the rank.
void backward_action(Builder& b, Chunk& c, const parallel::Action& a, std::span<const Tensor> params,
                     std::span<const Tensor> weights, int64_t m, rematerialize::Decider& decider) {
  const size_t mb = static_cast<size_t>(a.microbatch);
  const Tensor y = c.part.head ? c.loss[mb] : c.out[mb];
  const Tensor dy = c.part.head ? full(b, y.type(), 1.0) : c.dout[mb];
  const std::pair<ValueId, ValueId> seed{y.id, dy.id};
  std::vector<ValueId> wrt;
  if (!c.part.embedding) wrt.push_back(c.in[mb].id);
  for (Tensor t : params) wrt.push_back(t.id);
  std::vector<ValueId> weight_ids;
  for (Tensor t : weights) weight_ids.push_back(t.id);
  std::vector<ValueId> grads = autodiff::vjp(b.graph(), std::span(&seed, 1), wrt, &decider, weight_ids);
  const size_t skip = c.part.embedding ? 0 : 1;
  if (!c.part.embedding) c.din[mb] = b.wrap(grads[0]);
  const std::string action_scope = b.current_scope();
  b.set_scope(fmt::format("pipeline/chunk{}/gradient_sums", a.chunk));  // they outlive the microbatch
  for (size_t i = 0; i < c.specs.size(); ++i) {
    Tensor gi = b.wrap(grads[skip + i]);
    if (c.grad_sums.size() <= i) c.grad_sums.push_back(m == 1 ? gi : zeros_like(gi) + gi);  // as the scan: 0 + g
    else c.grad_sums[i] = c.grad_sums[i] + gi;
  }
  b.set_scope(action_scope);
}

}  // namespace

Program pipeline_step_program(const nn::ModelConfig& model, const StepShape& shape, const OptimizerConfig& o,
                              const parallel::Schedule& schedule, int64_t rank, rematerialize::Decider* decider) {
  const parallel::PipelineShape& ps = schedule.shape;
  const int64_t p = ps.stages, m = ps.microbatches;
  CHECK(shape.accumulation == m, "pipeline step: {} microbatches in the batch for a schedule of {}", shape.accumulation, m);
  ASSERT(rank >= 0 && rank < p);
  rematerialize::Decider local(nn::remat_policies(model));
  Program prog;
  Graph& g = prog.graph;
  g.name = fmt::format("pipeline_step_stage{}", rank);
  Builder b(g);
  std::vector<Chunk> chunks;
  std::vector<Declared> declared;
  for (const nn::StagePart& part : pipeline_parts(model, ps, rank)) {
    Chunk c{part, nn::stage_param_specs(model, part), declared.size(), {}, {}, {}, {}, {}, {}};
    for (const nn::ParamSpec& s : c.specs) declared.push_back({pipeline_arg_name(s, part), s.type});
    c.in.resize(static_cast<size_t>(m)), c.out = c.dout = c.din = c.loss = c.in;
    chunks.push_back(std::move(c));
  }
  const bool first = chunks.front().part.embedding, last = chunks.back().part.head;
  StepInputs in = declare(b, prog.signature, declared, shape,
                          {.optimizer = true, .loss_scaling = o.loss_scale.enabled, .inputs = first, .targets = last});
  const Type activation = nn::stage_activation(model, shape.batch, shape.seq);
  auto microbatch = [&](Tensor tokens, int64_t c) {
    return reshape(slice(tokens, {c, 0, 0}, {c + 1, shape.batch, shape.seq}), {shape.batch, shape.seq});
  };
  auto params_of = [&](const Chunk& c) {
    return std::span<const Tensor>(in.params).subspan(c.first_param, c.specs.size());
  };
  // Each send is waited for once this rank knows it was received (then at once), its buffer live until then.
  const std::vector<parallel::Action>& actions = schedule.ranks[static_cast<size_t>(rank)];
  const std::vector<int64_t> received = parallel::simulate(schedule, parallel::Costs{}).send_known_received[static_cast<size_t>(rank)];
  std::map<int64_t, std::vector<Tensor>> waits;  // after action k: the sends known received by then
  Tensor loss_sum = scalar(b, DType::f32, 0.0);
  enum Tag : int64_t { activation_tag = 0, gradient_tag = 1 };
  for (size_t k = 0; k < actions.size(); ++k) {
    const parallel::Action& a = actions[k];
    prog.actions.push_back({a, ir::next_origin(), 0});
    Chunk& c = chunks[static_cast<size_t>(a.chunk)];
    const size_t mb = static_cast<size_t>(a.microbatch);
    auto scope = b.scope(fmt::format("pipeline/chunk{}/microbatch{}", a.chunk, a.microbatch));
    switch (a.step) {
      case parallel::Step::forward: {
        const Tensor x = c.part.embedding ? microbatch(in.inputs, a.microbatch) : c.in[mb];
        std::optional<Tensor> targets;
        if (c.part.head) targets = microbatch(in.targets, a.microbatch);
        std::optional<Tensor> scale;
        if (o.loss_scale.enabled) scale = in.loss_scale;
        forward_action(b, model, c, mb, params_of(c), x, targets, scale, loss_sum);
        break;
      }
      case parallel::Step::backward: {
        // The explanation records each chunk's first microbatch (every microbatch decides alike).
        rematerialize::Decider& d = a.microbatch == 0 && decider ? *decider : local;
        backward_action(b, c, a, params_of(c), in.params, m, d);
        break;
      }
      case parallel::Step::send_activation:
        waits[received[k]].push_back(send(c.out[mb], "stage", p, a.peer, activation_tag));
        break;
      case parallel::Step::send_gradient:
        waits[received[k]].push_back(send(c.din[mb], "stage", p, a.peer, gradient_tag));
        break;
      case parallel::Step::recv_activation:
        c.in[mb] = recv(b, activation, "stage", p, a.peer, activation_tag);
        break;
      case parallel::Step::recv_gradient:
        c.dout[mb] = recv(b, activation, "stage", p, a.peer, gradient_tag);
        break;
    }
    prog.actions.back().end = ir::next_origin();  // the waits after it are not its work
    for (Tensor t : waits[static_cast<int64_t>(k)]) send_done(t);
  }
  for (Tensor t : waits[static_cast<int64_t>(actions.size())]) send_done(t);
  LossAndGrads sums{loss_sum, {}, loss_sum};
  std::vector<nn::ParamSpec> specs;
  std::vector<GradPart> parts;
  const std::vector<nn::ParamSpec> whole = nn::param_specs(model);
  for (const Chunk& c : chunks)
    for (size_t i = 0; i < c.specs.size(); ++i) {
      sums.grads.push_back(c.grad_sums[i]);
      specs.push_back(c.specs[i]);
      const size_t index = static_cast<size_t>(
          std::find_if(whole.begin(), whole.end(), [&](const nn::ParamSpec& w) { return w.path == c.specs[i].path; }) -
          whole.begin());
      parts.push_back({c.grad_sums[i], index, c.part.first_layer});
    }
  // The loss is the last stage's: the others add zero (exact) in the all-reduce that gives it to every rank.
  if (p > 1) {
    auto s = b.scope("pipeline");
    sums.loss = all_reduce(sums.loss, "stage", p);
  }
  LossAndGrads r = mean_over(b, model, specs, sums, m);
  update(b, prog.signature, model, o, in, r, parts, p);
  sink_converts_into_scans(g);
  dce(g);
  return prog;
}

namespace {
// The FLOPs of `part`'s layers (no embedding, no head): forward, and backward with its recomputes.
parallel::Costs layer_costs(const nn::ModelConfig& model, nn::StagePart part, int64_t batch, int64_t seq) {
  part.embedding = part.head = false;
  Graph g;
  Builder b(g);
  std::vector<Tensor> params;
  std::vector<ValueId> wrt;
  for (const nn::ParamSpec& s : nn::stage_param_specs(model, part)) params.push_back(b.param(s.path, s.type));
  Tensor x = b.param("x", nn::stage_activation(model, batch, seq));
  wrt.push_back(x.id);
  for (Tensor t : params) wrt.push_back(t.id);
  Tensor y = nn::trace_stage(b, model, part, params, x, std::nullopt);
  const size_t forward_nodes = g.nodes.size();
  Tensor dy = b.param("dy", y.type());
  const std::pair<ValueId, ValueId> seed{y.id, dy.id};
  rematerialize::Decider decider(nn::remat_policies(model));
  std::vector<ValueId> weights(wrt.begin() + 1, wrt.end());
  for (ValueId d : autodiff::vjp(g, std::span(&seed, 1), wrt, &decider, weights)) g.results.push_back(d);
  parallel::Costs c{0, 0};
  for (size_t i = 0; i < g.nodes.size(); ++i) (i < forward_nodes ? c.forward : c.backward) += ir::flops(g, g.nodes[i]);
  return c;
}
}  // namespace

std::vector<parallel::Costs> stage_costs(const nn::ModelConfig& model, const parallel::PipelineShape& shape,
                                         int64_t batch, int64_t seq) {
  std::vector<parallel::Costs> costs(static_cast<size_t>(shape.virtual_stages()));
  std::map<std::string, parallel::Costs> of_policy;  // stages differ only in their policy
  for (int64_t rank = 0; rank < shape.stages; ++rank) {
    const std::vector<nn::StagePart> parts = pipeline_parts(model, shape, rank);
    for (size_t j = 0; j < parts.size(); ++j) {
      const std::string& policy = nn::stage_remat_policy(model, parts[j]).written;
      if (!of_policy.count(policy)) of_policy[policy] = layer_costs(model, parts[j], batch, seq);
      costs[j * static_cast<size_t>(shape.stages) + static_cast<size_t>(rank)] = of_policy[policy];
    }
  }
  return costs;
}

Program pipeline_forward_program(const nn::ModelConfig& model, int64_t batch, int64_t seq,
                                 const parallel::PipelineShape& shape, int64_t rank, Forward what) {
  const bool logits = what == Forward::logits;
  const int64_t p = shape.stages, K = shape.virtual_stages();
  Program prog;
  Graph& g = prog.graph;
  g.name = fmt::format("pipeline_{}_stage{}", logits ? "logits" : "loss", rank);
  Builder b(g);
  std::vector<nn::StagePart> parts = pipeline_parts(model, shape, rank);
  std::vector<Declared> declared;
  for (const nn::StagePart& part : parts)
    for (const nn::ParamSpec& s : nn::stage_param_specs(model, part)) declared.push_back({pipeline_arg_name(s, part), s.type});
  const bool first = parts.front().embedding, last = parts.back().head;
  StepInputs in = declare(b, prog.signature, declared, {batch, seq, 1}, {.inputs = first, .targets = last && !logits});
  const Type activation = nn::stage_activation(model, batch, seq);
  // The virtual stages one after another: this rank's run when they come, receiving from the one before and
  // sending to the one after (a chain: no rank waits for one that waits for it).
  Tensor x, out;
  std::vector<Tensor> sent;
  size_t next_param = 0;
  for (int64_t k = rank, j = 0; k < K; k += p, ++j) {
    const nn::StagePart& part = parts[static_cast<size_t>(j)];
    const size_t n = nn::stage_param_specs(model, part).size();
    auto scope = b.scope(fmt::format("pipeline/chunk{}", j));
    x = part.embedding ? reshape(in.inputs, {batch, seq}) : recv(b, activation, "stage", p, (k - 1) % p, 0);
    std::span<const Tensor> ps = std::span<const Tensor>(in.params).subspan(next_param, n);
    next_param += n;
    if (part.head && logits) {
      out = nn::trace_stage(b, model, part, ps, x, std::nullopt);
    } else if (part.head) {
      out = nn::trace_stage(b, model, part, ps, x, reshape(in.targets, {batch, seq}));
    } else {
      sent.push_back(send(nn::trace_stage(b, model, part, ps, x, std::nullopt), "stage", p, (k + 1) % p, 0));
    }
  }
  for (Tensor t : sent) send_done(t);
  // The last stage's result, given to every rank: the others add zeros (exact) in the all-reduce.
  const Type result_type = logits ? Type{DType::f32, {batch, seq, model.vocab_size}} : Type{DType::f32, {}};
  if (!last) out = full(b, result_type, 0.0);
  if (!logits) prog.signature.loss = out.id;
  if (p > 1) out = all_reduce(out, "stage", p);
  b.result(out);
  prog.signature.results.push_back({logits ? "logits" : "loss", logits ? ir::Role::output : ir::Role::metric});
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
