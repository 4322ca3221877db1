// Generation with a KV cache: the prefill and one-token decode graphs (model.h), traced with the training
// layer itself (layer.h's decoder_layer), its attention reading the cache through LayerConsts::cache.
#include "nn/model.h"

#include "nn/layer.h"

namespace remat::nn {

using namespace ir;

namespace detail {

std::pair<Tensor, Tensor> KvCache::append(Tensor new_key, Tensor new_value) {
  Builder& b = *new_key.b;
  const Tensor zero = scalar(b, DType::i32, 0);
  const std::array<Tensor, 4> at{zero, position, zero, zero};  // [B, S, KV, Dh]: at the token's position
  key = dynamic_update_slice(key, new_key, at);
  value = dynamic_update_slice(value, new_value, at);
  return {key, value};
}

}  // namespace detail

namespace {

using namespace detail;

// The model as decoding traces it (model.h: one device, scanned layers, dot-product attention).
ModelConfig decoding(const ModelConfig& c) {
  CHECK(c.mesh.size("fsdp") == 1 && c.mesh.size("tensor") == 1,
        "generation with a KV cache runs the whole model on one device: set ici/dcn_fsdp_parallelism=1 and "
        "ici/dcn_tensor[_sequence]_parallelism=1 (got fsdp {}, tensor {})",
        c.mesh.size("fsdp"), c.mesh.size("tensor"));
  ModelConfig d = c;
  d.scan_layers = true;
  d.layers_per_group = 0;
  d.flash_attention = false;  // the flash op attends causally over its own T keys, not over a cache
  d.sequence_parallel = false;
  return d;
}

Type cache_type(const ModelConfig& c, int64_t batch, int64_t max_length) {
  return {c.precision.compute, {c.num_decoder_layers, batch, max_length, c.num_kv_heads, c.head_dim}};
}

struct Step {
  Tensor logits, key, value;  // [B,V]; the stacked caches [L,B,S,KV,Dh]
};

// The T tokens `inputs` [B,T] at positions position..position+T-1: the last one's logits and the caches
// with their keys and values written in. `key`, `value`: the caches so far (null: all zeros, the prefill).
Step trace_step(Builder& b, const ModelConfig& c, std::span<const Tensor> p, Tensor inputs, Tensor position,
                int64_t max_length, Tensor key, Tensor value) {
  const std::vector<ParamSpec> specs = param_specs(c);
  const ParamLayout at = param_layout(c);
  const int64_t batch = inputs.dim(0), T = inputs.dim(1), S = max_length;
  Tensor x = embed(b, c, p[*at.embedding], specs[*at.embedding], inputs);
  LayerConsts tables = layer_consts(b, c, S);  // RoPE of every cache position (its causal mask goes unused)
  LayerConsts k;
  {
    auto s = b.scope("decoder/rope");
    const Tensor zero = scalar(b, DType::i32, 0);
    k.cos = dynamic_slice(tables.cos, std::array{position, zero}, {T, c.head_dim / 2});
    k.sin = dynamic_slice(tables.sin, std::array{position, zero}, {T, c.head_dim / 2});
  }
  {
    auto s = b.scope("decoder/cache_mask");  // query i (at position + i) sees cache positions 0..position + i
    Tensor query_pos = iota(b, DType::i32, {T, S}, 0) + broadcast_in_dim(position, {T, S}, {});
    k.mask = compare(iota(b, DType::i32, {T, S}, 1), query_pos, "le");
  }
  const std::span<const Tensor> stacked = at.layers_of(p);
  std::vector<Tensor> xs(stacked.begin(), stacked.end());
  const size_t nw = xs.size();
  const bool prefill = key.b == nullptr;
  if (!prefill) xs.insert(xs.end(), {key, value});
  const Type layer_cache = {c.precision.compute, {batch, S, c.num_kv_heads, c.head_dim}};
  auto body = [&](Builder& lb, std::span<const Tensor> consts, std::span<const Tensor> carry,
                  std::span<const Tensor> w) {
    KvCache cache{prefill ? full(lb, layer_cache, 0) : w[nw], prefill ? full(lb, layer_cache, 0) : w[nw + 1], consts[3]};
    LayerConsts kb{consts[0], consts[1], consts[2], &cache};
    Tensor y = decoder_layer(lb, c, carry[0], layer_weights(c, w.subspan(0, nw)), kb);
    return std::vector<Tensor>{y, cache.key, cache.value};
  };
  std::vector<Tensor> out;
  {
    auto s = b.scope("decoder/layers");
    out = scan(b, c.num_decoder_layers, std::array{k.cos, k.sin, k.mask, position}, std::array{x}, xs, body,
               "decoder_layer");
  }
  Tensor last = slice(out[0], {0, T - 1, 0}, {batch, T, c.emb_dim});
  Tensor logits = head(b, c, last, p[*at.norm], specs[*at.norm], p[*at.out], specs[*at.out]);
  return {reshape(logits, {batch, c.vocab_size}), out[1], out[2]};
}

void check_lengths(int64_t prompt, int64_t max_length) {
  CHECK(prompt >= 1 && prompt <= max_length, "generation: the prompt's {} tokens must be at least 1 and at most the "
        "cache's {} positions", prompt, max_length);
}

}  // namespace

Graph prefill_graph(const ModelConfig& model, int64_t batch, int64_t prompt, int64_t max_length) {
  check_lengths(prompt, max_length);
  const ModelConfig c = decoding(model);
  Graph g;
  g.name = "prefill";
  Builder b(g);
  std::vector<Tensor> p = declare_params(b, c);
  Tensor inputs = b.param("inputs", {DType::i32, {batch, prompt}});
  const Step s = trace_step(b, c, p, inputs, scalar(b, DType::i32, 0), max_length, {}, {});
  for (Tensor t : {s.logits, s.key, s.value}) b.result(t);
  return g;
}

Graph decode_graph(const ModelConfig& model, int64_t batch, int64_t max_length) {
  check_lengths(1, max_length);
  const ModelConfig c = decoding(model);
  Graph g;
  g.name = "decode";
  Builder b(g);
  std::vector<Tensor> p = declare_params(b, c);
  Tensor inputs = b.param("inputs", {DType::i32, {batch, 1}});
  Tensor position = b.param("position", {DType::i32, {}});
  Tensor key = b.param("cache/key", cache_type(c, batch, max_length));
  Tensor value = b.param("cache/value", cache_type(c, batch, max_length));
  const Step s = trace_step(b, c, p, inputs, position, max_length, key, value);
  for (Tensor t : {s.logits, s.key, s.value}) b.result(t);
  return g;
}

}  // namespace remat::nn
