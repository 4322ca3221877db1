// `remat generate` through the binary, on a checkpoint a tiny `remat train` wrote and on its Hugging Face export:
// it prints both programs' plans, the text and the two rates; greedy, it continues the prompt as the run's own
// end-of-run sample did; the HF folder gives the same text; bad inputs are one-line errors, exit status 2.
#include "support/command.h"
#include "support/filecheck.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>

namespace remat {
namespace {

namespace fs = std::filesystem;
using testing_support::Output;

Output remat(const fs::path& dir, const std::string& args) {
  return testing_support::run_command(fmt::format("cd '{}' && '{}' {} 2>&1", dir.string(), REMAT_BINARY, args));
}

// What follows `marker`'s line, up to the end of the next line.
std::string line_after(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  if (at == std::string::npos) return "";
  const size_t start = text.find('\n', at) + 1;
  return text.substr(start, text.find('\n', start) - start);
}

TEST(GenerateCli, PrintsThePlansTheTextAndTheRatesAndMatchesTheRunsSample) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  const std::string model = "base_emb_dim=32 base_num_decoder_layers=2 base_num_query_heads=4 base_num_kv_heads=2 "
                            "head_dim=8 base_mlp_dim=64 max_target_length=32";
  const Output run = remat(dir, fmt::format("train {} per_device_batch_size=2 steps=2 eval_steps=1 sample_length=12 "
                                            "sample_temperature=0 'sample_prompt=The ' enable_checkpointing=true run_name=g",
                                            model));
  ASSERT_EQ(run.status, 0) << run.text;
  const std::string sample = line_after(run.text, "sample (greedy, prompt \"The \"):");
  ASSERT_TRUE(sample.starts_with("The ") && sample.size() >= 16) << run.text;  // 12 bytes, some escaped
  const Output o = remat(dir, "generate load_parameters_path=runs/g/checkpoints/2 'prompt=The ' max_new_tokens=12");
  ASSERT_EQ(o.status, 0) << o.text;
  // The caches: key and value x 2 layers x 16 positions x 2 kv heads x 8 floats of 4 bytes = 4096 bytes. Whether
  // the decode program shares the prefill's arenas depends on the build (not under AddressSanitizer): not checked.
  EXPECT_EQ(testing_support::filecheck(R"(
// CHECK: model: 0.{{[0-9]+}}M parameters from runs/g/checkpoints/2; 2 layers, d=32, heads=4/2 kv, vocab 256, f32
// CHECK-NEXT: plan: KV caches of 16 positions (prompt 4 + max_new_tokens 12; max_target_length 32)
// CHECK-NEXT: prefill: arena {{[0-9.]+ [KMG]?i?B}} ({{[0-9]+}} bytes), caches in the arena, parameters {{.*}} bytes), inputs 16 bytes; allocated
// CHECK-NEXT: decode: arena {{[0-9.]+ [KMG]?i?B}} ({{[0-9]+}} bytes), caches 4.00 KiB (4096 bytes, arguments), parameters {{.*}}
// CHECK-NEXT: The
// CHECK-NEXT: prefill: 4 tokens in {{[0-9.]+}} ms ({{[0-9.]+}} tokens/s); decode: 11 tokens in {{[0-9.]+}} ms ({{[0-9.]+}} tokens/s)
)",
                                       o.text),
            "");
  EXPECT_EQ(line_after(o.text, "decode: arena"), sample) << o.text;
  ASSERT_EQ(remat(dir, "convert to=hf load_parameters_path=runs/g/checkpoints/2 output_path=hf").status, 0);
  const Output hf = remat(dir, "generate load_parameters_path=hf 'prompt=The ' max_new_tokens=12");
  ASSERT_EQ(hf.status, 0) << hf.text;
  EXPECT_EQ(line_after(hf.text, "decode: arena"), sample) << hf.text;
}

TEST(GenerateCli, BadInputsAreOneLineErrors) {
  testing_support::TempDir temp;
  const fs::path dir = temp.path;
  ASSERT_EQ(remat(dir, "train base_emb_dim=32 base_num_decoder_layers=1 base_num_query_heads=2 base_num_kv_heads=1 "
                       "head_dim=8 base_mlp_dim=32 max_target_length=16 per_device_batch_size=1 steps=1 eval_steps=1 "
                       "sample_length=0 enable_checkpointing=true run_name=b").status, 0);
  const std::string ckpt = "load_parameters_path=runs/b/checkpoints/1";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate prompt=x max_new_tokens=2", "error: remat generate needs load_parameters_path="},
      {"generate " + ckpt + " max_new_tokens=2", "error: remat generate needs prompt="},
      {"generate " + ckpt + " prompt=x", "error: remat generate needs max_new_tokens=N"},
      {"generate " + ckpt + " prompt=x max_new_tokens=16",
       "error: remat generate: the prompt's 1 tokens and max_new_tokens=16 make 17 positions, beyond the model's "
       "max_target_length 16"},
      {"generate " + ckpt + " prompt=x max_new_tokens=2 top_p=1.5", "error: remat generate: top_p=1.5 must be in (0, 1]"},
      {"generate " + ckpt + " prompt=x max_new_tokens=2 top_k=two", "error: remat generate: top_k= expects an integer, got 'two'"},
      {"generate load_parameters_path=missing.safetensors prompt=x max_new_tokens=2", "missing.safetensors"},
      {"generate " + ckpt + " prompt=x max_new_tokens=2 base_emb_dim=64", "does not fit this model"},
  };
  for (const auto& [args, want] : cases) {
    const Output o = remat(dir, args);
    EXPECT_EQ(o.status, 2) << args << "\n" << o.text;
    EXPECT_NE(o.text.find(want), std::string::npos) << args << "\n" << o.text;
  }
}

}  // namespace
}  // namespace remat
