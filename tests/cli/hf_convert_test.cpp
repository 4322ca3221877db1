// `remat convert` and `load_parameters_path` on a Hugging Face folder, end to end through the binary: a run starts
// from the folder's weights; remat -> HF -> remat gives the same file byte for byte, HF -> remat -> HF the same
// tensors; and the published config.json of three real models maps onto remat's presets exactly.
#include "cli/config.h"
#include "support/command.h"
#include "support/temp_dir.h"
#include "train/hf.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace remat {
namespace {

namespace fs = std::filesystem;
const fs::path kTiny = fs::path(REMAT_TEST_DATA) / "ref" / "hf" / "tiny";

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every tensor of `a` is in `b` with the same type and bytes, and `b` has no other.
void expect_same_tensors(const train::SafeTensors& a, const train::SafeTensors& b, const std::string& what) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  for (const auto& [name, x] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(name)) << what << ": " << name;
    const exec::Array& y = b.tensors.at(name);
    ASSERT_EQ(x.type(), y.type()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(x.bytes(), y.bytes(), static_cast<size_t>(x.type().bytes())), 0) << what << ": " << name;
  }
}

testing_support::Output remat(const fs::path& dir, const std::string& args) {
  return testing_support::run_command(fmt::format("cd '{}' && '{}' {} 2>&1", dir.string(), REMAT_BINARY, args));
}

// A run with learning rate 0 keeps its parameters bit for bit (train/step.h: p - 0 * update), so its checkpoint
// holds the weights it loaded. From the HF folder: that checkpoint -> HF gives the folder's tensors again, and
// -> remat -> HF -> remat gives the same file twice.
TEST(HfConvert, ARunLoadsTheFolderAndBothRoundTripsAreExact) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  const std::string model = fmt::format("{}", fmt::join(train::hf::model_overrides(kTiny), " "));
  const testing_support::Output run =
      remat(dir, fmt::format("train {} steps=1 learning_rate=0 per_device_batch_size=1 max_target_length=8 "
                             "eval_steps=1 sample_length=1 enable_checkpointing=true run_name=hf "
                             "load_parameters_path='{}'", model, kTiny.string()));
  ASSERT_EQ(run.status, 0) << run.text;
  const fs::path checkpoint = dir / "runs" / "hf" / "checkpoints" / "1";
  const testing_support::Output out =
      remat(dir, fmt::format("convert to=hf load_parameters_path={} output_path=out", checkpoint.string()));
  ASSERT_EQ(out.status, 0) << out.text;
  expect_same_tensors(train::read_safetensors(kTiny / "model.safetensors"),
                      train::read_safetensors(dir / "out" / "model.safetensors"), "HF -> remat run -> HF");
  ASSERT_EQ(remat(dir, "convert to=remat hf_path=out output_path=a.safetensors").status, 0);
  ASSERT_EQ(remat(dir, "convert to=hf load_parameters_path=a.safetensors output_path=again").status, 0);
  ASSERT_EQ(remat(dir, "convert to=remat hf_path=again output_path=b.safetensors").status, 0);
  EXPECT_EQ(bytes_of(dir / "a.safetensors"), bytes_of(dir / "b.safetensors")) << "remat -> HF -> remat";
  // The converted file holds the run's parameters.
  const train::SafeTensors saved = train::read_safetensors(checkpoint / "state.safetensors");
  const train::SafeTensors a = train::read_safetensors(dir / "a.safetensors");
  for (const auto& [name, x] : a.tensors)
    EXPECT_EQ(std::memcmp(x.bytes(), saved.tensors.at(name).bytes(), static_cast<size_t>(x.type().bytes())), 0) << name;
}

