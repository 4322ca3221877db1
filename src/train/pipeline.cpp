#include "train/step.h"

#include "autodiff/autodiff.h"
#include "train/step_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

namespace remat::train {

using namespace ir;

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
  std::vector<rematerialize::Policy> distinct;
  std::vector<std::string> written;
  for (const nn::StagePart& part : pipeline_parts(model, shape, rank)) {
    const rematerialize::Policy& p = nn::stage_remat_policy(model, part);
    if (std::any_of(distinct.begin(), distinct.end(), [&](const auto& d) { return rematerialize::same_policy(d, p); })) continue;
    distinct.push_back(p);
    written.push_back(p.written);
  }
  return fmt::format("{}", fmt::join(written, " | "));
}

std::string pipeline_arg_name(const nn::ParamSpec& spec, const nn::StagePart& part) {
  if (!spec.stacked()) return spec.path;
  return fmt::format("{}[{}:{}]", spec.path, part.first_layer, part.first_layer + part.num_layers);
}

namespace {

// A chunk traced and differentiated once, in the action of its first forward: a graph whose params are the
// chunk's parameters, its input, the targets (head), the loss scale (head, when scaling) and the gradient it
// receives (not head). Nodes [0, stage_end) are the stage, [stage_end, forward_end) its loss times the scale,
// the rest its backward; each action instantiates its range for its microbatch (ir::instantiate), so the
// rank's program is as if each action had traced and differentiated its own copy, in linear time.
struct ChunkTemplate {
  Graph g;
  size_t stage_end = 0, forward_end = 0;
  std::vector<ValueId> params;
  ValueId x = -1, targets = -1, loss_scale = -1, dout = -1;
  ValueId y = -1;              // the stage's output, or its loss
  std::vector<ValueId> grads;  // the input's (unless the chunk embeds), then the parameters'
  std::vector<bool> input_part;  // per node: in the backward's B part (autodiff::split_backward)
};

ChunkTemplate trace_chunk(const nn::ModelConfig& model, const nn::StagePart& part, std::span<const Tensor> params,
                          const Type& input, std::optional<Type> targets_type, bool scaled, bool split,
                          rematerialize::Decider& decider) {
  ChunkTemplate t;
  Builder b(t.g);
  std::vector<Tensor> ps;
  for (Tensor p : params) ps.push_back(b.param("parameter", p.type()));
  const Tensor x = b.param("x", input);
  std::optional<Tensor> targets, scale;
  if (targets_type) targets = b.param("targets", *targets_type);
  if (part.head && scaled) scale = b.param("loss_scale", {DType::f32, {}});
  const Tensor y = nn::trace_stage(b, model, part, ps, x, targets);
  t.stage_end = t.g.nodes.size();
  const Tensor seeded = scale ? y * *scale : y;  // the backward's seed: the loss times the scale, as grad seeds it
  t.forward_end = t.g.nodes.size();
  const Tensor dy = part.head ? full(b, seeded.type(), 1.0) : b.param("dout", y.type());
  const std::pair<ValueId, ValueId> seed{seeded.id, dy.id};
  std::vector<ValueId> wrt;
  if (!part.embedding) wrt.push_back(x.id);
  for (Tensor p : ps) wrt.push_back(p.id), t.params.push_back(p.id);
  const std::vector<ValueId> weights(t.params);
  t.grads = autodiff::vjp(t.g, std::span(&seed, 1), wrt, &decider, weights);
  if (split)
    t.input_part = part.embedding ? std::vector<bool>(t.g.nodes.size(), false)  // no input: all W
                                  : autodiff::split_backward(t.g, t.forward_end, t.grads[0]);
  t.x = x.id;
  t.targets = targets ? targets->id : -1;
  t.loss_scale = scale ? scale->id : -1;
  t.dout = part.head ? -1 : dy.id;
  t.y = y.id;
  return t;
}

// What one chunk of a pipeline rank holds while the step's actions are traced.
struct Chunk {
  nn::StagePart part;
  bool split;                                // its backward runs as B and W (parallel::splits_backward)
  std::vector<nn::ParamSpec> specs;
  size_t first_param = 0;                    // its parameters' place among the rank's
  std::optional<ChunkTemplate> traced;       // from its first forward on
  std::vector<ir::Instance> instances;       // per microbatch, from its forward to its backward
  std::vector<Tensor> in, out, dout, din;    // per microbatch: input (received or embedded), output, their gradients
  std::vector<Tensor> grad_sums;             // over the microbatches done, in order
};

// A forward action: the chunk's stage on microbatch `mb` from `x` (embedded or received); on the last stage the
// loss, summed into `loss_sum`, then times `loss_scale` (when given), the backward's seed.
void forward_action(Builder& b, const nn::ModelConfig& model, Chunk& c, size_t mb, std::span<const Tensor> params,
                    Tensor x, std::optional<Tensor> targets, std::optional<Tensor> loss_scale, Tensor& loss_sum,
                    rematerialize::Decider& decider) {
  ASSERT(x.b != nullptr);
  ir::Instance& instance = c.instances[mb];
  if (!c.traced) {
    std::optional<Type> targets_type;
    if (targets) targets_type = targets->type();
    c.traced = trace_chunk(model, c.part, params, x.type(), targets_type, loss_scale.has_value(), c.split, decider);
    instance.keep_origins = true;  // traced in this action: its ops are this action's
  }
  const ChunkTemplate& t = *c.traced;
  for (size_t i = 0; i < params.size(); ++i) instance.values.emplace(t.params[i], params[i]);
  instance.values.emplace(t.x, x);
  if (targets) instance.values.emplace(t.targets, *targets);
  if (loss_scale) instance.values.emplace(t.loss_scale, *loss_scale);
  c.in[mb] = x;
  ir::instantiate(b, t.g, 0, t.stage_end, instance);
  const Tensor y = instance.values.at(t.y);
  if (!c.part.head) {
    c.out[mb] = y;
    return;
  }
  const std::string action_scope = b.current_scope();
  b.set_scope("pipeline/loss_sum");  // it outlives the microbatch
  loss_sum = loss_sum + y;
  b.set_scope(action_scope);
  ir::instantiate(b, t.g, t.stage_end, t.forward_end, instance);
}

// A backward action: the chunk's backward for the action's microbatch, from the (scaled) loss or the gradient
// the next stage sent; its input's gradient kept for sending, its parameters' added to the chunk's sums in
// microbatch order (`m` microbatches). Under a schedule that splits backwards, the backward action runs B (up
// to the input's gradient) and the weight action W (the rest, with the sums).
void backward_action(Builder& b, Chunk& c, const parallel::Action& a, int64_t m) {
  const bool split = c.split;
  const size_t mb = static_cast<size_t>(a.microbatch);
  const ChunkTemplate& t = *c.traced;
  ir::Instance& instance = c.instances[mb];
  instance.keep_origins = false;  // the backward's ops are this action's, though traced in the first forward's
  if (a.step == parallel::Step::backward) {
    if (!c.part.head) instance.values.emplace(t.dout, c.dout[mb]);
    ir::instantiate(b, t.g, t.forward_end, t.g.nodes.size(), instance, split ? &t.input_part : nullptr, true);
    if (!c.part.embedding) c.din[mb] = instance.values.at(t.grads[0]);
    if (split) return;
  } else {
    ir::instantiate(b, t.g, t.forward_end, t.g.nodes.size(), instance, &t.input_part, false);
  }
  const size_t skip = c.part.embedding ? 0 : 1;
  const std::string action_scope = b.current_scope();
  b.set_scope(fmt::format("pipeline/chunk{}/gradient_sums", a.chunk));  // they outlive the microbatch
  for (size_t i = 0; i < c.specs.size(); ++i) {
    Tensor gi = instance.values.at(t.grads[skip + i]);
    if (c.grad_sums.size() <= i) c.grad_sums.push_back(m == 1 ? gi : zeros_like(gi) + gi);  // as the scan: 0 + g
    else c.grad_sums[i] = c.grad_sums[i] + gi;
  }
  b.set_scope(action_scope);
  instance = {};  // the microbatch is done
}

}  // namespace

