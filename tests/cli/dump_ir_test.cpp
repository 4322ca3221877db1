// `--dump-ir=PASS` end to end: `remat plan`, `explain` and `train` print every program they compile right
// after that pass (ir::print's text under a `// @NAME after pass 'PASS'` line), then do their usual work;
// an unknown pass name exits 2 listing the passes.
#include "support/command.h"
#include "support/temp_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

namespace remat {
namespace {

using testing_support::Output;

const char* kSmall = "base_emb_dim=32 base_num_decoder_layers=1 base_num_query_heads=2 base_num_kv_heads=2 head_dim=16 "
                     "base_mlp_dim=64 per_device_batch_size=2 max_target_length=32";

Output remat_cli(const std::string& args) {
  return testing_support::run_command(fmt::format("'{}' {} {} 2>&1", REMAT_BINARY, args, kSmall));
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(DumpIr, PlanPrintsTheStepAfterTheNamedPass) {
  const Output inlined = remat_cli("plan --dump-ir=inline_remat_regions");
  ASSERT_EQ(inlined.status, 0) << inlined.text;
  EXPECT_TRUE(has(inlined.text, "// @train_step after pass 'inline_remat_regions'\ngraph @train_step(")) << inlined.text;
  EXPECT_FALSE(has(inlined.text, "= remat(")) << "the regions are inlined";
  EXPECT_FALSE(has(inlined.text, "= fusion(")) << "and not yet fused";
  EXPECT_TRUE(has(inlined.text, "arena")) << "the plan follows:\n" << inlined.text;
  const Output fused = remat_cli("plan --dump-ir=fuse");
  ASSERT_EQ(fused.status, 0) << fused.text;
  EXPECT_TRUE(has(fused.text, "// @train_step after pass 'fuse'\ngraph @train_step(")) << fused.text;
  EXPECT_TRUE(has(fused.text, "= fusion(")) << fused.text;
  const Output plain = remat_cli("plan");
  EXPECT_FALSE(has(plain.text, "after pass")) << "nothing is dumped unless asked";
}

TEST(DumpIr, ExplainAndTrainDumpEveryProgramTheyCompile) {
  const Output explain = remat_cli("explain --dump-ir=fuse");
  ASSERT_EQ(explain.status, 0) << explain.text;
  EXPECT_TRUE(has(explain.text, "// @grads after pass 'fuse'\n")) << explain.text;
  testing_support::TempDir dir;
  const Output train = remat_cli(fmt::format("train --dump-ir=fuse steps=1 eval_interval=1 eval_steps=1 "
                                             "sample_length=2 base_output_directory={} run_name=dump",
                                             dir.path.string()));
  ASSERT_EQ(train.status, 0) << train.text;
  EXPECT_TRUE(has(train.text, "// @train_step after pass 'fuse'\n")) << train.text;
  size_t dumps = 0;  // the step, the evaluation loss and the sampling's prefill and decode (KV cache)
  for (size_t at = train.text.find("after pass 'fuse'"); at != std::string::npos; at = train.text.find("after pass 'fuse'", at + 1)) ++dumps;
  EXPECT_EQ(dumps, 4u) << train.text;
}

TEST(DumpIr, UnknownPassExitsTwoListingThePasses) {
  const Output o = remat_cli("plan --dump-ir=fusion");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_TRUE(has(o.text, "error: --dump-ir=fusion: no such pass; the passes are inline_remat_regions, "
                          "insert_finite_checks, fuse\n"))
      << o.text;
}

}  // namespace
}  // namespace remat