// bf16 and f16 weights (weight_dtype) go out in their own dtype: the reference's bf16 folder comes back bit for bit.
TEST(HfConvert, Bf16WeightsRoundTripInTheirDtype) {
  testing_support::TempDir temp;
  const fs::path bf16 = kTiny.parent_path() / "tiny_bf16";
  const std::string in = "convert to=remat hf_path={} output_path=w.safetensors weight_dtype=bfloat16";
  ASSERT_EQ(remat(temp.path, fmt::format(fmt::runtime(in), bf16.string())).status, 0);
  const testing_support::Output out =
      remat(temp.path, "convert to=hf load_parameters_path=w.safetensors output_path=out");
  ASSERT_EQ(out.status, 0) << out.text;
  expect_same_tensors(train::read_safetensors(bf16 / "model.safetensors"),
                      train::read_safetensors(temp.path / "out" / "model.safetensors"), "bf16 HF -> remat -> HF");
  EXPECT_NE(bytes_of(temp.path / "out" / "config.json").find("\"torch_dtype\": \"bfloat16\""), std::string::npos);
}

TEST(HfConvert, ArgumentErrorsSayWhatIsMissing) {
  testing_support::TempDir temp;
  const testing_support::Output no_to = remat(temp.path, "convert output_path=x");
  EXPECT_EQ(no_to.status, 2);
  EXPECT_NE(no_to.text.find("needs to=hf"), std::string::npos) << no_to.text;
  const testing_support::Output no_path = remat(temp.path, "convert to=hf output_path=x");
  EXPECT_NE(no_path.text.find("needs load_parameters_path="), std::string::npos) << no_path.text;
  const testing_support::Output other =
      remat(temp.path, fmt::format("train steps=1 load_parameters_path={}", kTiny.string()));
  EXPECT_EQ(other.status, 2);
  EXPECT_NE(other.text.find("holds another model: vocab_size: 259 (config.json's vocab_size) vs 256 (now)"),
            std::string::npos) << other.text;
}

// config.json as published on the Hugging Face hub (TinyLlama/TinyLlama_v1.1, meta-llama/Llama-2-7b-hf,
// meta-llama/Meta-Llama-3-8B), the preset it maps to, and the model's published parameter count.
struct RealModel {
  const char* preset;
  int64_t parameters;
  const char* config_json;
};
const RealModel kRealModels[] = {
    {"tinyllama-1.1b", 1'100'048'384, R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
  "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 22,
  "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "float32", "transformers_version": "4.31.0", "use_cache": true,
  "vocab_size": 32000})"},
    {"llama2-7b", 6'738'415'616, R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true,
  "vocab_size": 32000})"},
    {"llama3-8b", 8'030'261'248, R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
  "use_cache": true, "vocab_size": 128256})"},
};

TEST(HfConfig, PublishedConfigsOfThreeModelsMapToThePresetsExactly) {
  for (const RealModel& m : kRealModels) {
    testing_support::TempDir temp;
    std::ofstream(temp.path / "config.json") << m.config_json;
    const nn::ModelConfig got = cli::load_config("", train::hf::model_overrides(temp.path)).run.model;
    const nn::ModelConfig want = cli::load_config("", {fmt::format("model={}", m.preset)}).run.model;
    EXPECT_EQ(got.vocab_size, want.vocab_size) << m.preset;
    EXPECT_EQ(got.emb_dim, want.emb_dim) << m.preset;
    EXPECT_EQ(got.mlp_dim, want.mlp_dim) << m.preset;
    EXPECT_EQ(got.num_decoder_layers, want.num_decoder_layers) << m.preset;
    EXPECT_EQ(got.num_heads, want.num_heads) << m.preset;
    EXPECT_EQ(got.num_kv_heads, want.num_kv_heads) << m.preset;
    EXPECT_EQ(got.head_dim, want.head_dim) << m.preset;
    EXPECT_EQ(got.rms_eps, want.rms_eps) << m.preset;
    EXPECT_EQ(got.rope_theta, want.rope_theta) << m.preset;
    EXPECT_EQ(got.logits_via_embedding, want.logits_via_embedding) << m.preset;
    EXPECT_EQ(nn::param_count(got), m.parameters) << m.preset << ": the published parameter count";
    train::hf::check_model(temp.path, want);  // and the preset is the folder's model
  }
}

}  // namespace
}  // namespace remat
