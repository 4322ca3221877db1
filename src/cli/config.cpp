#include "cli/config.h"

#include "base/check.h"
#include "nn/nn.h"
#include "remat/remat.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <unistd.h>

namespace remat::cli {

using train::LossScaleConfig;

namespace {

namespace fs = std::filesystem;

struct Key {
  std::string name;
  std::string kind;  // "an integer", "a number", "true or false", "a string"
  std::function<void(Config&, const std::string& value, const std::string& where)> set;
};

template <class T>
T parse_value(const std::string& key, const std::string& raw, const std::string& where, const char* kind) {
  T v{};
  if constexpr (std::is_same_v<T, std::string>) {
    return raw;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (raw == "true" || raw == "True") return true;
    if (raw == "false" || raw == "False") return false;
  } else {
    auto [p, ec] = std::from_chars(raw.data(), raw.data() + raw.size(), v);
    if (ec == std::errc() && p == raw.data() + raw.size()) return v;
  }
  CHECK(false, "config key '{}' expects {}, got '{}' ({})", key, kind, raw, where);
  return v;
}

// A string key whose value must be one of `allowed`.
Key bind_enum(std::string name, std::vector<std::string> allowed, std::function<std::string&(Config&)> field) {
  std::string kind = fmt::format("one of {}", fmt::join(allowed, ", "));
  return Key{name, kind, [name, field, allowed, kind](Config& c, const std::string& raw, const std::string& where) {
               CHECK(std::find(allowed.begin(), allowed.end(), raw) != allowed.end(),
                     "config key '{}' expects {}, got '{}' ({})", name, kind, raw, where);
               field(c) = raw;
             }};
}

// The values a numeric key accepts: an interval, each end open or closed (infinite ends are open).
struct Bounds {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  const char* fill = nullptr;  // else -1 (what it means: filled with the remaining ranks, ...) or >= 1

