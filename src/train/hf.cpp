#include "train/hf.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <set>

namespace remat::train::hf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

enum class Kind { integer, real, boolean };
struct Field {
  const char* hf;   // config.json's name
  const char* key;  // remat's
  Kind kind;
};
// config.json's fields that set remat's model keys.
constexpr Field kFields[] = {
    {"vocab_size", "vocab_size", Kind::integer},
    {"hidden_size", "base_emb_dim", Kind::integer},
    {"intermediate_size", "base_mlp_dim", Kind::integer},
    {"num_hidden_layers", "base_num_decoder_layers", Kind::integer},
    {"num_attention_heads", "base_num_query_heads", Kind::integer},
    {"num_key_value_heads", "base_num_kv_heads", Kind::integer},
    {"head_dim", "head_dim", Kind::integer},
    {"rms_norm_eps", "normalization_layer_epsilon", Kind::real},
    {"rope_theta", "rope_max_timescale", Kind::real},
    {"tie_word_embeddings", "logits_via_embedding", Kind::boolean},
};
// Fields that describe the checkpoint or its training without changing the model: any value.
const std::set<std::string> kInformational = {"_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id",
                                              "initializer_range", "torch_dtype", "transformers_version", "use_cache",
                                              "pretraining_tp", "max_position_embeddings"};
// Fields accepted at the value remat builds only.
const std::map<std::string, json>& fixed_fields() {
  static const std::map<std::string, json> f = {
      {"architectures", json::array({"LlamaForCausalLM"})}, {"model_type", "llama"}, {"hidden_act", "silu"},
      {"attention_bias", false}, {"mlp_bias", false}, {"rope_scaling", nullptr}, {"attention_dropout", 0.0}};
  return f;
}

