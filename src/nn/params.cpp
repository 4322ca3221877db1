// The model as data: its config checked (validate), the checkpoint-name spelling its policies are parsed
// with, and its parameters: specs (paths, shapes, logical axes, sharding over the mesh), initialisation (whole
// or one FSDP shard, the same values either way) and the fused projections' layout. The tracing of the model
// that reads them is model.cpp.
#include "nn/model.h"

#include "nn/checkpoint_names.h"
#include "nn/layer.h"

#include <cmath>
#include <cstring>
#include <random>

namespace remat::nn {

using namespace ir;

rematerialize::Spelling policy_spelling(const ModelConfig& c) {
  const names::Vocabulary v = vocabulary(c);
  rematerialize::Spelling s;
  for (const names::Name& n : names::kAll) {
    if (n.maxtext.empty()) continue;
    const std::string maxtext(n.maxtext);
    s.preset[maxtext] = names::preset_name(n.maxtext, v);
    s.custom[maxtext] = names::from_maxtext(n.maxtext, v.naming);
  }
  return s;
}

namespace {
// The config keys whose product is the degree of mesh axis `axis`, for errors.
std::string degree_keys(const ModelConfig& c, const std::string& axis) {
  const std::string a = axis == "tensor" && c.sequence_parallel ? "tensor_sequence" : axis;
  return fmt::format("ici_{}_parallelism x dcn_{}_parallelism", a, a);
}

// Up to eight degrees > 1 that divide `size`, for errors.
std::string divisors(int64_t size) {
  std::vector<int64_t> ok;
  for (int64_t k = 2; k <= size && ok.size() < 8; ++k)
    if (size % k == 0) ok.push_back(k);
  return ok.empty() ? std::string("none") : fmt::format("{}", fmt::join(ok, ", "));
}

// Tensor parallelism splits the heads, the MLP width and the vocabulary; kv heads split, or fewer than t and
// each held whole (t a multiple of them).
void validate_tensor(const ModelConfig& c) {
  const int64_t t = c.mesh.size("tensor");
  CHECK(!c.sequence_parallel || t > 1,
        "sequence parallelism needs a tensor axis: set ici_tensor_sequence_parallelism (or its dcn_ key) > 1");
  if (t == 1) return;
  auto divides = [&](int64_t size, const char* key, const char* what) {
    CHECK(size % t == 0, "{} = {} does not divide config key '{}' ({}), the {} tensor parallelism splits; degrees that "
          "divide it: {}", degree_keys(c, "tensor"), t, key, size, what, divisors(size));
  };
  divides(c.num_heads, "base_num_query_heads", "query heads");
  divides(c.mlp_dim, "base_mlp_dim", "MLP width");
  divides(c.vocab_size, "vocab_size", "vocabulary");
  CHECK(c.num_kv_heads % t == 0 || t % c.num_kv_heads == 0,
        "{} = {} neither divides nor is a multiple of config key 'base_num_kv_heads' ({}): each rank must hold whole kv "
        "heads, or (fewer kv heads than ranks) read one; degrees that work: {} or multiples of {} that divide the "
        "query heads", degree_keys(c, "tensor"), t, c.num_kv_heads, divisors(c.num_kv_heads), c.num_kv_heads);
  CHECK(!c.fused_qkv,
        "fused_qkv=true with tensor parallelism ({} = {}): the fused [D, H+2KV, Dh] kernel does not split into whole "
        "heads per rank; set fused_qkv=false (fused_mlp is fine)", degree_keys(c, "tensor"), t);
}
}  // namespace

void validate(const ModelConfig& c) {
  auto positive = [](int64_t v, const char* key) { CHECK(v > 0, "config key '{}' must be positive, got {}", key, v); };
  positive(c.vocab_size, "vocab_size");
  positive(c.emb_dim, "base_emb_dim");
  positive(c.num_decoder_layers, "base_num_decoder_layers");
  positive(c.num_heads, "base_num_query_heads");
  positive(c.num_kv_heads, "base_num_kv_heads");
  positive(c.head_dim, "head_dim");
  positive(c.mlp_dim, "base_mlp_dim");
  CHECK(c.num_heads % c.num_kv_heads == 0,
        "config key 'base_num_kv_heads' ({}) must divide 'base_num_query_heads' ({}) for grouped-query attention",
        c.num_kv_heads, c.num_heads);
  CHECK(c.head_dim % 2 == 0, "config key 'head_dim' must be even for rotary embeddings, got {}", c.head_dim);
  CHECK(!c.flash_attention || c.head_dim <= 256,
        "config key 'head_dim' is {}: attention=flash supports up to 256 on the CPU; use attention=dot_product",
        c.head_dim);
  positive(c.num_vocab_tiling, "num_vocab_tiling");
  CHECK(c.rope_theta > 1, "config key 'rope_max_timescale' must be > 1, got {}", c.rope_theta);
  CHECK(c.rms_eps > 0, "config key 'normalization_layer_epsilon' must be > 0, got {}", c.rms_eps);
  CHECK(c.layers_per_group >= 0 && (c.layers_per_group == 0 || c.num_decoder_layers % c.layers_per_group == 0),
        "config key 'layers_per_group' ({}) must divide 'base_num_decoder_layers' ({})", c.layers_per_group,
        c.num_decoder_layers);
  CHECK(c.checkpoint_naming == names::Naming::maxtext || !(c.fused_qkv || c.fused_mlp),
        "config keys 'fused_qkv' and 'fused_mlp' are MaxText's fusions, named qkv_proj and mlpwi; AXLearn names its "
        "fused projections after the split, which checkpoint_naming=axlearn does not model: use "
        "checkpoint_naming=maxtext with them");
  CHECK(c.layers_per_group == 0 || c.scan_layers,
        "config key 'layers_per_group' ({}) needs scan_layers=true: groups are a scan of scans", c.layers_per_group);
  validate_tensor(c);
}

ir::Type ParamSpec::whole_type() const {
  ir::Type t = type;
  if (shard_dim >= 0) t.shape[static_cast<size_t>(shard_dim)] *= shards;
  if (tensor_dim >= 0) t.shape[static_cast<size_t>(tensor_dim)] *= tensor_shards;
  return t;
}

bool ParamSpec::stacked() const { return !axes.empty() && axes.front() == "layers"; }

namespace {
// Splits `p` along the logical axes that axis_rules maps to `fsdp` and to `tensor` (the first of each) where
// that mesh axis has several ranks. kv heads fewer than the tensor ranks stay whole (validate_tensor).
void shard(ParamSpec& p, const ModelConfig& c) {
  for (size_t d = 0; d < p.axes.size(); ++d) {
    auto rule = c.axis_rules.find(p.axes[d]);
    if (rule == c.axis_rules.end()) continue;
    const bool fsdp = rule->second == "fsdp";
    ASSERT(fsdp || rule->second == "tensor");
    int64_t& dim = fsdp ? p.shard_dim : p.tensor_dim;
    int64_t& shards = fsdp ? p.shards : p.tensor_shards;
    if (fsdp && p.fsdp_dim < 0) p.fsdp_dim = static_cast<int64_t>(d);
    const int64_t n = c.mesh.size(rule->second), size = p.type.shape[d];
    if (n == 1 || dim >= 0 || (p.axes[d] == "kv_heads" && size < n)) continue;
    CHECK(size % n == 0,
          "parameter {} ({}) cannot be sharded {} ways along its '{}' dimension of {}: the {} parallelism ({}) must "
          "divide it; {} divides it",
          p.path, ir::type_str(p.type), n, p.axes[d], size, rule->second, degree_keys(c, rule->second), divisors(size));
    p.type.shape[d] /= n;
    dim = static_cast<int64_t>(d);
    shards = n;
  }
}
}  // namespace

std::vector<ParamSpec> param_specs(const ModelConfig& c) {
  validate(c);
  const int64_t L = c.num_decoder_layers, D = c.emb_dim, H = c.num_heads, KV = c.num_kv_heads, Dh = c.head_dim,
                F = c.mlp_dim, V = c.vocab_size;
  const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
  const DType pd = c.precision.param;
  using Axes = std::vector<std::string>;
  std::vector<ParamSpec> p;
  auto add = [&](std::string path, Shape s, Axes axes, Init init, double std) {
    p.push_back({std::move(path), Type{pd, std::move(s)}, init, std, std::move(axes)});
  };
  add("token_embedder/embedding", {V, D}, {"vocab", "embed"}, Init::normal, 0.02);
  add("decoder/layers/pre_self_attention_norm/scale", {L, D}, {"layers", "embed"}, Init::ones, 0);
  if (c.fused_qkv) {
    add("decoder/layers/self_attention/qkv_proj/kernel", {L, D, H + 2 * KV, Dh}, {"layers", "embed", "qkv_heads", "kv"},
        Init::normal, 0.02);
  } else {
    add("decoder/layers/self_attention/query/kernel", {L, D, H, Dh}, {"layers", "embed", "heads", "kv"}, Init::normal, 0.02);
    add("decoder/layers/self_attention/key/kernel", {L, D, KV, Dh}, {"layers", "embed", "kv_heads", "kv"}, Init::normal, 0.02);
    add("decoder/layers/self_attention/value/kernel", {L, D, KV, Dh}, {"layers", "embed", "kv_heads", "kv"}, Init::normal, 0.02);
  }
  add("decoder/layers/self_attention/out/kernel", {L, H, Dh, D}, {"layers", "heads", "kv", "embed"}, Init::normal, out_std);
  add("decoder/layers/post_self_attention_norm/scale", {L, D}, {"layers", "embed"}, Init::ones, 0);
  if (c.fused_mlp) {
    add("decoder/layers/mlp/wi/kernel", {L, D, 2, F}, {"layers", "embed", "activations", "mlp"}, Init::normal, 0.02);
  } else {
    add("decoder/layers/mlp/wi_0/kernel", {L, D, F}, {"layers", "embed", "mlp"}, Init::normal, 0.02);
    add("decoder/layers/mlp/wi_1/kernel", {L, D, F}, {"layers", "embed", "mlp"}, Init::normal, 0.02);
  }
  add("decoder/layers/mlp/wo/kernel", {L, F, D}, {"layers", "mlp", "embed"}, Init::normal, out_std);
  add("decoder/decoder_norm/scale", {D}, {"embed"}, Init::ones, 0);
  if (!c.logits_via_embedding) add("decoder/logits_dense/kernel", {D, V}, {"embed", "vocab"}, Init::normal, 0.02);
  for (ParamSpec& s : p) shard(s, c);
  return p;
}

int64_t param_count(const ModelConfig& c) {
  int64_t n = 0;
  for (const ParamSpec& p : param_specs(c)) n += p.whole_type().num_elements();
  return n;
}

std::vector<ParamSpec> stage_param_specs(const ModelConfig& c, const StagePart& part) {
  CHECK(part.num_layers >= 1 && part.first_layer >= 0 && part.first_layer + part.num_layers <= c.num_decoder_layers,
        "a stage of layers [{}, {}) does not fit a model of {} layers", part.first_layer,
        part.first_layer + part.num_layers, c.num_decoder_layers);
  CHECK(!c.logits_via_embedding || (part.embedding == part.head),
        "logits_via_embedding=true ties the output projection to the embedding, which pipeline stages would hold on "
        "two ranks: set logits_via_embedding=false to train with a pipeline");
  const std::vector<ParamSpec> specs = param_specs(c);
  const ParamLayout whole = param_layout(c);
  std::vector<ParamSpec> out;
  if (part.embedding) out.push_back(specs[*whole.embedding]);
  for (ParamSpec s : whole.layers_of(std::span<const ParamSpec>(specs))) {
    s.type.shape[0] = part.num_layers;
    out.push_back(s);
  }
  if (part.head)
    for (size_t i = *whole.norm; i < specs.size(); ++i) out.push_back(specs[i]);
  return out;
}

ParamLayout param_layout(const ModelConfig& c, const StagePart& part) {
  ParamLayout at;
  size_t next = 0;
  if (part.embedding) at.embedding = next++;
  at.first_layer = next;
  at.layers = detail::layer_params(c).size();
  next += at.layers;
  if (part.head) {
    at.norm = next++;
    at.out = c.logits_via_embedding ? at.embedding : std::optional<size_t>(next++);
  }
  return at;
}

ParamLayout param_layout(const ModelConfig& c) {
  return param_layout(c, StagePart{0, c.num_decoder_layers, true, true});
}

namespace {
// The fused kernels and the unfused ones stacked in them along axis 2, in order: qkv_proj [L, D, H | KV | KV,
// Dh] and wi [L, D, 2, F] (wi_0 then wi_1).
const std::vector<std::pair<std::string, std::vector<std::string>>>& fusions() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> f = {
      {"decoder/layers/self_attention/qkv_proj/kernel",
       {"decoder/layers/self_attention/query/kernel", "decoder/layers/self_attention/key/kernel",
        "decoder/layers/self_attention/value/kernel"}},
      {"decoder/layers/mlp/wi/kernel", {"decoder/layers/mlp/wi_0/kernel", "decoder/layers/mlp/wi_1/kernel"}},
  };
  return f;
}

// Where an unfused parameter lives in a (possibly fused) model's parameter list: its index, and for a part of
// a fused kernel, the byte offset of its rows within each row of the leading two dims (-1: the whole array).
struct Place {
  size_t index = 0;
  int64_t row_offset = -1;
};

Place place_of(const std::vector<ParamSpec>& model, const std::vector<ParamSpec>& unfused, const std::string& path) {
  for (size_t i = 0; i < model.size(); ++i)
    if (model[i].path == path) return {i, -1};
  for (const auto& [fused, parts] : fusions()) {
    int64_t offset = 0;
    for (const std::string& part : parts) {
      if (part == path)
        for (size_t i = 0; i < model.size(); ++i)
          if (model[i].path == fused) return {i, offset};
      for (const ParamSpec& u : unfused)
        if (u.path == part) offset += u.type.bytes() / (u.type.shape[0] * u.type.shape[1]);
    }
  }
  CHECK(false, "fuse_params: the model has no place for parameter {}", path);
  return {};
}

// Writes `part` (an unfused array) into its place in `to` (the whole parameter `place` names).
void put(const exec::Array& part, const Place& place, exec::Array& to) {
  if (place.row_offset < 0) {
    std::memcpy(to.bytes(), part.bytes(), static_cast<size_t>(part.type().bytes()));
    return;
  }
  const int64_t outer = to.type().shape[0] * to.type().shape[1];
  const int64_t row = part.type().bytes() / outer, fused_row = to.type().bytes() / outer;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(to.bytes() + o * fused_row + place.row_offset, part.bytes() + o * row, static_cast<size_t>(row));
}

ModelConfig unfused(const ModelConfig& c) {
  ModelConfig u = c;
  u.fused_qkv = u.fused_mlp = false;
  return u;
}

ModelConfig on_one_device(const ModelConfig& c) {
  ModelConfig u = c;
  u.mesh = {};
  u.sequence_parallel = false;
  return u;
}

// Block `index` of `whole`'s `parts` equal blocks along dimension `dim` (`whole` itself when dim < 0).
exec::Array block(const exec::Array& whole, int64_t dim, int64_t parts, int64_t index) {
  if (dim < 0) return whole;
  Type t = whole.type();
  const size_t d = static_cast<size_t>(dim);
  t.shape[d] /= parts;
  exec::Array into(t);
  int64_t outer = 1, inner = dtype_size(t.dtype);
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (i != d) (i < d ? outer : inner) *= t.shape[i];
  const int64_t part = t.shape[d] * inner;  // bytes of the block per outer index
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(into.bytes() + o * part, whole.bytes() + (o * parts + index) * part, static_cast<size_t>(part));
  return into;
}

// Draws every parameter of `c` in order, each into `target(i)` when it is kept whole (an array of its type), or
// else whole into a temporary, and hands the value (this rank's block: tensor block `at.tensor` of FSDP shard
// `at.fsdp`) to `keep(i, value)`.
// The unfused draws, in their order: fused and unfused, sharded and whole runs start alike. A parameter's
// draws are consecutive (a fused kernel's parts one after another); each part of a fused kernel is drawn into a
// temporary of its own size and stacked into place.
void draw_params(const ModelConfig& c, uint64_t seed, ShardIndex at, const std::function<exec::Array*(size_t)>& target,
                 const std::function<void(size_t, const exec::Array&)>& keep) {
  const std::vector<ParamSpec> specs = param_specs(c), whole = param_specs(on_one_device(c)),
                               draws = param_specs(unfused(on_one_device(c)));
  std::mt19937_64 rng(seed);
  size_t next = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& spec = specs[i];
    CHECK(at.fsdp >= 0 && at.tensor >= 0 && (spec.shards == 1 || at.fsdp < spec.shards) &&
              (spec.tensor_shards == 1 || at.tensor < spec.tensor_shards),
          "init_params: {}: no block {} of {} tensor parts of shard {} of {}", spec.path, at.tensor, spec.tensor_shards,
          at.fsdp, spec.shards);
    const bool split = spec.shards > 1 || spec.tensor_shards > 1;
    exec::Array* direct = split ? nullptr : target(i);
    exec::Array value = direct ? *direct : exec::Array(whole[i].type);
    for (; next < draws.size() && place_of(whole, draws, draws[next].path).index == i; ++next) {
      const ParamSpec& d = draws[next];
      const Place place = place_of(whole, draws, d.path);
      exec::Array drawn = place.row_offset < 0 ? value : exec::Array(d.type);
      std::normal_distribution<float> dist(0.0f, static_cast<float>(d.std));
      for (int64_t k = 0; k < drawn.size(); ++k) drawn.set(k, d.init == Init::ones ? 1.0 : dist(rng));
      if (place.row_offset >= 0) put(drawn, place, value);
    }
    if (split)
      value = block(block(value, spec.tensor_dim, spec.tensor_shards, at.tensor), spec.shard_dim, spec.shards, at.fsdp);
    if (!direct) keep(i, value);
  }
  ASSERT(next == draws.size());
}

