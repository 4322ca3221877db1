// Hugging Face Llama folders in (train/hf.h) against tests/ref/hf_llama_ref.py: a PyTorch Llama written with HF's
// conventions and tensor names makes random weights in HF's layout and its logits on fixed tokens; remat, loading
// the folder, computes the same logits within 1e-5 (f32), from f32, bf16 and f16 files, one file or two shards
// with an index. Broken folders are errors naming the file and the tensor.
#include "cli/config.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "train/hf.h"
#include "train/step.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

namespace remat {
namespace {

namespace fs = std::filesystem;
const fs::path kRef = fs::path(REMAT_TEST_DATA) / "ref" / "hf";

// The model config.json describes, through the config loader (f32 weights and compute).
nn::ModelConfig model_of(const fs::path& dir) { return cli::load_config("", train::hf::model_overrides(dir)).run.model; }

// The logits remat computes for `tokens` [B, T] with the folder's weights.
exec::Array remat_logits(const fs::path& dir, const exec::Array& tokens) {
  const nn::ModelConfig m = model_of(dir);
  const train::SafeTensors p = train::hf::read_parameters(dir, m);
  std::vector<exec::Array> args;
  for (const nn::ParamSpec& s : nn::param_specs(m)) args.push_back(p.tensors.at(s.path));
  args.push_back(tokens);
  const int64_t B = tokens.type().shape[0], T = tokens.type().shape[1];
  return exec::run(nn::logits_graph(m, B, T), args)[0];
}

class HfLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(HfLogits, EqualThePyTorchReferenceWithin1e5) {
  const train::SafeTensors ref = train::read_safetensors(kRef / (GetParam() + ".logits.safetensors"));
  const exec::Array& want = ref.tensors.at("logits");
  const exec::Array got = remat_logits(kRef / GetParam(), ref.tensors.at("tokens"));
  ASSERT_EQ(got.type(), want.type());
  double worst = 0, largest = 0;
  for (int64_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got.get(i) - want.get(i)));
    largest = std::max(largest, std::abs(want.get(i)));
  }
  EXPECT_LE(worst, 1e-5) << GetParam();
  EXPECT_GT(largest, 0.5) << "logits of order 1: a wrong layout would show far above the tolerance";
}

// Untied f32 in one file; the same weights rounded to bf16 and f16 and stored so; a tied model in two shards.
INSTANTIATE_TEST_SUITE_P(Folders, HfLogits, ::testing::Values("tiny", "tiny_bf16", "tiny_f16", "tiny_tied"));

// A copy of folder `from` in `to` whose model.safetensors holds `edit` applied to the original tensors.
void edited_copy(const fs::path& from, const fs::path& to,
                 const std::function<void(std::map<std::string, exec::Array>&)>& edit) {
  fs::create_directories(to);
  fs::copy_file(from / "config.json", to / "config.json");
  std::map<std::string, exec::Array> tensors = train::read_safetensors(from / "model.safetensors").tensors;
  edit(tensors);
  std::vector<train::NamedArray> named;
  for (const auto& [name, a] : tensors) named.push_back({name, a});
  train::write_safetensors(to / "model.safetensors", named, {{"format", "pt"}});
}

std::string load_error(const fs::path& dir) {
  return testing_support::error_of([&] { train::hf::read_parameters(dir, model_of(kRef / "tiny")); });
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(HfErrors, AMissingTensorIsNamedWithItsFile) {
  testing_support::TempDir temp;
  edited_copy(kRef / "tiny", temp.path, [](auto& t) { t.erase("model.layers.1.mlp.up_proj.weight"); });
  const std::string e = load_error(temp.path);
  expect_contains(e, (temp.path / "model.safetensors").string());
  expect_contains(e, "has no tensor 'model.layers.1.mlp.up_proj.weight'");
}

TEST(HfErrors, AShapeThatDoesNotMatchTheConfigIsNamedWithItsFile) {
  testing_support::TempDir temp;
  edited_copy(kRef / "tiny", temp.path, [](auto& t) {
    // As many elements as wanted (kv 2 x 4 rows of 16), transposed: only the shape tells.
    t["model.layers.0.self_attn.k_proj.weight"] = exec::Array::zeros({DType::f32, {16, 8}});
  });
  const std::string e = load_error(temp.path);
  expect_contains(e, (temp.path / "model.safetensors").string());
  expect_contains(e, "tensor 'model.layers.0.self_attn.k_proj.weight' is f32[16,8], config.json's model needs [8,16]");
}

TEST(HfErrors, ATensorTheLlamaDoesNotHaveIsRefused) {
  testing_support::TempDir temp;
  edited_copy(kRef / "tiny", temp.path,
              [](auto& t) { t["model.layers.0.self_attn.q_proj.bias"] = exec::Array::zeros({DType::f32, {16}}); });
  expect_contains(load_error(temp.path), "tensor 'model.layers.0.self_attn.q_proj.bias' is not one of the Llama");
}

TEST(HfErrors, AnIndexWithoutATensorOrAShardWithoutItIsNamed) {
  testing_support::TempDir temp;
  fs::copy(kRef / "tiny_tied", temp.path, fs::copy_options::recursive);
  const fs::path index = temp.path / "model.safetensors.index.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
  const auto load = [&] {
    return testing_support::error_of([&] { train::hf::read_parameters(temp.path, model_of(temp.path)); });
  };
  ASSERT_EQ(j["weight_map"]["model.norm.weight"], "model-00002-of-00002.safetensors");
  j["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";  // not where it is
  std::ofstream(index) << j.dump();
  expect_contains(load(), "model-00001-of-00002.safetensors' has no tensor 'model.norm.weight'");
  j["weight_map"].erase("model.norm.weight");
  std::ofstream(index) << j.dump();
  expect_contains(load(), index.string() + "' lists no file for tensor 'model.norm.weight'");
}

TEST(HfErrors, UnknownOrUnsupportedConfigFieldsAreNamed) {
  testing_support::TempDir temp;
  const auto with = [&](const std::string& field, const nlohmann::json& value) {
    nlohmann::json config = nlohmann::json::parse(std::ifstream(kRef / "tiny" / "config.json"));
    config[field] = value;
    std::ofstream(temp.path / "config.json") << config.dump();
    return testing_support::error_of([&] { train::hf::model_overrides(temp.path); });
  };
  expect_contains(with("sliding_window", 4096), "unknown fields sliding_window");
  expect_contains(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}), "field 'rope_scaling'");
  expect_contains(with("hidden_act", "gelu"), "field 'hidden_act' is \"gelu\"");
  expect_contains(with("attention_bias", true), "field 'attention_bias' is true");
  expect_contains(with("hidden_size", 16.5), "field 'hidden_size' is 16.5, not an integer");
  EXPECT_EQ(with("torch_dtype", "bfloat16"), "") << "informational fields are accepted";
  EXPECT_EQ(with("bos_token_id", 1), "");
}

TEST(HfErrors, AnotherModelsFolderNamesTheDifferingKeys) {
  nn::ModelConfig m = model_of(kRef / "tiny");
  m.num_kv_heads = 4;
  const std::string e = testing_support::error_of([&] { train::hf::check_model(kRef / "tiny", m); });
  expect_contains(e, "base_num_kv_heads: 2 (config.json's num_key_value_heads) vs 4 (now)");
  expect_contains(e, "pass base_num_kv_heads=2");
}

}  // namespace
}  // namespace remat
