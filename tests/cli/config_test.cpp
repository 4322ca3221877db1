// Config loading: presets, overrides, and the errors users see for bad input.
#include "cli/config.h"

#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

namespace remat::cli {
namespace {

namespace fs = std::filesystem;

std::string base() { return std::string(REMAT_TEST_DATA) + "/../configs/base.yml"; }

std::string error_of(const std::string& base_path, const std::vector<std::string>& overrides) {
  try {
    load_config(base_path, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& text, const std::string& needle) {
  EXPECT_NE(text.find(needle), std::string::npos) << "message: " << text << "\nexpected to contain: " << needle;
}

TEST(Config, PresetThenOverrides) {
  Config c = load_config(base(), {"model=llama2-7b", "steps=7", "scan_layers=false", "learning_rate=1e-4"});
  EXPECT_EQ(c.model, "llama2-7b");
  EXPECT_EQ(c.run.model.emb_dim, 4096);
  EXPECT_EQ(c.run.model.vocab_size, 32000);
  EXPECT_EQ(c.run.steps, 7);
  EXPECT_FALSE(c.run.model.scan_layers);
  EXPECT_DOUBLE_EQ(c.run.optimizer.learning_rate, 1e-4);
  EXPECT_EQ(c.run.run_dir, (fs::path("runs") / "llama2-7b").string());
}

TEST(Config, PresetParameterCounts) {
  // Llama 2 7B is 6.74B parameters, Llama 3 8B 8.03B, Llama 2 70B 68.98B (untied output projections).
  EXPECT_NEAR(nn::param_count(load_config(base(), {"model=llama2-7b"}).run.model) / 1e9, 6.74, 0.01);
  EXPECT_NEAR(nn::param_count(load_config(base(), {"model=llama3-8b"}).run.model) / 1e9, 8.03, 0.01);
  EXPECT_NEAR(nn::param_count(load_config(base(), {"model=llama2-70b"}).run.model) / 1e9, 68.98, 0.01);
}

TEST(Config, UnknownKeyNamesItAndSuggests) {
  std::string e = error_of(base(), {"step=10"});
  expect_contains(e, "unknown config key 'step' (argument 'step=10')");
  expect_contains(e, "Did you mean 'steps'?");
}

TEST(Config, BadTypeNamesKeyValueAndSource) {
  expect_contains(error_of(base(), {"steps=ten"}), "config key 'steps' expects an integer, got 'ten' (argument 'steps=ten')");
  expect_contains(error_of(base(), {"scan_layers=maybe"}), "config key 'scan_layers' expects true or false, got 'maybe'");
  expect_contains(error_of(base(), {"learning_rate=fast"}), "config key 'learning_rate' expects a number, got 'fast'");
}

TEST(Config, BadEnumValueListsPresets) {
  std::string e = error_of(base(), {"model=gpt5"});
  expect_contains(e, "config key 'model' has no preset 'gpt5'");
  expect_contains(e, "available: llama2-70b, llama2-7b, llama3-8b, tiny, tinyllama-1.1b");
}

TEST(Config, BadValueCombinationNamesTheKeys) {
  expect_contains(error_of(base(), {"base_num_kv_heads=3"}),
                  "config key 'base_num_kv_heads' (3) must divide 'base_num_query_heads' (4)");
  expect_contains(error_of(base(), {"head_dim=7"}), "config key 'head_dim' must be even");
}

TEST(Config, MixedPrecisionKeys) {
  Config bf16 = load_config(base(), {"dtype=bfloat16"});
  EXPECT_EQ(bf16.run.model.precision.str(), "p=f32,c=bf16,o=bf16");
  EXPECT_EQ(load_config(base(), {"mp_policy=params=float32,compute=bfloat16,output=float32"}).run.model.precision.str(),
            "p=f32,c=bf16,o=f32");
  EXPECT_TRUE(load_config(base(), {"mp_cast=upfront"}).run.model.cast_upfront);
  expect_contains(error_of(base(), {"dtype=bf17"}), "config key 'dtype': unknown dtype 'bf17'");
  expect_contains(error_of(base(), {"weight_dtype=int8"}), "config key 'weight_dtype': unknown dtype 'int8'");
  expect_contains(error_of(base(), {"mp_policy=p=f32,q=bf16"}), "config key 'mp_policy': unknown key 'q'");
  expect_contains(error_of(base(), {"mp_cast=lazy"}), "config key 'mp_cast' expects one of per_layer, upfront, got 'lazy'");
}

TEST(Config, MissingFileAndMalformedArgument) {
  expect_contains(error_of("no/such/base.yml", {}), "cannot read config file 'no/such/base.yml': No such file or directory");
  expect_contains(error_of(REMAT_TEST_DATA, {}), fmt::format("cannot read config file '{}': not a regular file", REMAT_TEST_DATA));
  const std::string too_long = std::string(300, 'a') + "/base.yml";  // the file system's error, not an exception
  expect_contains(error_of(too_long, {}), fmt::format("cannot read config file '{}': File name too long", too_long));
  expect_contains(error_of(base(), {"steps"}), "argument 'steps' is not key=value");
}

TEST(Config, UnknownKeyInAFileNamesTheFile) {
  fs::path dir = fs::temp_directory_path() / "remat_config_test";
  fs::create_directories(dir / "models");
  std::ofstream(dir / "base.yml") << "model: tiny\nlearning_rat: 0.1\n";
  std::ofstream(dir / "models" / "tiny.yml") << "base_emb_dim: 64\n";
  expect_contains(error_of((dir / "base.yml").string(), {}),
                  "unknown config key 'learning_rat' (" + (dir / "base.yml").string() + ")");
  fs::remove_all(dir);
}

// Found by fuzz/config_fuzz: a YAML complex key escaped as YAML::BadConversion.
TEST(Config, AKeyThatIsNotAPlainNameIsAnErrorNamingItsLine) {
  testing_support::TempDir dir;
  std::ofstream(dir.path / "c.yml") << "steps: 3\n? [a, b]\n: 1\n";
  expect_contains(error_of((dir.path / "c.yml").string(), {}), "the key at line 2 is not a plain name");
}

// A run name is a folder inside base_output_directory: no path that leads out of it (or is it).
TEST(Config, ARunNameThatIsAPathIsRefusedNamingTheKey) {
  for (const char* name : {"../../x", "a/b", "/abs", "..", "."}) {
    const std::string e = error_of(base(), {fmt::format("run_name={}", name)});
    expect_contains(e, fmt::format("config key 'run_name' expects a folder name without '/' and not '.' or '..', got '{}'", name));
  }
  EXPECT_EQ(load_config(base(), {"run_name=..x"}).run.run_dir, (fs::path("runs") / "..x").string()) << "a name with dots";
  EXPECT_EQ(load_config(base(), {"run_name="}).run.run_dir, (fs::path("runs") / "tiny").string()) << "\"\" = the model";
}

// A key set twice in one file is a mistake (yaml-cpp would let the last win): both lines are named.
TEST(Config, AKeySetTwiceInAFileIsAnErrorNamingBothLines) {
  testing_support::TempDir dir;
  std::ofstream(dir.path / "c.yml") << "steps: 3\nlearning_rate: 0.1\n# a comment\nsteps: 4\n";
  expect_contains(error_of((dir.path / "c.yml").string(), {}),
                  fmt::format("config key 'steps' is set twice in '{}', at lines 1 and 4", (dir.path / "c.yml").string()));
  std::ofstream(dir.path / "d.yml") << "steps: 3\nlearning_rate: 0.1\n";
  EXPECT_EQ(error_of((dir.path / "d.yml").string(), {"steps=5", "steps=6"}), "") << "overrides over the file are fine";
}

TEST(Config, BaseYmlDocumentsExactlyTheKnownKeys) {
  YAML::Node root = YAML::LoadFile(base());
  std::vector<std::string> in_file;
  for (const auto& kv : root) in_file.push_back(kv.first.as<std::string>());
  EXPECT_EQ(in_file, config_keys()) << "configs/base.yml must list every key, in the schema's order";
  std::ifstream in(base());
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#' && line[0] != ' ') {
      EXPECT_NE(line.find(" # "), std::string::npos) << "undocumented key line in base.yml: " << line;
    }
  }
}

}  // namespace
}  // namespace remat::cli