// The fields of kFields for model `c`, as config.json spells them.
json fields_of(const nn::ModelConfig& c) {
  return {{"vocab_size", c.vocab_size},           {"hidden_size", c.emb_dim},
          {"intermediate_size", c.mlp_dim},       {"num_hidden_layers", c.num_decoder_layers},
          {"num_attention_heads", c.num_heads},   {"num_key_value_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},               {"rms_norm_eps", c.rms_eps},
          {"rope_theta", c.rope_theta},           {"tie_word_embeddings", c.logits_via_embedding}};
}

// config.json of `dir` checked, as the fields of kFields (LlamaConfig's defaults filled in).
json read_config(const fs::path& dir) {
  const fs::path file = dir / "config.json";
  std::ifstream in(file);
  CHECK(in.good(), "cannot read '{}': a Hugging Face folder holds config.json beside its safetensors", file.string());
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& e) {
    CHECK(false, "'{}' is not valid JSON: {}", file.string(), e.what());
  }
  CHECK(config.is_object(), "'{}' is not a JSON object", file.string());
  json out;
  std::vector<std::string> unknown;
  for (const auto& [name, value] : config.items()) {
    const auto* field = std::find_if(std::begin(kFields), std::end(kFields), [&](const Field& f) { return f.hf == name; });
    if (field != std::end(kFields)) {
      const bool ok = field->kind == Kind::integer ? value.is_number_integer()
                      : field->kind == Kind::real  ? value.is_number()
                                                   : value.is_boolean();
      CHECK(ok, "'{}': field '{}' is {}, not {}", file.string(), name, value.dump(),
            field->kind == Kind::integer ? "an integer" : field->kind == Kind::real ? "a number" : "true or false");
      out[name] = value;
    } else if (auto f = fixed_fields().find(name); f != fixed_fields().end()) {
      CHECK(value == f->second, "'{}': field '{}' is {}; remat builds the Llama with {} only{}", file.string(), name,
            value.dump(), f->second.dump(),
            name == "rope_scaling" ? " (no RoPE scaling: Llama 3.1's rope_type llama3 is not supported)" : "");
    } else if (!kInformational.count(name)) {
      unknown.push_back(name);
    }
  }
  CHECK(unknown.empty(), "'{}': unknown fields {}; remat reads LlamaConfig's model fields (hidden_size, ...) and "
        "ignores only informational ones (torch_dtype, bos_token_id, ...)", file.string(), fmt::join(unknown, ", "));
  for (const char* required : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"})
    CHECK(out.contains(required), "'{}' has no field '{}'", file.string(), required);
  CHECK(out["num_attention_heads"].get<int64_t>() > 0, "'{}': num_attention_heads must be positive", file.string());
  if (!out.contains("num_key_value_heads")) out["num_key_value_heads"] = out["num_attention_heads"];
  if (!out.contains("head_dim")) out["head_dim"] = out["hidden_size"].get<int64_t>() / out["num_attention_heads"].get<int64_t>();
  if (!out.contains("rms_norm_eps")) out["rms_norm_eps"] = 1e-6;
  if (!out.contains("rope_theta")) out["rope_theta"] = 10000.0;
  if (!out.contains("tie_word_embeddings")) out["tie_word_embeddings"] = false;
  return out;
}

std::string value_text(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  return fmt::format("{}", v.get<double>());
}

// One HF tensor and where it lives in remat's parameters: `path`, row `layer` of the stack (-1: the whole
// parameter), transposed or not. `shape` is HF's: [out, in] for a Linear weight.
struct Tensor {
  std::string hf, path;
  int64_t layer;
  bool transpose;
  ir::Shape shape;
};

std::vector<Tensor> tensors(const nn::ModelConfig& c) {
  const int64_t V = c.vocab_size, D = c.emb_dim, F = c.mlp_dim, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  std::vector<Tensor> t = {{"model.embed_tokens.weight", "token_embedder/embedding", -1, false, {V, D}}};
  for (int64_t l = 0; l < c.num_decoder_layers; ++l) {
    const std::string hf = fmt::format("model.layers.{}.", l), ours = "decoder/layers/";
    t.push_back({hf + "input_layernorm.weight", ours + "pre_self_attention_norm/scale", l, false, {D}});
    t.push_back({hf + "self_attn.q_proj.weight", ours + "self_attention/query/kernel", l, true, {q, D}});
    t.push_back({hf + "self_attn.k_proj.weight", ours + "self_attention/key/kernel", l, true, {kv, D}});
    t.push_back({hf + "self_attn.v_proj.weight", ours + "self_attention/value/kernel", l, true, {kv, D}});
    t.push_back({hf + "self_attn.o_proj.weight", ours + "self_attention/out/kernel", l, true, {D, q}});
    t.push_back({hf + "post_attention_layernorm.weight", ours + "post_self_attention_norm/scale", l, false, {D}});
    t.push_back({hf + "mlp.gate_proj.weight", ours + "mlp/wi_0/kernel", l, true, {F, D}});
    t.push_back({hf + "mlp.up_proj.weight", ours + "mlp/wi_1/kernel", l, true, {F, D}});
    t.push_back({hf + "mlp.down_proj.weight", ours + "mlp/wo/kernel", l, true, {D, F}});
  }
  t.push_back({"model.norm.weight", "decoder/decoder_norm/scale", -1, false, {D}});
  if (!c.logits_via_embedding) t.push_back({"lm_head.weight", "decoder/logits_dense/kernel", -1, true, {V, D}});
  return t;
}

// Buffers older conversions saved beside the weights; recomputed from rope_theta, so skipped.
bool skipped(const std::string& name) { return name.ends_with("rotary_emb.inv_freq"); }

// The model on one device, unfused: the parameters HF's tensors map to.
nn::ModelConfig unfused(const nn::ModelConfig& c) {
  nn::ModelConfig u = c;
  u.fused_qkv = u.fused_mlp = false;
  u.mesh = {};
  return u;
}

bool is_hf_dtype(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

// Copies a [rows, cols] array of dtype `fd` at `from` into `to` (dtype `td`), as it is or transposed ([cols, rows]).
void copy(const std::byte* from, DType fd, std::byte* to, DType td, int64_t rows, int64_t cols, bool transpose) {
  const size_t size = static_cast<size_t>(dtype_size(fd));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t src = i * cols + j, dst = transpose ? j * rows + i : src;
      if (fd == td) std::memcpy(to + static_cast<size_t>(dst) * size, from + static_cast<size_t>(src) * size, size);
      else exec::Array::set_element(td, to, dst, exec::Array::element(fd, from, src));
    }
}

// The bytes of `t`'s part of parameter `param`: its layer's row of the stack, or all of it.
std::byte* part_of(const exec::Array& param, const Tensor& t) {
  if (t.layer < 0) return param.bytes();
  return param.bytes() + t.layer * (param.type().bytes() / param.type().shape[0]);
}

// The file of the folder holding each tensor: model.safetensors.index.json's weight_map, else model.safetensors.
std::map<std::string, std::string> files_of(const fs::path& dir, const std::vector<Tensor>& expected) {
  std::map<std::string, std::string> out;
  const fs::path index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::exists(index, ec)) {
    CHECK(fs::exists(dir / "model.safetensors", ec), "Hugging Face folder '{}' has neither model.safetensors nor "
          "model.safetensors.index.json", dir.string());
    for (const Tensor& t : expected) out[t.hf] = "model.safetensors";
    return out;
  }
  std::ifstream in(index);
  json map;
  try {
    map = json::parse(in).at("weight_map");
    for (const auto& [name, file] : map.items()) {
      CHECK(file.is_string() && fs::path(file.get<std::string>()).filename() == file.get<std::string>(),
            "'{}': the weight_map entry of '{}' is not a file name in the folder", index.string(), name);
      out[name] = file;
    }
  } catch (const json::exception& e) {
    CHECK(false, "'{}' is not a safetensors index (an object with a weight_map of tensor -> file): {}", index.string(),
          e.what());
  }
  for (const Tensor& t : expected)
    CHECK(out.count(t.hf), "'{}' lists no file for tensor '{}' (config.json's model needs it)", index.string(), t.hf);
  return out;
}

}  // namespace