void check_arrays(std::span<exec::Array> into, const std::vector<ParamSpec>& specs) {
  CHECK(into.size() == specs.size(), "init_params: {} arrays for {} parameters", into.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i)
    CHECK(into[i].type() == specs[i].type, "init_params: {} is {}, the model has {}", specs[i].path,
          ir::type_str(into[i].type()), ir::type_str(specs[i].type));
}
}  // namespace

void init_params(const ModelConfig& c, uint64_t seed, std::span<exec::Array> into, ShardIndex at) {
  check_arrays(into, param_specs(c));
  draw_params(c, seed, at, [&](size_t i) { return &into[i]; },
              [&](size_t i, const exec::Array& value) {
                std::memcpy(into[i].bytes(), value.bytes(), static_cast<size_t>(value.type().bytes()));
              });
}

void init_stage_params(const ModelConfig& c, uint64_t seed, std::span<const StagePart> parts, std::span<exec::Array> into,
                       ShardIndex at) {
  std::vector<ParamSpec> specs;
  for (const StagePart& part : parts)
    for (ParamSpec& s : stage_param_specs(c, part)) specs.push_back(std::move(s));
  check_arrays(into, specs);
  const std::vector<ParamSpec> model = param_specs(c);
  // Each stage parameter takes its rows (all of them, for those without a layers axis) of the drawn value.
  draw_params(c, seed, at, [](size_t) -> exec::Array* { return nullptr; }, [&](size_t i, const exec::Array& value) {
    size_t at = 0;
    for (const StagePart& part : parts)
      for (const ParamSpec& s : stage_param_specs(c, part)) {
        exec::Array& to = into[at++];
        if (s.path != model[i].path) continue;
        const int64_t row = s.stacked() ? value.type().bytes() / value.type().shape[0] : 0;
        std::memcpy(to.bytes(), value.bytes() + (s.stacked() ? part.first_layer * row : 0), static_cast<size_t>(to.type().bytes()));
      }
  });
}

