#include "nn/model.h"

#include "nn/checkpoint_names.h"
#include "nn/layer.h"
#include "nn/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

namespace remat::nn {

using namespace ir;
namespace tp = tensor_parallel;

// The layer's parts, named in nn/layer.h where decoding (nn/decode.cpp) reuses them; internal to nn/.
namespace detail {

constexpr DType kF32 = DType::f32;

std::vector<LayerParam> layer_params(const ModelConfig& c) {
  std::vector<LayerParam> p = {{"pre_self_attention_norm", &LayerWeights::attn_norm}};
  if (c.fused_qkv) {
    p.push_back({"qkv_proj", &LayerWeights::qkv});
  } else {
    p.insert(p.end(), {{"query", &LayerWeights::query}, {"key", &LayerWeights::key}, {"value", &LayerWeights::value}});
  }
  p.insert(p.end(), {{"out", &LayerWeights::out}, {"post_self_attention_norm", &LayerWeights::mlp_norm}});
  if (c.fused_mlp) {
    p.push_back({"wi", &LayerWeights::wi});
  } else {
    p.insert(p.end(), {{"wi_0", &LayerWeights::wi0}, {"wi_1", &LayerWeights::wi1}});
  }
  p.push_back({"wo", &LayerWeights::wo});
  return p;
}

// The dtype activations and matmuls run in.
DType compute_dtype(const ModelConfig& c) { return c.precision.compute; }

// RMSNorm (the rms_norm op: statistics and scale in f32, f64 for f64 activations), returned in the compute dtype.
Tensor rms_norm(const ModelConfig& c, Tensor input, Tensor scale) {
  return ir::rms_norm(input, scale, c.rms_eps, compute_dtype(c));
}

LayerConsts layer_consts(Builder& b, const ModelConfig& c, int64_t seq) {
  LayerConsts k;
  {
    auto s = b.scope("decoder/rope");
    const int64_t half = c.head_dim / 2;
    // angle[p, i] = p * theta^(-2i/Dh) for i < Dh/2: pair (i, i + Dh/2) of a head at position p turns by it.
    Tensor pos = convert(iota(b, DType::i32, {seq, half}, 0), kF32);
    Tensor i = convert(iota(b, DType::i32, {seq, half}, 1), kF32);
    Tensor inv_freq = exp(i * (-2.0 * std::log(c.rope_theta) / static_cast<double>(c.head_dim)));
    Tensor angle = pos * inv_freq;
    k.cos = convert(cos(angle), compute_dtype(c));
    k.sin = convert(sin(angle), compute_dtype(c));
  }
  auto s = b.scope("decoder/causal_mask");
  Tensor query_pos = iota(b, DType::i32, {seq, seq}, 0);
  Tensor key_pos = iota(b, DType::i32, {seq, seq}, 1);
  k.mask = compare(key_pos, query_pos, "le");
  return k;
}

// [B,T,KV,Dh] -> [B,T,H,Dh]: query head j reads kv head j / (H / KV).
Tensor repeat_kv(Tensor x, int64_t heads) {
  const Shape& s = x.shape();
  if (s[2] == heads) return x;
  Tensor wide = broadcast_in_dim(x, {s[0], s[1], s[2], heads / s[2], s[3]}, {0, 1, 2, 4});
  return reshape(wide, {s[0], s[1], heads, s[3]});
}

// [B,T,D] . [D, ...] -> [B,T, ...] in the compute dtype (operands not yet in it are cast here).
Tensor project(const ModelConfig& c, Tensor h, Tensor kernel) {
  const DType d = compute_dtype(c);
  return dot_general(convert(h, d), convert(kernel, d), DotDims{{2}, {0}, {}, {}});
}

// Names x as `name` is spelled under the model's naming; a tensor with no name under it stays unnamed.
Tensor named(Tensor x, const names::Name& name, names::Naming naming) {
  const std::string_view spelled = names::spelled(name, naming);
  return spelled.empty() ? x : checkpoint_name(x, std::string(spelled));
}

Tensor attention(Builder& b, const ModelConfig& c, Tensor h, const LayerWeights& w, const LayerConsts& k) {
  auto s = b.scope("self_attention");
  Tensor q, key, v;
  if (c.fused_qkv) {  // one matmul for q, k and v, named before the split (MaxText's qkv_proj)
    auto s2 = b.scope("qkv_proj");
    Tensor qkv = named(project(c, h, w.qkv), names::kQkvProj, c.checkpoint_naming);
    const Shape d = qkv.shape();  // [B, T, H + 2KV, Dh]
    const int64_t H = c.num_heads, KV = c.num_kv_heads;
    q = rope(slice(qkv, {0, 0, 0, 0}, {d[0], d[1], H, d[3]}), k.cos, k.sin);
    key = rope(slice(qkv, {0, 0, H, 0}, {d[0], d[1], H + KV, d[3]}), k.cos, k.sin);
    v = slice(qkv, {0, 0, H + KV, 0}, {d[0], d[1], H + 2 * KV, d[3]});
  } else {
    {
      auto s2 = b.scope("query");
      q = named(rope(project(c, h, w.query), k.cos, k.sin), names::kQueryProj, c.checkpoint_naming);
    }
    {
      auto s2 = b.scope("key");
      key = named(rope(project(c, h, tp::kv_kernel(b, c, w.key)), k.cos, k.sin), names::kKeyProj,
                  c.checkpoint_naming);
    }
    {
      auto s2 = b.scope("value");
      v = named(project(c, h, tp::kv_kernel(b, c, w.value)), names::kValueProj, c.checkpoint_naming);
    }
  }
  if (k.cache) std::tie(key, v) = k.cache->append(key, v);  // decoding: attend over the whole cache
  Tensor context;
  if (c.flash_attention) {  // one op, f32 inside whatever float32_qk_product and float32_logits say
    auto s2 = b.scope("attention");
    const auto [out, lse] = ir::attention(q, key, v, true, 1.0 / std::sqrt(double(c.head_dim)));
    // The log-sum-exp is the context's companion residual ([B,H,T], small): it carries the same name, so a policy
    // that saves the context saves both, and the backward does not run the attention again.
    named(lse, names::kContext, c.checkpoint_naming);
    context = named(out, names::kContext, c.checkpoint_naming);
  } else {
    auto s2 = b.scope("attention");
    Tensor kk = repeat_kv(key, q.dim(2)), vv = repeat_kv(v, q.dim(2));  // this rank's query heads
    // scores[b,h,s,t] = q[b,s,h,:] . k[b,t,h,:] / sqrt(Dh). As in MaxText, float32_qk_product casts q and k
    // up before the dot and float32_logits casts the scores up after it (never down): the softmax reads f32
    // scores when either is on (it computes in f32 either way).
    const DType qk = c.float32_qk_product ? kF32 : compute_dtype(c);
    Tensor scores = dot_general(convert(q, qk), convert(kk, qk), DotDims{{3}, {3}, {0, 2}, {0, 2}});
    if (c.float32_logits) scores = convert(scores, kF32);
    // softmax(select(mask, scores / sqrt(Dh), −inf)) as one op (Megatron's scaled masked softmax): computed in f32
    // (f64), rounded once to the matmul's dtype; its VJP reads the raw scores again
    Tensor probs = masked_softmax(scores, k.mask, 1.0 / std::sqrt(double(c.head_dim)), compute_dtype(c));
    // ctx[b,h,s,:] = sum_t probs[b,h,s,t] v[b,t,h,:], then [B,T,H,Dh]
    Tensor ctx = dot_general(probs, vv, DotDims{{3}, {1}, {0, 1}, {0, 2}});
    context = named(transpose(ctx, {0, 2, 1, 3}), names::kContext, c.checkpoint_naming);
  }
  auto s2 = b.scope("out");
  return dot_general(context, w.out, DotDims{{2, 3}, {0, 1}, {}, {}});
}

Tensor mlp(Builder& b, const ModelConfig& c, Tensor h, const LayerWeights& w) {
  auto s = b.scope("mlp");
  Tensor gate, up;
  if (c.fused_mlp) {  // gate and up as one matmul against [D, 2, F], named before the split (MaxText's mlpwi)
    auto s2 = b.scope("wi");
    Tensor wi = named(project(c, h, w.wi), names::kMlpWi, c.checkpoint_naming);
    const Shape d = wi.shape();  // [B, T, 2, F]
    gate = reshape(slice(wi, {0, 0, 0, 0}, {d[0], d[1], 1, d[3]}), {d[0], d[1], d[3]});
    up = reshape(slice(wi, {0, 0, 1, 0}, {d[0], d[1], 2, d[3]}), {d[0], d[1], d[3]});
  } else {
    {
      auto s2 = b.scope("wi_0");
      gate = named(project(c, h, w.wi0), names::kMlpWi0, c.checkpoint_naming);
    }
    {
      auto s2 = b.scope("wi_1");
      up = named(project(c, h, w.wi1), names::kMlpWi1, c.checkpoint_naming);
    }
  }
  auto s2 = b.scope("wo");
  return project(c, swiglu(gate, up), w.wo);  // silu(gate)·up as one op: its VJP keeps no silu array
}

// The weights matmuls read in the compute dtype; the RMSNorm scales stay as they are (used in f32).
std::vector<Tensor*> kernels(LayerWeights& w) {
  std::vector<Tensor*> k;
  for (Tensor* t : {&w.query, &w.key, &w.value, &w.qkv, &w.out, &w.wi0, &w.wi1, &w.wi, &w.wo})
    if (t->b != nullptr) k.push_back(t);  // present under this config's fusions
  return k;
}

// The layer's compute copy of its kernels (jmp's cast_to_compute on one layer's parameters), made as two
// allocations, each right before its first matmul and freed after its last: the query, key and value
// projections', and the rest (the output projection's and the MLP's). Under a scan only one layer's copies are
// ever live; in the forward the first dies before the MLP, and in a backward that keeps the attention's
// context the first is made only after the MLP's backward. Kernels already in the compute dtype (f32 runs,
// mp_cast=upfront) are used as they are.
LayerWeights cast_to_compute(const ModelConfig& c, LayerWeights w) {
  const DType d = compute_dtype(c);
  const std::vector<Tensor*> attention_inputs = {&w.query, &w.key, &w.value, &w.qkv};
  std::vector<Tensor*> groups[2];  // kernels(w) split: the query, key and value kernels, then the rest
  for (Tensor* k : kernels(w))
    if (k->dtype() != d) groups[std::ranges::count(attention_inputs, k) > 0 ? 0 : 1].push_back(k);
  for (const std::vector<Tensor*>& cast : groups) {
    if (cast.empty()) continue;
    std::vector<Tensor> from;
    for (Tensor* k : cast) from.push_back(*k);
    std::vector<Tensor> to = convert_group(from, d);
    for (size_t i = 0; i < cast.size(); ++i) *cast[i] = to[i];
  }
  return w;
}

// FSDP: the whole of a parameter (or of a layer's slice of one) from this device's shard along `dim`, in
// `to` when given: the cast comes before the gather, so the compute dtype is what goes on the wire and what
// the gathered buffer holds. Unsharded: the parameter itself (converted).
Tensor gathered(const ModelConfig& c, Tensor shard, int64_t dim, int64_t shards, std::optional<DType> to) {
  if (shards == 1) return to ? convert(shard, *to) : shard;
  return all_gather(shard, c.mesh.batch_group(), c.mesh.batch_ranks(), dim, shards, to);
}

// FSDP: a layer's whole weights from its shards, the kernels cast to the compute dtype before the gather
// (under mp_cast=upfront they already are), the norm scales as they are. Gathered where the layer starts:
// under a scan (or a remat region) one layer's are live at a time, and being weight-derived they are
// recomputed by the backward, never saved. Unrolled layers without remat keep every layer's gathered weights
// until its backward, as plain autodiff keeps any residual: FSDP wants scan_layers or a remat policy.
LayerWeights gather_layer(Builder& b, const ModelConfig& c, LayerWeights w) {
  auto s = b.scope("fsdp_gather");
  const std::vector<ParamSpec> specs = param_specs(c);
  const std::span<const ParamSpec> layer_specs = param_layout(c).layers_of(std::span<const ParamSpec>(specs));
  const std::vector<LayerParam> params = layer_params(c);
  const std::vector<Tensor*> matmul = kernels(w);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& spec = layer_specs[i];  // a layer's slice drops the layers dimension
    Tensor& t = w.*params[i].field;
    const bool kernel = std::find(matmul.begin(), matmul.end(), &t) != matmul.end();
    t = gathered(c, t, spec.shard_dim - 1, spec.shards, kernel ? std::optional<DType>(compute_dtype(c)) : std::nullopt);
  }
  return w;
}

// Under tensor parallelism each block enters and leaves through tensor_parallel.h, the norms and residual adds
// running on what lies between the blocks (under sequence parallelism, the rank's slice of the sequence).
Tensor decoder_layer(Builder& b, const ModelConfig& c, Tensor x, const LayerWeights& weights, const LayerConsts& k) {
  x = named(x, names::kDecoderLayerInput, c.checkpoint_naming);
  const bool sharded = c.mesh.size("fsdp") > 1;
  const LayerWeights whole = sharded ? gather_layer(b, c, weights) : weights;
  Tensor h;
  {
    auto s = b.scope("pre_self_attention_norm");
    h = rms_norm(c, x, tp::whole_param(c, whole.attn_norm));
  }
  const LayerWeights w = sharded ? whole : cast_to_compute(c, weights);
  // out_proj and mlpwo name a block's output as the layer adds it: under tensor parallelism the sum over the
  // ranks (the rank's slice of it under sequence parallelism), as JAX names the logical value, so a policy
  // that saves them keeps the reduced value and recomputation never runs that collective again.
  const Tensor attention_out = named(tp::leave(c, attention(b, c, tp::enter(c, h), w, k)), names::kOutProj, c.checkpoint_naming);
  x = named(x + attention_out, names::kAttentionResidual, c.checkpoint_naming);
  {
    auto s = b.scope("post_self_attention_norm");
    h = rms_norm(c, x, tp::whole_param(c, w.mlp_norm));
  }
  const Tensor mlp_out = named(tp::leave(c, mlp(b, c, tp::enter(c, h), w)), names::kMlpWo, c.checkpoint_naming);
  return named(x + mlp_out, names::kMlpResidual, c.checkpoint_naming);
}

LayerWeights layer_weights(const ModelConfig& c, std::span<const Tensor> w) {
  LayerWeights lw;
  const std::vector<LayerParam> names = layer_params(c);
  ASSERT(w.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) lw.*names[i].field = w[i];
  return lw;
}

std::vector<Tensor> layer_tensors(const ModelConfig& c, const LayerWeights& lw) {
  std::vector<Tensor> w;
  for (const LayerParam& p : layer_params(c)) w.push_back(lw.*p.field);
  return w;
}

// Layer l's slice of a stacked [L, ...] parameter.
Tensor layer_slice(Tensor stacked, int64_t l) {
  Shape s = stacked.shape();
  IntList start(s.size(), 0), limit = s;
  start[0] = l;
  limit[0] = l + 1;
  Shape per_layer(s.begin() + 1, s.end());
  return reshape(slice(stacked, start, limit), per_layer);
}

// The names of a layer's (or group's) remat region inputs: x, the layer weights, the 3 tables.
std::vector<std::string> region_inputs(const ModelConfig& c) {
  std::vector<std::string> names{"x"};
  for (const LayerParam& p : layer_params(c)) names.push_back(p.name);
  names.insert(names.end(), {"rope_cos", "rope_sin", "causal_mask"});
  return names;
}

// Whether each layer (and group) is a remat region: not under remat_policy none.
bool remat_regions(const ModelConfig& c) {
  CHECK(c.remat_policy.kind != rematerialize::Policy::Kind::automatic,
        "remat_policy=auto reached the model: the policy search (remat plan, explain or train) picks the placement "
        "before the model is traced; give a policy, or run a remat command");
  return c.remat_policy.kind != rematerialize::Policy::Kind::none;
}

// One layer, inside a remat region unless the policy is none.
Tensor checkpointed_layer(Builder& b, const ModelConfig& c, Tensor x, std::span<const Tensor> w, const LayerConsts& k) {
  if (!remat_regions(c)) return decoder_layer(b, c, x, layer_weights(c, w), k);
  std::vector<Tensor> in{x};
  in.insert(in.end(), w.begin(), w.end());
  in.insert(in.end(), {k.cos, k.sin, k.mask});
  const size_t nw = w.size();
  auto body = [&](Builder& rb, std::span<const Tensor> a) {
    LayerConsts kb{a[1 + nw], a[2 + nw], a[3 + nw]};
    return std::vector<Tensor>{decoder_layer(rb, c, a[0], layer_weights(c, a.subspan(1, nw)), kb)};
  };
  const std::vector<std::string> names = region_inputs(c);
  return checkpoint(b, in, body, rematerialize::policy_attr(c.remat_policy), "decoder_layer", names)[0];
}

// A scan over stacked layers [n, ...]: carry x, consts the tables.
Tensor scan_layers(Builder& b, const ModelConfig& c, Tensor x, std::span<const Tensor> stacked, const LayerConsts& k,
                   const char* name) {
  auto body = [&](Builder& bb, std::span<const Tensor> consts, std::span<const Tensor> carry,
                  std::span<const Tensor> ws) {
    LayerConsts kb{consts[0], consts[1], consts[2]};
    return std::vector<Tensor>{checkpointed_layer(bb, c, carry[0], ws, kb)};
  };
  return scan(b, stacked[0].dim(0), std::array{k.cos, k.sin, k.mask}, std::array{x}, stacked, body, name)[0];
}

// The double scan: groups of layers_per_group layers; each group is a remat region (group_remat_policy) around
// a scan of the layers' regions (remat_policy).
Tensor scan_groups(Builder& b, const ModelConfig& c, Tensor x, std::span<const Tensor> stacked, const LayerConsts& k) {
  const int64_t per = c.layers_per_group, groups = c.num_decoder_layers / per;
  std::vector<Tensor> grouped;
  for (Tensor t : stacked) {
    Shape s = t.shape();
    s[0] = per;
    s.insert(s.begin(), groups);
    grouped.push_back(reshape(t, s));
  }
  auto body = [&](Builder& gb, std::span<const Tensor> consts, std::span<const Tensor> carry,
                  std::span<const Tensor> ws) {
    std::vector<Tensor> in{carry[0]};
    in.insert(in.end(), ws.begin(), ws.end());
    in.insert(in.end(), consts.begin(), consts.end());
    const size_t nw = ws.size();
    auto group = [&](Builder& rb, std::span<const Tensor> a) {
      LayerConsts kb{a[1 + nw], a[2 + nw], a[3 + nw]};
      return std::vector<Tensor>{scan_layers(rb, c, a[0], a.subspan(1, nw), kb, "decoder_layer")};
    };
    if (!remat_regions(c)) return group(gb, in);
    const std::vector<std::string> names = region_inputs(c);
    return checkpoint(gb, in, group, rematerialize::policy_attr(c.group_remat_policy), "layer_group", names);
  };
  return scan(b, groups, std::array{k.cos, k.sin, k.mask}, std::array{x}, grouped, body, "layer_group")[0];
}

Tensor decoder_layers(Builder& b, const ModelConfig& c, Tensor x, std::span<const Tensor> stacked, const LayerConsts& k) {
  auto s = b.scope("decoder/layers");
  if (c.scan_layers && c.layers_per_group > 0) return scan_groups(b, c, x, stacked, k);
  if (c.scan_layers) return scan_layers(b, c, x, stacked, k, "decoder_layer");
  for (int64_t l = 0; l < c.num_decoder_layers; ++l) {
    std::vector<Tensor> w;
    for (Tensor t : stacked) w.push_back(layer_slice(t, l));
    x = checkpointed_layer(b, c, x, w, k);
  }
  return x;
}

// The parts of the model a stage may hold, each traced from its parameters (gathered where sharded).
Tensor whole_param(const ModelConfig& c, Tensor p, const ParamSpec& spec, std::optional<DType> to) {
  return gathered(c, p, spec.shard_dim, spec.shards, to);
}

Tensor embed(Builder& b, const ModelConfig& c, Tensor table, const ParamSpec& spec, Tensor inputs) {
  CHECK(inputs.rank() == 2 && inputs.dtype() == DType::i32, "model inputs must be i32[batch, seq], got {}",
        type_str(inputs.type()));
  auto s = b.scope("token_embedder");
  // The table in its own dtype (sharded, gathered so): the rows' gradient accumulates in it, as unsharded.
  table = whole_param(c, table, spec, std::nullopt);
  if (tp::degree(c) > 1) return tp::embed(b, c, table, inputs, compute_dtype(c));
  return convert(gather(table, inputs), compute_dtype(c));
}

// `c.num_decoder_layers` layers over the stacked weights.
Tensor layers(Builder& b, const ModelConfig& c, Tensor x, std::vector<Tensor> stacked) {
  // The tables cover the whole sequence, which attention reads (x holds 1/t of it under sequence parallelism).
  LayerConsts k = layer_consts(b, c, x.dim(1) * (c.sequence_parallel ? tp::degree(c) : 1));
  if (c.cast_upfront) {  // every layer's kernels in the compute dtype before the layer loop (all L live)
    auto s = b.scope("decoder/cast_upfront");
    LayerWeights all = layer_weights(c, stacked);
    for (Tensor* w : kernels(all)) *w = convert(*w, compute_dtype(c));
    stacked = layer_tensors(c, all);
  }
  return decoder_layers(b, c, x, stacked, k);
}

// The final norm of the hidden states, as the output projection reads them (tensor_parallel::enter).
Tensor final_norm(Builder& b, const ModelConfig& c, Tensor x, Tensor norm, const ParamSpec& norm_spec) {
  auto s = b.scope("decoder/decoder_norm");
  return tp::enter(c, rms_norm(c, x, tp::whole_param(c, whole_param(c, norm, norm_spec, std::nullopt))));
}

// The output projection's matmul dtype: the compute dtype, or f32 with logits_dot_in_fp32.
DType logits_dot(const ModelConfig& c) { return c.logits_dot_in_fp32 ? kF32 : compute_dtype(c); }

// Logits [..., V] from hidden states [..., D], as the matmul gives them (in logits_dot): the loss reads them in f32
// without an f32 copy (target_log_prob), the callers that return them cast them up. `out` is the output kernel
// [D,V], or the embedding [V,D] when tied.
Tensor logits_of(const ModelConfig& c, Tensor x, Tensor out) {
  const DType dot = logits_dot(c);
  const int64_t d = x.rank() - 1;
  return dot_general(convert(x, dot), convert(out, dot), DotDims{{d}, {c.logits_via_embedding ? 1 : 0}, {}, {}});
}

// The final norm and the logits [B,T,V] in logits_dot (this rank's [B,T,V/t] under tensor parallelism): the loss's.
Tensor head_logits(Builder& b, const ModelConfig& c, Tensor x, Tensor norm, const ParamSpec& norm_spec, Tensor out,
                   const ParamSpec& out_spec) {
  x = final_norm(b, c, x, norm, norm_spec);
  auto s = b.scope("decoder/logits_dense");
  return logits_of(c, x, whole_param(c, out, out_spec, logits_dot(c)));
}

Tensor head(Builder& b, const ModelConfig& c, Tensor x, Tensor norm, const ParamSpec& norm_spec, Tensor out,
            const ParamSpec& out_spec) {
  Tensor logits = head_logits(b, c, x, norm, norm_spec, out, out_spec);
  auto s = b.scope("decoder/logits_dense");
  return convert(logits, kF32);
}

// The embedding and the layers: the hidden states [B,T,D] before the final norm.
Tensor trunk(Builder& b, const ModelConfig& c, std::span<const Tensor> p, std::span<const ParamSpec> specs,
             Tensor inputs) {
  const ParamLayout at = param_layout(c);
  Tensor x = embed(b, c, p[*at.embedding], specs[*at.embedding], inputs);
  const std::span<const Tensor> stacked = at.layers_of(p);
  return layers(b, c, x, std::vector<Tensor>(stacked.begin(), stacked.end()));
}

Tensor trace_logits(Builder& b, const ModelConfig& c, std::span<const Tensor> p, Tensor inputs) {
  const std::vector<ParamSpec> specs = param_specs(c);
  const ParamLayout at = param_layout(c);
  return tp::gather_logits(c, head(b, c, trunk(b, c, p, specs, inputs), p[*at.norm], specs[*at.norm], p[*at.out], specs[*at.out]));
}

// The head and the loss: untiled, the logits [B,T,V] and their mean cross-entropy; else tiled_cross_entropy.
Tensor head_loss(Builder& b, const ModelConfig& c, Tensor x, Tensor norm, const ParamSpec& norm_spec, Tensor out,
                 const ParamSpec& out_spec, Tensor targets) {
  if (c.num_vocab_tiling == 1) return cross_entropy(b, c, head_logits(b, c, x, norm, norm_spec, out, out_spec), targets);
  x = final_norm(b, c, x, norm, norm_spec);
  const std::optional<DType> accumulate = out.dtype() == DType::f64 ? std::nullopt : std::optional(kF32);
  return tiled_cross_entropy(b, c, x, whole_param(c, out, out_spec, accumulate), targets);
}

std::vector<Tensor> declare_params(Builder& b, const ModelConfig& c) {
  std::vector<Tensor> p;
  for (const ParamSpec& s : param_specs(c)) p.push_back(b.param(s.path, s.type));
  return p;
}

}  // namespace detail