bool is_folder(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path / "config.json", ec);
}

std::vector<std::string> model_overrides(const fs::path& dir) {
  const json config = read_config(dir);
  std::vector<std::string> out;
  for (const Field& f : kFields) out.push_back(fmt::format("{}={}", f.key, value_text(config[f.hf])));
  return out;
}

std::vector<std::string> model_keys() {
  std::vector<std::string> keys = {"weight_dtype", "fused_qkv", "fused_mlp"};
  for (const Field& f : kFields) keys.push_back(f.key);
  return keys;
}

void check_model(const fs::path& dir, const nn::ModelConfig& c) {
  const json config = read_config(dir), ours = fields_of(c);
  std::vector<std::string> differing, fix;
  for (const Field& f : kFields)
    if (config[f.hf] != ours[f.hf]) {
      differing.push_back(fmt::format("{}: {} (config.json's {}) vs {} (now)", f.key, value_text(config[f.hf]), f.hf,
                                      value_text(ours[f.hf])));
      fix.push_back(fmt::format("{}={}", f.key, value_text(config[f.hf])));
    }
  CHECK(differing.empty(), "Hugging Face folder '{}' holds another model: {}; pass {}", dir.string(),
        fmt::join(differing, "; "), fmt::join(fix, " "));
}

SafeTensors read_parameters(const fs::path& dir, const nn::ModelConfig& c) {
  check_model(dir, c);
  const nn::ModelConfig u = unfused(c);
  const std::vector<nn::ParamSpec> specs = nn::param_specs(u);
  std::map<std::string, exec::Array> params;
  for (const nn::ParamSpec& s : specs) params.emplace(s.path, exec::Array(s.type));
  const std::vector<Tensor> expected = tensors(u);
  std::map<std::string, const Tensor*> by_name;
  for (const Tensor& t : expected) by_name[t.hf] = &t;
  const std::map<std::string, std::string> files = files_of(dir, expected);
  for (const auto& [name, file] : files)
    CHECK(by_name.count(name) || skipped(name), "Hugging Face folder '{}': tensor '{}' ({}) is not one of the Llama "
          "config.json describes (biases and other layers are not supported)", dir.string(), name, file);
  std::set<std::string> file_names;
  for (const auto& [name, file] : files) file_names.insert(file);
  for (const std::string& name : file_names) {  // one file in memory at a time
    const fs::path file = dir / name;
    const SafeTensors saved = read_safetensors(file);
    for (const Tensor& t : expected) {
      if (files.at(t.hf) != name) continue;
      auto it = saved.tensors.find(t.hf);
      CHECK(it != saved.tensors.end(), "'{}' has no tensor '{}' (config.json's model needs it)", file.string(), t.hf);
      const ir::Type& type = it->second.type();
      CHECK(type.shape == t.shape && is_hf_dtype(type.dtype),
            "'{}': tensor '{}' is {}, config.json's model needs {} of F32, BF16 or F16", file.string(), t.hf,
            ir::type_str(type), ir::shape_str(t.shape));
      const exec::Array& to = params.at(t.path);
      copy(it->second.bytes(), type.dtype, part_of(to, t), to.type().dtype, t.shape[0], t.shape.size() > 1 ? t.shape[1] : 1,
           t.transpose);
    }
    for (const auto& [tensor, array] : saved.tensors)
      CHECK(by_name.count(tensor) || skipped(tensor), "'{}': tensor '{}' is not one of the Llama config.json describes "
            "(biases and other layers are not supported)", file.string(), tensor);
  }
  SafeTensors out;
  if (!c.fused_qkv && !c.fused_mlp) {
    out.tensors = std::move(params);
    return out;
  }
  std::vector<exec::Array> in_order;
  for (const nn::ParamSpec& s : specs) in_order.push_back(params.at(s.path));
  nn::ModelConfig one_device = c;
  one_device.mesh = {};
  const std::vector<exec::Array> fused = nn::fuse_params(one_device, in_order);
  const std::vector<nn::ParamSpec> fused_specs = nn::param_specs(one_device);
  for (size_t i = 0; i < fused.size(); ++i) out.tensors.emplace(fused_specs[i].path, fused[i]);
  return out;
}