  bool contains(double v) const {
    if (fill != nullptr) return v == -1 || v >= 1;
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi) && !std::isnan(v);
  }
  std::string text() const {
    if (fill != nullptr) return fmt::format("-1 ({}) or >= 1", fill);
    if (std::isinf(hi)) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
    return fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  }
};
Bounds at_least(double x) { return {.lo = x}; }
Bounds ranks() { return {.fill = "fill with the remaining ranks"}; }
Bounds or_derived() { return {.fill = "derived"}; }
Bounds above(double x) { return {.lo = x, .lo_open = true}; }
Bounds unit_interval() { return {.lo = 0, .hi = 1}; }
Bounds below_one() { return {.lo = 0, .hi = 1, .hi_open = true}; }  // Adam's betas

template <class T>
Key bind(std::string name, std::function<T&(Config&)> field, std::optional<Bounds> bounds = std::nullopt) {
  const char* kind = std::is_same_v<T, bool>          ? "true or false"
                     : std::is_same_v<T, std::string> ? "a string"
                     : std::is_floating_point_v<T>    ? "a number"
                                                      : "an integer";
  return Key{name, kind, [=](Config& c, const std::string& raw, const std::string& where) {
               field(c) = parse_value<T>(name, raw, where, kind);
               if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
                 CHECK(!bounds || bounds->contains(static_cast<double>(field(c))), "config key '{}' expects {} {}, got '{}' ({})",
                       name, kind, bounds->text(), raw, where);
             }};
}

// Where remat_policy=custom keeps one checkpoint name (MaxText's per-tensor keys).
Key custom_key(const std::string& name) {
  return bind_enum(name, {"remat", "device", "offload"},
                   [name](Config& c) -> std::string& { return c.custom_remat[name]; });
}

// The model's keys (shape, precision, remat), in base.yml's order.
std::vector<Key> model_keys() {
  return {
      bind<std::string>("model", [](Config& c) -> std::string& { return c.model; }),
      bind<int64_t>("vocab_size", [](Config& c) -> int64_t& { return c.run.model.vocab_size; }, at_least(1)),
      bind<int64_t>("base_emb_dim", [](Config& c) -> int64_t& { return c.run.model.emb_dim; }, at_least(1)),
      bind<int64_t>("base_num_decoder_layers", [](Config& c) -> int64_t& { return c.run.model.num_decoder_layers; }, at_least(1)),
      bind<int64_t>("base_num_query_heads", [](Config& c) -> int64_t& { return c.run.model.num_heads; }, at_least(1)),
      bind<int64_t>("base_num_kv_heads", [](Config& c) -> int64_t& { return c.run.model.num_kv_heads; }, at_least(1)),
      bind<int64_t>("head_dim", [](Config& c) -> int64_t& { return c.run.model.head_dim; }, at_least(2)),
      bind<int64_t>("base_mlp_dim", [](Config& c) -> int64_t& { return c.run.model.mlp_dim; }, at_least(1)),
      bind<double>("rope_max_timescale", [](Config& c) -> double& { return c.run.model.rope_theta; }, above(1)),
      bind<double>("normalization_layer_epsilon", [](Config& c) -> double& { return c.run.model.rms_eps; }, above(0)),
      bind<bool>("logits_via_embedding", [](Config& c) -> bool& { return c.run.model.logits_via_embedding; }),
      bind<bool>("scan_layers", [](Config& c) -> bool& { return c.run.model.scan_layers; }),
      bind<int64_t>("layers_per_group", [](Config& c) -> int64_t& { return c.run.model.layers_per_group; }, at_least(0)),
      bind<std::string>("mp_policy", [](Config& c) -> std::string& { return c.mp_policy; }),
      bind<std::string>("dtype", [](Config& c) -> std::string& { return c.dtype; }),
      bind<std::string>("weight_dtype", [](Config& c) -> std::string& { return c.weight_dtype; }),
      bind_enum("mp_cast", {"per_layer", "upfront"}, [](Config& c) -> std::string& { return c.mp_cast; }),
      bind_enum("attention", {"dot_product", "flash"}, [](Config& c) -> std::string& { return c.attention; }),
      bind<bool>("fusion", [](Config& c) -> bool& { return c.run.fusion; }),
      bind<bool>("float32_qk_product", [](Config& c) -> bool& { return c.run.model.float32_qk_product; }),
      bind<bool>("float32_logits", [](Config& c) -> bool& { return c.run.model.float32_logits; }),
      bind<bool>("logits_dot_in_fp32", [](Config& c) -> bool& { return c.run.model.logits_dot_in_fp32; }),
      bind<int64_t>("num_vocab_tiling", [](Config& c) -> int64_t& { return c.run.model.num_vocab_tiling; }, at_least(1)),
      bind<double>("loss_scale_initial", [](Config& c) -> double& { return c.run.optimizer.loss_scale.initial; }, at_least(1)),
      bind<int64_t>("loss_scale_period", [](Config& c) -> int64_t& { return c.run.optimizer.loss_scale.period; }, at_least(1)),
      bind<double>("loss_scale_factor", [](Config& c) -> double& { return c.run.optimizer.loss_scale.factor; }, above(1)),
      bind<double>("loss_scale_min", [](Config& c) -> double& { return c.run.optimizer.loss_scale.min_scale; }, at_least(1)),
      bind<std::string>("remat_policy", [](Config& c) -> std::string& { return c.remat_policy; }),
      bind<std::string>("group_remat_policy", [](Config& c) -> std::string& { return c.group_remat_policy; }),
      bind<bool>("remat_allow_unmatched", [](Config& c) -> bool& { return c.run.remat_allow_unmatched; }),
      bind_enum("checkpoint_naming", {"maxtext", "axlearn"}, [](Config& c) -> std::string& { return c.checkpoint_naming; }),
      bind<bool>("fused_qkv", [](Config& c) -> bool& { return c.run.model.fused_qkv; }),
      bind<bool>("fused_mlp", [](Config& c) -> bool& { return c.run.model.fused_mlp; }),
  };
}

// The run's keys (batch, parallelism, optimizer, data, checkpoints, sampling), in base.yml's order.
std::vector<Key> run_keys() {
  return {
      bind<int64_t>("per_device_batch_size", [](Config& c) -> int64_t& { return c.run.shape.batch; }, at_least(1)),
      bind<int64_t>("max_target_length", [](Config& c) -> int64_t& { return c.run.shape.seq; }, at_least(1)),
      bind<int64_t>("gradient_accumulation_steps", [](Config& c) -> int64_t& { return c.run.shape.accumulation; }, at_least(1)),
      bind<int64_t>("ici_data_parallelism", [](Config& c) -> int64_t& { return c.run.ici_data_parallelism; }, ranks()),
      bind<int64_t>("dcn_data_parallelism", [](Config& c) -> int64_t& { return c.run.dcn_data_parallelism; }, ranks()),
      bind<int64_t>("ici_fsdp_parallelism", [](Config& c) -> int64_t& { return c.run.ici_fsdp_parallelism; }, ranks()),
      bind<int64_t>("dcn_fsdp_parallelism", [](Config& c) -> int64_t& { return c.run.dcn_fsdp_parallelism; }, ranks()),
      bind<int64_t>("ici_tensor_parallelism", [](Config& c) -> int64_t& { return c.run.ici_tensor_parallelism; }, at_least(1)),
      bind<int64_t>("dcn_tensor_parallelism", [](Config& c) -> int64_t& { return c.run.dcn_tensor_parallelism; }, at_least(1)),
      bind<int64_t>("ici_tensor_sequence_parallelism", [](Config& c) -> int64_t& { return c.run.ici_tensor_sequence_parallelism; }, at_least(1)),
      bind<int64_t>("dcn_tensor_sequence_parallelism", [](Config& c) -> int64_t& { return c.run.dcn_tensor_sequence_parallelism; }, at_least(1)),
      bind<int64_t>("ici_pipeline_parallelism", [](Config& c) -> int64_t& { return c.run.ici_pipeline_parallelism; }, at_least(1)),
      bind<int64_t>("num_pipeline_microbatches", [](Config& c) -> int64_t& { return c.run.num_pipeline_microbatches; }, or_derived()),
      bind<int64_t>("num_layers_per_pipeline_stage", [](Config& c) -> int64_t& { return c.run.num_layers_per_pipeline_stage; }, or_derived()),
      bind<int64_t>("num_pipeline_repeats", [](Config& c) -> int64_t& { return c.run.num_pipeline_repeats; }, or_derived()),
      bind_enum("pipeline_schedule", {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"}, [](Config& c) -> std::string& { return c.run.pipeline_schedule; }),
      bind<std::string>("pipeline_stage_remat_policies", [](Config& c) -> std::string& { return c.pipeline_stage_remat_policies; }),
      bind<int64_t>("steps", [](Config& c) -> int64_t& { return c.run.steps; }, at_least(1)),
      bind<double>("learning_rate", [](Config& c) -> double& { return c.run.optimizer.learning_rate; }, at_least(0)),
      bind<int64_t>("warmup_steps", [](Config& c) -> int64_t& { return c.run.optimizer.warmup_steps; }, at_least(0)),
      bind<double>("cosine_learning_rate_final_fraction",
                   [](Config& c) -> double& { return c.run.optimizer.final_lr_fraction; }, unit_interval()),
      bind<double>("adam_b1", [](Config& c) -> double& { return c.run.optimizer.b1; }, below_one()),
      bind<double>("adam_b2", [](Config& c) -> double& { return c.run.optimizer.b2; }, below_one()),
      bind<double>("adam_eps", [](Config& c) -> double& { return c.run.optimizer.eps; }, above(0)),
      bind<double>("adam_weight_decay", [](Config& c) -> double& { return c.run.optimizer.weight_decay; }, at_least(0)),
      bind<double>("gradient_clipping_threshold", [](Config& c) -> double& { return c.run.optimizer.clip_norm; }, at_least(0)),
      bind_enum("tokenizer_type", {"byte", "sentencepiece"}, [](Config& c) -> std::string& { return c.run.tokenizer.type; }),
      bind<std::string>("tokenizer_path", [](Config& c) -> std::string& { return c.run.tokenizer.path; }),
      bind_enum("tokenizer_algorithm", {"bpe", "unigram"}, [](Config& c) -> std::string& { return c.tokenizer_algorithm; }),
      bind_enum("dataset_type", {"text", "jsonl", "tokens"}, [](Config& c) -> std::string& { return c.run.data.corpus.type; }),
      bind<std::string>("dataset_path", [](Config& c) -> std::string& { return c.run.data.corpus.path; }),
      bind<bool>("packing", [](Config& c) -> bool& { return c.run.data.packing; }),
      bind<std::string>("eval_dataset_path", [](Config& c) -> std::string& { return c.run.data.eval_path; }),
      bind<std::string>("train_data_columns", [](Config& c) -> std::string& { return c.run.data.corpus.column; }),
      bind<double>("validation_fraction", [](Config& c) -> double& { return c.run.data.validation_fraction; }, Bounds{.lo = 0, .hi = 1, .lo_open = true, .hi_open = true}),
      bind<std::string>("output_path", [](Config& c) -> std::string& { return c.output_path; }),
      bind<uint64_t>("init_weights_seed", [](Config& c) -> uint64_t& { return c.run.init_seed; }),
      bind<uint64_t>("data_shuffle_seed", [](Config& c) -> uint64_t& { return c.run.data_seed; }),
      bind<int64_t>("eval_interval", [](Config& c) -> int64_t& { return c.run.eval_interval; }, at_least(1)),
      bind<int64_t>("eval_steps", [](Config& c) -> int64_t& { return c.run.eval_steps; }, at_least(1)),
      bind<int64_t>("log_period", [](Config& c) -> int64_t& { return c.run.log_period; }, at_least(1)),
      Key{"run_name", "a folder name", [](Config& c, const std::string& raw, const std::string& where) {
            // A name, not a path: the run's files stay inside base_output_directory ("" = the model's name).
            CHECK(raw.find('/') == std::string::npos && raw != "." && raw != "..",
                  "config key 'run_name' expects a folder name without '/' and not '.' or '..', got '{}' ({}): a run "
                  "writes into <base_output_directory>/<run_name>; choose the folder with base_output_directory",
                  raw, where);
            c.run_name = raw;
          }},
      bind<std::string>("base_output_directory", [](Config& c) -> std::string& { return c.base_output_directory; }),
      bind<std::string>("hbm_limit", [](Config& c) -> std::string& { return c.hbm_limit; }),
      bind<std::string>("host_limit", [](Config& c) -> std::string& { return c.host_limit; }),
      bind<std::string>("host_bandwidth", [](Config& c) -> std::string& { return c.host_bandwidth; }),
      bind<std::string>("ici_bandwidth", [](Config& c) -> std::string& { return c.ici_bandwidth; }),
      bind<bool>("enable_profiler", [](Config& c) -> bool& { return c.run.enable_profiler; }),
      bind<int64_t>("skip_first_n_steps_for_profiler",
                    [](Config& c) -> int64_t& { return c.run.skip_first_n_steps_for_profiler; }, at_least(0)),
      bind<bool>("enable_checkpointing", [](Config& c) -> bool& { return c.run.enable_checkpointing; }),
      bind<int64_t>("checkpoint_period", [](Config& c) -> int64_t& { return c.run.checkpoint_period; }, at_least(1)),
      bind<int64_t>("max_num_checkpoints_to_keep", [](Config& c) -> int64_t& { return c.run.max_checkpoints; }, at_least(0)),
      bind<std::string>("load_parameters_path", [](Config& c) -> std::string& { return c.run.load_parameters_path; }),
      custom_key("decoder_layer_input"),
      custom_key("query_proj"),
      custom_key("key_proj"),
      custom_key("value_proj"),
      custom_key("context"),
      custom_key("out_proj"),
      custom_key("mlpwi_0"),
      custom_key("mlpwi_1"),
      custom_key("mlpwo"),
      custom_key("qkv_proj"),
      custom_key("mlpwi"),
      bind<std::string>("sample_prompt", [](Config& c) -> std::string& { return c.run.sample_prompt; }),
      bind<int64_t>("sample_length", [](Config& c) -> int64_t& { return c.run.sample_length; }, at_least(0)),
      bind<double>("sample_temperature", [](Config& c) -> double& { return c.run.sample_temperature; }, at_least(0)),
  };
}

// Every key, in base.yml's order (its documentation).
const std::vector<Key>& keys() {
  static const std::vector<Key> k = [] {
    std::vector<Key> all = model_keys();
    for (Key& key : run_keys()) all.push_back(std::move(key));
    return all;
  }();
  return k;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t prev = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cur = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
      prev = cur;
    }
  }
  return row[b.size()];
}

const Key& find_key(const std::string& name, const std::string& where) {
  constexpr size_t kNear = 3;  // a key this many edits away is suggested
  const Key* best = nullptr;
  size_t best_d = kNear + 1;
  for (const Key& k : keys())
    if (k.name == name) return k;
  for (const Key& k : keys()) {
    if (std::max(k.name.size(), name.size()) - std::min(k.name.size(), name.size()) > kNear) continue;  // d >= that
    size_t d = edit_distance(k.name, name);
    if (d < best_d) best_d = d, best = &k;
  }
  std::string hint = best ? fmt::format(" Did you mean '{}'?", best->name) : "";
  CHECK(false, "unknown config key '{}' ({}).{} Known keys: {}", name, where, hint, fmt::join(config_keys(), ", "));
  __builtin_unreachable();
}

// key -> raw scalar text of a flat YAML mapping: `text`, read from `where` (a file, or the built-in configs).
std::vector<std::pair<std::string, std::string>> parse_yaml(const std::string& text, const std::string& where) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    CHECK(false, "config file '{}' is not valid YAML: {}", where, e.what());
  }
  std::vector<std::pair<std::string, std::string>> out;
  if (root.IsNull()) return out;
  CHECK(root.IsMap(), "config file '{}' must be a mapping of key: value lines", where);
  std::map<std::string, int> line_of;  // yaml-cpp keeps both entries of a key set twice
  for (const auto& kv : root) {
    CHECK(kv.first.IsScalar(), "config file '{}': the key at line {} is not a plain name (a YAML complex key?)", where,
          kv.first.Mark().line + 1);
    std::string key = kv.first.as<std::string>();
    const int line = kv.first.Mark().line + 1;
    const auto [first, fresh] = line_of.emplace(key, line);
    CHECK(fresh, "config key '{}' is set twice in '{}', at lines {} and {}: keep one", key, where, first->second, line);
    CHECK(kv.second.IsScalar() || kv.second.IsNull(), "config key '{}' in '{}' must be a single value (line {})", key,
          where, kv.second.Mark().line + 1);
    out.emplace_back(key, kv.second.IsNull() ? "" : kv.second.as<std::string>());
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> read_yaml(const std::string& path) {
  std::error_code ec;
  CHECK(fs::is_regular_file(path, ec), "cannot read config file '{}': {}", path,
        ec ? ec.message() : "not a regular file");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(in.good() || in.eof(), "cannot read config file '{}'", path);
  return parse_yaml(text.str(), path);
}

std::pair<std::string, std::string> split_override(const std::string& arg) {
  size_t eq = arg.find('=');
  CHECK(eq != std::string::npos && eq > 0, "argument '{}' is not key=value (e.g. steps=100)", arg);
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

// Model presets: the built-in ones and those in `dir` (models/ beside the user's config file), sorted.
std::vector<std::string> presets(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& [path, text] : embedded_configs())
    if (path.rfind("models/", 0) == 0) names.insert(fs::path(path).stem().string());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".yml") names.insert(e.path().stem().string());
  return {names.begin(), names.end()};
}