using namespace detail;

Tensor trace_loss(Builder& b, const ModelConfig& c, std::span<const Tensor> params, Tensor inputs, Tensor targets,
                  Tensor* logits_out) {
  if (!logits_out) {
      const std::vector<ParamSpec> specs = param_specs(c);
    const ParamLayout at = param_layout(c);
    Tensor x = trunk(b, c, params, specs, inputs);
    return head_loss(b, c, x, params[*at.norm], specs[*at.norm], params[*at.out], specs[*at.out], targets);
  }
  *logits_out = trace_logits(b, c, params, inputs);  // the caller wants the logits: untiled, whole
  ModelConfig whole = c;
  whole.mesh = {};  // the loss of the whole logits, as one device computes it
  whole.sequence_parallel = false;
  return cross_entropy(b, whole, *logits_out, targets);
}

ir::Type stage_activation(const ModelConfig& c, int64_t batch, int64_t seq) {
  return {c.precision.compute, {batch, c.sequence_parallel ? seq / tp::degree(c) : seq, c.emb_dim}};
}

const rematerialize::Policy& stage_remat_policy(const ModelConfig& c, const StagePart& part) {
  if (c.stage_remat_policies.empty()) return c.remat_policy;
  ASSERT(part.num_layers > 0 && part.first_layer % part.num_layers == 0);
  const size_t k = static_cast<size_t>(part.first_layer / part.num_layers);
  return c.stage_remat_policies[k % c.stage_remat_policies.size()];
}

