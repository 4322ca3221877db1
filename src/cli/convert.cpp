// `remat convert`: a Hugging Face Llama folder to a remat parameter file, and a remat checkpoint to a folder.
//   remat convert to=remat hf_path=DIR output_path=FILE [CONFIG.yml] [key=value ...]
//   remat convert to=hf load_parameters_path=CHECKPOINT output_path=DIR [CONFIG.yml] [key=value ...]
// The model comes from config.json (to=remat) or from the checkpoint's saved config (to=hf), the command line's
// keys after it (weight_dtype: the dtype written). The file to=remat writes is what load_parameters_path reads.
#include "cli/commands.h"
#include "cli/config.h"

#include "train/checkpoint_manager.h"
#include "train/hf.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace remat::cli {
namespace {

namespace fs = std::filesystem;

struct ConvertArgs {
  std::string to, hf_path, output_path;
  std::string config_path;                // an optional leading CONFIG.yml
  std::vector<std::string> overrides;     // the other key=value arguments: config keys
};

ConvertArgs parse_args(const std::vector<std::string>& args) {
  ConvertArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i == 0 && a.find('=') == std::string::npos) out.config_path = a;
    else if (a.starts_with("to=")) out.to = a.substr(3);
    else if (a.starts_with("hf_path=")) out.hf_path = a.substr(8);
    else if (a.starts_with("output_path=")) out.output_path = a.substr(12);
    else out.overrides.push_back(a);
  }
  CHECK(out.to == "hf" || out.to == "remat", "remat convert needs to=hf (a remat checkpoint to a Hugging Face folder) "
        "or to=remat (a Hugging Face folder to a remat parameter file), got to='{}'", out.to);
  CHECK(!out.output_path.empty(), "remat convert to={} needs output_path=", out.to);
  return out;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int to_remat(const ConvertArgs& a) {
  CHECK(!a.hf_path.empty(), "remat convert to=remat needs hf_path= (a Hugging Face folder: config.json and safetensors)");
  const std::vector<std::string> keys = train::hf::model_overrides(a.hf_path);
  const Config config = load_config(a.config_path, concat(keys, a.overrides));
  const nn::ModelConfig& model = config.run.model;
  const train::SafeTensors params = train::hf::read_parameters(a.hf_path, model);
  std::vector<train::NamedArray> named;
  nn::ModelConfig one_device = model;
  one_device.mesh = {};
  for (const nn::ParamSpec& s : nn::param_specs(one_device)) named.push_back({s.path, params.tensors.at(s.path)});
  nlohmann::json saved;  // the model keys, as a checkpoint saves its config: to=hf reads them back
  for (const std::string& k : train::hf::model_keys()) saved[k] = config.run.config_values.at(k);
  train::write_safetensors(a.output_path, named, {{"config", saved.dump()}});
  fmt::print("wrote {}: {} parameters ({}), from {}\ntrain from it with: remat train {} load_parameters_path={}\n",
             a.output_path, nn::param_count(one_device), dtype_name(model.precision.param), a.hf_path,
             fmt::join(concat(keys, a.overrides), " "), a.output_path);
  return 0;
}

int to_hf(const ConvertArgs& a) {
  const Config given = load_config(a.config_path, a.overrides);
  CHECK(!given.run.load_parameters_path.empty(),
        "remat convert to=hf needs load_parameters_path= (a checkpoint file, or its step folder)");
  CHECK(!train::hf::is_folder(given.run.load_parameters_path), "'{}' is a Hugging Face folder already (it has config.json)",
        given.run.load_parameters_path);
  const SavedParameters saved = read_saved_parameters(given.run.load_parameters_path, train::hf::model_keys());
  const fs::path& file = saved.file;
  const std::vector<std::string>& keys = saved.keys;  // the checkpoint's model, as it was trained
  const Config config = load_config(a.config_path, concat(keys, a.overrides));
  train::hf::write_folder(a.output_path, config.run.model, saved.tensors.tensors, config.run.shape.seq,
                          fmt::format("checkpoint '{}'", file.string()));
  fmt::print("wrote {}/config.json and {}/model.safetensors ({}, {} parameters) from {}\n", a.output_path,
             a.output_path, dtype_name(config.run.model.precision.param), nn::param_count(config.run.model),
             file.string());
  return 0;
}

}  // namespace

SavedParameters read_saved_parameters(const std::filesystem::path& path, std::span<const std::string> wanted) {
  SavedParameters out;
  out.file = path;
  if (std::error_code ec; fs::is_directory(out.file, ec)) out.file /= train::CheckpointLayout{}.file(0, 0);
  out.tensors = train::read_safetensors(out.file);
  if (auto it = out.tensors.metadata.find("config"); it != out.tensors.metadata.end()) {
    std::map<std::string, std::string> values;
    try {
      values = nlohmann::json::parse(it->second).get<std::map<std::string, std::string>>();
    } catch (const nlohmann::json::exception& e) {
      CHECK(false, "checkpoint '{}': its metadata 'config' is not a JSON object of strings ({})", out.file.string(),
            e.what());
    }
    for (const std::string& k : wanted)
      if (values.count(k)) out.keys.push_back(fmt::format("{}={}", k, values.at(k)));
  }
  return out;
}

int run_convert(const std::vector<std::string>& args) {
  const ConvertArgs a = parse_args(args);
  return a.to == "remat" ? to_remat(a) : to_hf(a);
}

}  // namespace remat::cli