// pipeline_stage_remat_policies parsed, each entry as remat_policy is (auto refused: remat_policy=auto searches
// every rank's placement and fills this list). Their count is checked against the pipeline by trainer::plan_run.
std::vector<rematerialize::Policy> stage_policies(const Config& c, const rematerialize::CustomKeys& keys) {
  if (c.pipeline_stage_remat_policies.empty()) return {};
  CHECK(c.run.ici_pipeline_parallelism > 1,
        "config key 'pipeline_stage_remat_policies' is '{}' but there is no pipeline (ici_pipeline_parallelism=1): "
        "set remat_policy instead, or ici_pipeline_parallelism", c.pipeline_stage_remat_policies);
  std::vector<rematerialize::Policy> out;
  for (const std::string& text : split_values(c.pipeline_stage_remat_policies)) {
    const size_t at = out.size();
    try {
      out.push_back(nn::parse_remat_policy(text, c.run.model, keys));
    } catch (const Error& e) {
      CHECK(false, "config key 'pipeline_stage_remat_policies', entry {} ('{}'): {}", at, text, e.what());
    }
    CHECK(out.back().kind != rematerialize::Policy::Kind::automatic,
          "config key 'pipeline_stage_remat_policies', entry {}: auto is not an entry; drop this key and set "
          "remat_policy=auto, which places each rank's names and prints the list", at);
  }
  return out;
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> names;
  for (const Key& k : keys()) names.push_back(k.name);
  return names;
}

