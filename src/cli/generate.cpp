// `remat generate`: text from a remat checkpoint or a Hugging Face folder, with a KV cache (docs/generate.md).
//   remat generate load_parameters_path=CHECKPOINT_OR_HF_DIR prompt="..." max_new_tokens=N
//                  [temperature=T top_k=K top_p=P seed=S] [CONFIG.yml] [key=value ...]
// The model comes from the checkpoint's saved config (or config.json), the command line's config keys after it;
// the caches hold prompt + max_new_tokens positions, at most max_target_length (max_position_embeddings for a
// Hugging Face folder).
#include "cli/commands.h"
#include "cli/config.h"

#include "plan/report.h"
#include "train/checkpoint_manager.h"
#include "train/hf.h"
#include "trainer/generate.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <fstream>

namespace remat::cli {
namespace {

namespace fs = std::filesystem;

struct GenerateArgs {
  std::string prompt;
  int64_t max_new_tokens = -1;
  trainer::Sampling sampling;
  std::string config_path;             // an optional leading CONFIG.yml
  std::vector<std::string> overrides;  // the other key=value arguments: config keys
};

template <class T>
T number(const std::string& key, const std::string& raw) {
  T v{};
  auto [p, ec] = std::from_chars(raw.data(), raw.data() + raw.size(), v);
  CHECK(ec == std::errc() && p == raw.data() + raw.size() && !raw.empty(), "remat generate: {}= expects {}, got '{}'",
        key, std::is_floating_point_v<T> ? "a number" : "an integer", raw);
  return v;
}

GenerateArgs parse_args(const std::vector<std::string>& args) {
  GenerateArgs out;
  bool has_prompt = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (i == 0 && eq == std::string::npos) out.config_path = a;
    else if (key == "prompt") out.prompt = value, has_prompt = true;
    else if (key == "max_new_tokens") out.max_new_tokens = number<int64_t>(key, value);
    else if (key == "temperature") out.sampling.temperature = number<double>(key, value);
    else if (key == "top_k") out.sampling.top_k = number<int64_t>(key, value);
    else if (key == "top_p") out.sampling.top_p = number<double>(key, value);
    else if (key == "seed") out.sampling.seed = number<uint64_t>(key, value);
    else out.overrides.push_back(a);
  }
  CHECK(has_prompt, "remat generate needs prompt=\"...\" (the text to continue)");
  CHECK(out.max_new_tokens >= 1, "remat generate needs max_new_tokens=N (N >= 1, the tokens to generate), got {}",
        out.max_new_tokens);
  trainer::validate(out.sampling, "remat generate");
  return out;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The parameters and the config keys they come with: a Hugging Face folder's config.json (its
// max_position_embeddings as max_target_length), or a checkpoint's saved model, length and tokenizer keys.
struct Source {
  std::vector<std::string> keys;
  train::SafeTensors tensors;  // read once the model is known (hf) or at once (checkpoint)
  fs::path file;
};

Source source_of(const std::string& path) {
  Source s;
  if (train::hf::is_folder(path)) {
    s.keys = train::hf::model_overrides(path);
    const nlohmann::json config = nlohmann::json::parse(std::ifstream(fs::path(path) / "config.json"));
    if (config.contains("max_position_embeddings"))
      s.keys.push_back(fmt::format("max_target_length={}", config.at("max_position_embeddings").get<int64_t>()));
    s.file = path;
    return s;
  }
  std::vector<std::string> wanted = train::hf::model_keys();
  wanted.insert(wanted.end(), {"max_target_length", "tokenizer_type", "tokenizer_path"});
  SavedParameters saved = read_saved_parameters(path, wanted);
  return {std::move(saved.keys), std::move(saved.tensors), std::move(saved.file)};
}

}  // namespace

int run_generate(const std::vector<std::string>& args) {
  const GenerateArgs a = parse_args(args);
  const std::string path = load_config(a.config_path, a.overrides).run.load_parameters_path;
  CHECK(!path.empty(), "remat generate needs load_parameters_path= (a remat checkpoint file or step folder, or a "
        "Hugging Face folder)");
  Source source = source_of(path);
  const Config config = load_config(a.config_path, concat(source.keys, a.overrides));
  nn::ModelConfig model = config.run.model;
  model.mesh = {};  // the whole model on this process
  const train::Tokenizer tokenizer(config.run.tokenizer);
  std::vector<int32_t> prompt = tokenizer.encode(a.prompt);
  if (tokenizer.bos_id() >= 0) prompt.insert(prompt.begin(), tokenizer.bos_id());  // as documents start in training
  const int64_t length = static_cast<int64_t>(prompt.size()) + a.max_new_tokens, limit = config.run.shape.seq;
  CHECK(!prompt.empty(), "remat generate: the prompt is empty and the tokenizer has no BOS to start from: give prompt=\"...\"");
  CHECK(length <= limit, "remat generate: the prompt's {} tokens and max_new_tokens={} make {} positions, beyond the "
        "model's max_target_length {}: lower max_new_tokens or shorten the prompt (or raise max_target_length=, "
        "positions training never saw)", prompt.size(), a.max_new_tokens, length, limit);
  trainer::Generator generator({.model = model, .fuse = config.run.fusion}, static_cast<int64_t>(prompt.size()), length);
  if (train::hf::is_folder(path)) source.tensors = train::hf::read_parameters(path, model);
  const exec::Mesh one;
  train::CheckpointManager({}, one).restore(generator.prefill().state(), source.tensors, source.file,
                                            train::Restore::parameters);
  fmt::print("model: {:.3f}M parameters from {}; {} layers, d={}, heads={}/{} kv, vocab {}, {}\n",
             static_cast<double>(nn::param_count(model)) / 1e6, path, model.num_decoder_layers, model.emb_dim,
             model.num_heads, model.num_kv_heads, model.vocab_size, dtype_name(model.precision.compute));
  fmt::print("plan: KV caches of {} positions (prompt {} + max_new_tokens {}; max_target_length {})\n{}", length,
             prompt.size(), a.max_new_tokens, limit, generator.plan_text());
  const std::vector<int32_t> tokens = generator.generate(prompt, a.max_new_tokens, a.sampling);
  fmt::print("{}\n", trainer::printable(tokenizer.decode(tokens)));
  const trainer::GenerationTiming& t = generator.timing();
  auto rate = [](int64_t n, double s) { return s > 0 ? static_cast<double>(n) / s : 0.0; };
  fmt::print("prefill: {} tokens in {:.2f} ms ({:.1f} tokens/s); decode: {} tokens in {:.2f} ms ({:.1f} tokens/s)\n",
             t.prompt_tokens, 1e3 * t.prefill_seconds, rate(t.prompt_tokens, t.prefill_seconds), t.new_tokens - 1,
             1e3 * t.decode_seconds, rate(t.new_tokens - 1, t.decode_seconds));
  return 0;
}

}  // namespace remat::cli