Program pipeline_step_program(const nn::ModelConfig& model, const StepShape& shape, const OptimizerConfig& o,
                              const parallel::Schedule& schedule, int64_t rank, rematerialize::Decider* decider) {
  const parallel::PipelineShape& ps = schedule.shape;
  const int64_t p = ps.stages, m = ps.microbatches;
  CHECK(shape.accumulation == m, "pipeline step: {} microbatches in the batch for a schedule of {}", shape.accumulation, m);
  ASSERT(rank >= 0 && rank < p);
  rematerialize::Decider local;
  Program prog;
  Graph& g = prog.graph;
  g.name = fmt::format("pipeline_step_stage{}", rank);
  Builder b(g);
  std::vector<Chunk> chunks;
  std::vector<Declared> declared;
  for (const nn::StagePart& part : pipeline_parts(model, ps, rank)) {
    Chunk c{part, parallel::splits_backward(schedule.kind), nn::stage_param_specs(model, part), declared.size(), {}, {}, {}, {}, {}, {}, {}};
    for (const nn::ParamSpec& s : c.specs) declared.push_back({pipeline_arg_name(s, part), s.type});
    c.in.resize(static_cast<size_t>(m)), c.out = c.dout = c.din = c.in;
    c.instances.resize(static_cast<size_t>(m));
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
        // The explanation records the decisions of each chunk, made once when it is traced.
        forward_action(b, model, c, mb, params_of(c), x, targets, scale, loss_sum, decider ? *decider : local);
        break;
      }
      case parallel::Step::backward:
      case parallel::Step::weight:
        backward_action(b, c, a, m);
        break;
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
  fold_widening_converts(g);
  sink_converts_into_scans(g);
  dce(g);
  return prog;
}