Config load_config(const std::string& config_path, const std::vector<std::string>& overrides) {
  Config c;
  c.config_path = config_path;
  c.overrides = overrides;
  auto apply = [&](const std::vector<std::pair<std::string, std::string>>& kvs, const std::string& where) {
    for (const auto& [k, v] : kvs) {
      find_key(k, where).set(c, v, fmt::format("in {}", where));
      c.run.config_values[k] = v;
    }
  };
  static const auto base = parse_yaml(embedded_configs().at("base.yml"), "built-in configs/base.yml");  // parsed once
  apply(base, "built-in configs/base.yml");
  if (!config_path.empty()) apply(read_yaml(config_path), config_path);
  std::vector<std::pair<std::string, std::string>> cli;
  for (const std::string& arg : overrides) {
    cli.push_back(split_override(arg));
    const auto& [k, v] = cli.back();
    if (k == "model") find_key(k, "").set(c, v, fmt::format("argument '{}'", arg));
  }
  // The preset: models/<model>.yml beside the user's config file, else the built-in one.
  const fs::path preset_dir = config_path.empty() ? fs::path() : fs::path(config_path).parent_path() / "models";
  const fs::path beside = preset_dir / (c.model + ".yml");
  const auto built_in = embedded_configs().find("models/" + c.model + ".yml");
  std::error_code ec;  // an unreadable preset folder: the built-in preset
  if (!config_path.empty() && fs::is_regular_file(beside, ec)) {
    apply(read_yaml(beside.string()), beside.string());
  } else {
    CHECK(built_in != embedded_configs().end(), "config key 'model' has no preset '{}'{}; available: {}", c.model,
          config_path.empty() ? "" : fmt::format(" (looked for {} and the built-in presets)", beside.string()),
          fmt::join(presets(preset_dir), ", "));
    apply(parse_yaml(built_in->second, "built-in configs/" + built_in->first), "built-in configs/" + built_in->first);
  }
  for (size_t i = 0; i < cli.size(); ++i) {
    const auto& [k, v] = cli[i];
    find_key(k, fmt::format("argument '{}'", overrides[i])).set(c, v, fmt::format("argument '{}'", overrides[i]));
    c.run.config_values[k] = v;
  }
  if (!c.mp_policy.empty()) {
    c.run.model.precision = nn::parse_precision(c.mp_policy, "mp_policy");
  } else {  // each key names one dtype: parse them apart so an error names the key
    const DType compute = nn::parse_precision(c.dtype, "dtype").compute;
    c.run.model.precision = nn::PrecisionPolicy{nn::parse_precision(c.weight_dtype, "weight_dtype").param, compute, compute};
  }
  c.run.model.cast_upfront = c.mp_cast == "upfront";
  c.run.model.flash_attention = c.attention == "flash";
  c.run.model.padded_targets = !c.run.data.packing;
  LossScaleConfig& ls = c.run.optimizer.loss_scale;
  ls.enabled = c.run.model.precision.compute == DType::f16;  // bf16 has f32's exponent range: no scaling
  CHECK(ls.initial >= 1 && ls.factor > 1 && ls.period >= 1 && ls.min_scale >= 1,
        "loss scaling: loss_scale_initial ({}) must be >= 1, loss_scale_factor ({}) > 1, loss_scale_period ({}) >= 1 "
        "and loss_scale_min ({}) >= 1",
        ls.initial, ls.factor, ls.period, ls.min_scale);
  c.run.model.checkpoint_naming = c.checkpoint_naming == "axlearn" ? nn::names::Naming::axlearn : nn::names::Naming::maxtext;
  nn::validate(c.run.model);
  rematerialize::CustomKeys keys;  // what a bare remat_policy=custom places
  // The names this layer carries, and any other key set away from remat (lint then rejects it by name).
  for (const nn::names::Name& name : nn::names::kAll) {
    const std::string key(name.maxtext), where = c.custom_remat[key];
    if (!key.empty() && (nn::names::carries(name, nn::vocabulary(c.run.model)) || where != "remat"))
      keys.emplace_back(key, where);
  }
  c.run.optimizer.schedule_steps = c.run.steps;
  c.run.run_dir = (fs::path(c.base_output_directory) / (c.run_name.empty() ? c.model : c.run_name)).string();
  // The policy is parsed here, once: a bad one is a config error before anything is traced. `auto` is resolved
  // by the command (cli::resolve_auto), which prints its choice.
  try {
    c.run.model.remat_policy = nn::parse_remat_policy(c.remat_policy, c.run.model, keys);
  } catch (const Error& e) {
    CHECK(false, "config key 'remat_policy': {}", e.what());
  }
  try {
    c.run.model.group_remat_policy = nn::parse_remat_policy(c.group_remat_policy, c.run.model);
  } catch (const Error& e) {
    CHECK(false, "config key 'group_remat_policy': {}", e.what());
  }
  using Kind = rematerialize::Policy::Kind;
  const Kind g = c.run.model.group_remat_policy.kind;
  CHECK(g != Kind::automatic && g != Kind::none && g != Kind::custom,
        "config key 'group_remat_policy' is '{}': a group's policy is a preset (full, minimal, ...), a JAX policy or "
        "a name list; auto, none and custom apply to remat_policy only", c.group_remat_policy);
  c.run.model.stage_remat_policies = stage_policies(c, keys);
  return c;
}

std::vector<std::string> split_values(const std::string& text) {
  std::vector<std::string> values(1);
  int depth = 0;
  char quote = 0;
  for (const char ch : text) {
    if (quote != 0) {
      quote = ch == quote ? 0 : quote;
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
    } else if (ch == '(' || ch == '[') {
      ++depth;
    } else if (ch == ')' || ch == ']') {
      --depth;
    } else if (ch == ',' && depth == 0) {
      values.emplace_back();
      continue;
    }
    values.back() += ch;
  }
  for (std::string& v : values) {  // "a, b" reads as "a,b"
    v.erase(0, v.find_first_not_of(' '));
    v.erase(v.find_last_not_of(' ') + 1);
  }
  return values;
}

Config with_overrides(const Config& config, const std::vector<std::string>& more) {
  std::vector<std::string> overrides = config.overrides;
  overrides.insert(overrides.end(), more.begin(), more.end());
  Config c = load_config(config.config_path, overrides);
  c.run.dump_ir_after = config.run.dump_ir_after;
  return c;
}

}  // namespace remat::cli