std::vector<exec::Array> init_params(const ModelConfig& c, uint64_t seed) {
  std::vector<exec::Array> out;
  for (const ParamSpec& p : param_specs(c)) out.emplace_back(p.type);
  init_params(c, seed, out);
  return out;
}

std::vector<exec::Array> fuse_params(const ModelConfig& c, std::span<const exec::Array> unfused_params) {
  CHECK(c.mesh.size("fsdp") == 1 && c.mesh.size("tensor") == 1, "fuse_params: takes whole parameters, not shards");
  const std::vector<ParamSpec> from = param_specs(unfused(c)), to = param_specs(c);
  CHECK(unfused_params.size() == from.size(), "fuse_params: {} arrays for {} unfused parameters", unfused_params.size(),
        from.size());
  std::vector<exec::Array> out;
  for (const ParamSpec& p : to) out.emplace_back(p.type);
  for (size_t i = 0; i < from.size(); ++i) {
    CHECK(unfused_params[i].type() == from[i].type, "fuse_params: {} is {}, the unfused model has {}", from[i].path,
          ir::type_str(unfused_params[i].type()), ir::type_str(from[i].type));
    const Place place = place_of(to, from, from[i].path);
    put(unfused_params[i], place, out[place.index]);
  }
  return out;
}

}  // namespace remat::nn