void write_folder(const fs::path& dir, const nn::ModelConfig& c, const std::map<std::string, exec::Array>& params,
                  int64_t max_position_embeddings, const std::string& source) {
  CHECK(!c.fused_qkv && !c.fused_mlp, "{}: a model with fused_qkv or fused_mlp has no Hugging Face layout here; "
        "export one trained unfused", source);
  const DType dtype = c.precision.param;
  CHECK(is_hf_dtype(dtype), "weight_dtype {} has no Hugging Face torch_dtype here: use float32, bfloat16 or float16",
        dtype_name(dtype));
  const nn::ModelConfig u = unfused(c);
  std::map<std::string, ir::Type> whole;
  for (const nn::ParamSpec& s : nn::param_specs(u)) whole.emplace(s.path, s.type);
  for (const auto& [path, type] : whole) {
    auto it = params.find(path);
    CHECK(it != params.end() && it->second.type().shape == type.shape && is_float(it->second.type().dtype),
          "{}: parameter '{}' is {}, the model needs {}", source, path,
          it == params.end() ? "missing" : ir::type_str(it->second.type()), ir::type_str(type));
  }
  std::vector<NamedArray> out;
  for (const Tensor& t : tensors(u)) {
    const exec::Array& from = params.at(t.path);
    exec::Array to(ir::Type{dtype, t.shape});
    const int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : 1;
    // The inverse of read_parameters' copy: the parameter's part is [cols, rows] when transposed.
    copy(part_of(from, t), from.type().dtype, to.bytes(), dtype, t.transpose ? cols : rows, t.transpose ? rows : cols,
         t.transpose);
    out.push_back({t.hf, to});
  }
  make_folder(dir, "pass an output_path this process can write");
  json config = fields_of(c);
  for (const auto& [name, value] : fixed_fields()) config[name] = value;
  config["max_position_embeddings"] = max_position_embeddings;
  config["torch_dtype"] = dtype == DType::f32 ? "float32" : dtype == DType::bf16 ? "bfloat16" : "float16";
  write_text(dir / "config.json", config.dump(2) + "\n");
  write_safetensors(dir / "model.safetensors", out, {{"format", "pt"}});  // transformers requires the format
}

}  // namespace remat::train::hf