Tensor trace_stage(Builder& b, const ModelConfig& c, const StagePart& part, std::span<const Tensor> params, Tensor in,
                   std::optional<Tensor> targets) {
  const std::vector<ParamSpec> specs = stage_param_specs(c, part);
  ASSERT(params.size() == specs.size() && (part.head || !targets));
  const ParamLayout at = param_layout(c, part);
  Tensor x = at.embedding ? embed(b, c, params[*at.embedding], specs[*at.embedding], in) : in;
  ModelConfig stage = c;
  stage.num_decoder_layers = part.num_layers;
  stage.remat_policy = stage_remat_policy(c, part);
  const std::span<const Tensor> stacked = at.layers_of(params);
  x = layers(b, stage, x, std::vector<Tensor>(stacked.begin(), stacked.end()));
  if (!part.head) return x;
  const size_t norm = *at.norm, out = *at.out;
  if (!targets) return tp::gather_logits(c, head(b, c, x, params[norm], specs[norm], params[out], specs[out]));
  return head_loss(b, c, x, params[norm], specs[norm], params[out], specs[out], *targets);
}

Graph loss_graph(const ModelConfig& c, int64_t batch, int64_t seq, LossResults results) {
  const bool with_logits = results == LossResults::loss_and_logits;
  Graph g;
  g.name = "loss";
  Builder b(g);
  std::vector<Tensor> p = declare_params(b, c);
  Tensor inputs = b.param("inputs", {DType::i32, {batch, seq}});
  Tensor targets = b.param("targets", {DType::i32, {batch, seq}});
  Tensor logits;
  b.result(trace_loss(b, c, p, inputs, targets, with_logits ? &logits : nullptr));
  if (with_logits) b.result(logits);
  return g;
}

Graph logits_graph(const ModelConfig& c, int64_t batch, int64_t seq) {
  Graph g;
  g.name = "logits";
  Builder b(g);
  std::vector<Tensor> p = declare_params(b, c);
  b.result(trace_logits(b, c, p, b.param("inputs", {DType::i32, {batch, seq}})));
  return g;
}

}  // namespace remat::nn