namespace {
// The FLOPs of `part`'s layers (no embedding, no head): forward, and backward with its recomputes, of which
// `weight` in W where the backward is `split` (autodiff::split_backward).
parallel::Costs layer_costs(const nn::ModelConfig& model, nn::StagePart part, int64_t batch, int64_t seq, bool split) {
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
  rematerialize::Decider decider;
  std::vector<ValueId> weights(wrt.begin() + 1, wrt.end());
  const std::vector<ValueId> grads = autodiff::vjp(g, std::span(&seed, 1), wrt, &decider, weights);
  const std::vector<bool> input_part =
      split ? autodiff::split_backward(g, forward_nodes, grads[0]) : std::vector<bool>(g.nodes.size(), true);
  parallel::Costs c{0, 0, 0};
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const double f = ir::flops(g, g.nodes[i]);
    (i < forward_nodes ? c.forward : c.backward) += f;
    if (i >= forward_nodes && !input_part[i]) c.weight += f;
  }
  return c;
}
}  // namespace

std::vector<parallel::Costs> stage_costs(const nn::ModelConfig& model, const parallel::Schedule& schedule,
                                         int64_t batch, int64_t seq) {
  const parallel::PipelineShape& shape = schedule.shape;
  std::vector<parallel::Costs> costs(static_cast<size_t>(shape.virtual_stages()));
  std::map<std::string, parallel::Costs> of_policy;  // stages differ only in their policy
  for (int64_t rank = 0; rank < shape.stages; ++rank) {
    const std::vector<nn::StagePart> parts = pipeline_parts(model, shape, rank);
    for (size_t j = 0; j < parts.size(); ++j) {
      const std::string& policy = nn::stage_remat_policy(model, parts[j]).written;
      if (!of_policy.count(policy)) of_policy[policy] = layer_costs(model, parts[j], batch, seq, parallel::splits_backward(schedule.kind));
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

}  // namespace remat::train
