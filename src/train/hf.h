// Hugging Face Llama folders (transformers' LlamaForCausalLM) in and out of remat's parameters.
// A folder holds config.json (LlamaConfig) and model.safetensors, or shards that model.safetensors.index.json
// lists (its weight_map: tensor -> file). config.json's shape fields map one to one onto remat's model keys
// (hidden_size -> base_emb_dim, ...; the table in hf.cpp); informational fields are accepted, anything that
// changes the model remat does not build (rope_scaling, biases, another activation) is refused by name.
// Layout: HF's Linear weights are [out, in] (y = x W^T), remat's kernels [in, out] stacked over the layers
// ([L, D, H, Dh], ...), so every kernel is one transpose, the norms and the embedding a copy. No permutation
// of q and k: remat's rotary embedding pairs element i of a head with element i + Dh/2 (rotate_half), as HF's.
//
//   std::vector<std::string> keys = train::hf::model_overrides(dir);   // {"vocab_size=32000", ...}
//   train::SafeTensors p = train::hf::read_parameters(dir, model);     // by parameter path, in model's dtype
//   train::hf::write_folder(out, model, p.tensors, /*max_position_embeddings=*/2048);
#pragma once

#include "nn/model.h"
#include "train/checkpoint.h"

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace remat::train::hf {

// Whether `path` is a folder holding config.json (an HF folder, not a remat checkpoint).
bool is_folder(const std::filesystem::path& path);

// remat's model keys ("key=value", the base_* names of configs/models/*.yml) for the config.json of `dir`.
// Unknown or unsupported fields are errors naming them and the file.
std::vector<std::string> model_overrides(const std::filesystem::path& dir);

// The model keys a checkpoint's saved config must carry for write_folder to rebuild its model (the keys
// model_overrides gives, and the parameter dtype and fusions).
std::vector<std::string> model_keys();

// Refuses a model `c` that is not the one config.json of `dir` describes, naming every differing key with both
// values and the overrides that make them equal.
void check_model(const std::filesystem::path& dir, const nn::ModelConfig& c);

// The parameters of model `c` (check_model first) from the folder's safetensors of F32, BF16 or F16, by parameter
// path in c's parameter dtype, fused as c fuses them, whole (no mesh). A missing tensor, one of another shape or
// dtype and an unexpected one are errors naming the file and the tensor.
SafeTensors read_parameters(const std::filesystem::path& dir, const nn::ModelConfig& c);

// Writes config.json and model.safetensors (in c's parameter dtype) of the unfused model `c` from `params` (by
// parameter path, whole, any float dtype; the file a missing or misshapen one came from is `source`).
void write_folder(const std::filesystem::path& dir, const nn::ModelConfig& c,
                  const std::map<std::string, exec::Array>& params, int64_t max_position_embeddings,
                  const std::string& source);

}  // namespace remat::train::hf