namespace remat::cli {
namespace {

// Every key of configs/base.yml with a value it refuses (and the words of the refusal) and the edge value
// it accepts: the bounds written here from each key's meaning, not read from the loader. "" as the bad
// value: every string is accepted (a name, a path, a prompt; checked where it is used).
struct Bound {
  const char* key;
  const char* bad;
  const char* refusal;
  const char* edge;
};
const Bound kBounds[] = {
    {"model", "nope", "has no preset 'nope'", "tiny"},
    {"vocab_size", "0", "an integer >= 1", "1"},  // the tokenizer's size is checked where it loads
    {"base_emb_dim", "0", "an integer >= 1", "1"},
    {"base_num_decoder_layers", "0", "an integer >= 1", "1"},
    {"base_num_query_heads", "0", "an integer >= 1", "4"},
    {"base_num_kv_heads", "0", "an integer >= 1", "1"},
    {"head_dim", "1", "an integer >= 2", "2"},
    {"base_mlp_dim", "0", "an integer >= 1", "1"},
    {"rope_max_timescale", "1", "a number > 1", "1.5"},
    {"normalization_layer_epsilon", "0", "a number > 0", "1e-30"},
    {"logits_via_embedding", "maybe", "true or false", "true"},
    {"scan_layers", "1", "true or false", "false"},
    {"layers_per_group", "-1", "an integer >= 0", "0"},
    {"mp_policy", "compute=float8", "mp_policy", ""},
    {"dtype", "float8", "dtype", "bfloat16"},
    {"weight_dtype", "int4", "weight_dtype", "bfloat16"},
    {"mp_cast", "never", "one of per_layer, upfront", "upfront"},
    {"attention", "paged", "one of dot_product, flash", "flash"},
    {"fusion", "off", "true or false", "false"},
    {"float32_qk_product", "yes", "true or false", "false"},
    {"float32_logits", "no", "true or false", "false"},
    {"logits_dot_in_fp32", "2", "true or false", "false"},
    {"num_vocab_tiling", "0", "an integer >= 1", "1"},
    {"loss_scale_initial", "0.5", "a number >= 1", "1"},
    {"loss_scale_period", "0", "an integer >= 1", "1"},
    {"loss_scale_factor", "1", "a number > 1", "1.5"},
    {"loss_scale_min", "0.5", "a number >= 1", "1"},
    {"remat_policy", "mostly", "remat_policy", "none"},
    {"group_remat_policy", "auto", "group_remat_policy", "everything_saveable"},
    {"remat_allow_unmatched", "sometimes", "true or false", "true"},
    {"checkpoint_naming", "flax", "one of maxtext, axlearn", "axlearn"},
    {"fused_qkv", "both", "true or false", "true"},
    {"fused_mlp", "both", "true or false", "true"},
    {"per_device_batch_size", "0", "an integer >= 1", "1"},
    {"max_target_length", "0", "an integer >= 1", "1"},
    {"gradient_accumulation_steps", "0", "an integer >= 1", "1"},
    {"ici_data_parallelism", "0", "an integer -1 (fill with the remaining ranks) or >= 1", "-1"},
    {"dcn_data_parallelism", "-2", "an integer -1 (fill with the remaining ranks) or >= 1", "1"},
    {"ici_fsdp_parallelism", "0", "an integer -1 (fill with the remaining ranks) or >= 1", "2"},
    {"dcn_fsdp_parallelism", "-3", "an integer -1 (fill with the remaining ranks) or >= 1", "1"},
    {"ici_tensor_parallelism", "0", "an integer >= 1", "1"},
    {"dcn_tensor_parallelism", "0", "an integer >= 1", "1"},
    {"ici_tensor_sequence_parallelism", "0", "an integer >= 1", "1"},
    {"dcn_tensor_sequence_parallelism", "-1", "an integer >= 1", "1"},
    {"ici_pipeline_parallelism", "0", "an integer >= 1", "1"},
    {"num_pipeline_microbatches", "0", "an integer -1 (derived) or >= 1", "-1"},
    {"num_layers_per_pipeline_stage", "0", "an integer -1 (derived) or >= 1", "1"},
    {"num_pipeline_repeats", "-2", "an integer -1 (derived) or >= 1", "1"},
    {"pipeline_schedule", "zb", "one of gpipe, 1f1b, interleaved_1f1b", "1f1b"},
    {"pipeline_stage_remat_policies", "full", "there is no pipeline", ""},  // entries: tests/cli/pipeline_cli_test.cpp
    {"steps", "0", "an integer >= 1", "1"},
    {"learning_rate", "-1e-9", "a number >= 0", "0"},
    {"warmup_steps", "-1", "an integer >= 0", "0"},
    {"cosine_learning_rate_final_fraction", "1.01", "a number in [0, 1]", "1"},
    {"adam_b1", "1", "a number in [0, 1)", "0"},
    {"adam_b2", "-0.1", "a number in [0, 1)", "0.999"},
    {"adam_eps", "0", "a number > 0", "1e-30"},
    {"adam_weight_decay", "-0.1", "a number >= 0", "0"},
    {"gradient_clipping_threshold", "-1", "a number >= 0", "0"},
    {"tokenizer_type", "tiktoken", "one of byte, sentencepiece", "byte"},
    {"tokenizer_path", "", "", "any/file.model"},
    {"tokenizer_algorithm", "wordpiece", "one of bpe, unigram", "unigram"},
    {"dataset_type", "parquet", "one of text, jsonl, tokens", "jsonl"},
    {"dataset_path", "", "", "any/path"},
    {"packing", "no", "true or false", "false"},
    {"eval_dataset_path", "", "", "any/*.jsonl"},
    {"train_data_columns", "", "", "content"},
    {"validation_fraction", "0", "a number in (0, 1)", "0.5"},
    {"output_path", "", "", "any/folder"},
    {"init_weights_seed", "-1", "an integer", "18446744073709551615"},
    {"data_shuffle_seed", "x", "an integer", "0"},
    {"eval_interval", "0", "an integer >= 1", "1"},
    {"eval_steps", "0", "an integer >= 1", "1"},
    {"log_period", "0", "an integer >= 1", "1"},
    {"run_name", "../x", "a folder name without '/'", "any name"},
    {"base_output_directory", "", "", "/any/where"},
    {"hbm_limit", "", "", "16GiB"},  // sizes are parsed where they are used (remat plan, remat_policy=auto)
    {"host_limit", "", "", "512GiB"},
    {"host_bandwidth", "", "", "25GB"},
    {"ici_bandwidth", "", "", "100GB"},
    {"enable_profiler", "yes please", "true or false", "true"},
    {"skip_first_n_steps_for_profiler", "-1", "an integer >= 0", "0"},
    {"enable_checkpointing", "often", "true or false", "true"},
    {"checkpoint_period", "0", "an integer >= 1", "1"},
    {"max_num_checkpoints_to_keep", "-1", "an integer >= 0", "0"},
    {"load_parameters_path", "", "", "some/checkpoint"},
    {"decoder_layer_input", "disk", "one of remat, device, offload", "offload"},
    {"query_proj", "disk", "one of remat, device, offload", "device"},
    {"key_proj", "disk", "one of remat, device, offload", "device"},
    {"value_proj", "disk", "one of remat, device, offload", "device"},
    {"context", "disk", "one of remat, device, offload", "device"},
    {"out_proj", "disk", "one of remat, device, offload", "device"},
    {"mlpwi_0", "disk", "one of remat, device, offload", "device"},
    {"mlpwi_1", "disk", "one of remat, device, offload", "device"},
    {"mlpwo", "disk", "one of remat, device, offload", "device"},
    {"qkv_proj", "disk", "one of remat, device, offload", "remat"},
    {"mlpwi", "disk", "one of remat, device, offload", "remat"},
    {"sample_prompt", "", "", "\\x01 any bytes"},
    {"sample_length", "-1", "an integer >= 0", "0"},
    {"sample_temperature", "-0.5", "a number >= 0", "0"},
};

TEST(ConfigBounds, EveryKeyRefusesItsBadValueNamingItAndAcceptsItsEdge) {
  std::vector<std::string> covered;
  for (const Bound& b : kBounds) covered.push_back(b.key);
  EXPECT_EQ(covered, config_keys()) << "one row per key of configs/base.yml, in its order";
  for (const Bound& b : kBounds) {
    const std::string arg = fmt::format("{}={}", b.key, b.bad);
    if (*b.refusal != '\0') {
      const std::string e = error_of(base(), {arg});
      expect_contains(e, b.refusal);
      expect_contains(e, b.key);
      EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
    }
    EXPECT_EQ(error_of(base(), {fmt::format("{}={}", b.key, b.edge)}), "") << b.key << " accepts " << b.edge;
  }
}

}  // namespace
}  // namespace remat::cli
