// `remat explain` on the tiny model: golden text under full, minimal and custom (tests/cli/golden/), and
// offloading moves residual bytes from device to host. REMAT_UPDATE_GOLDEN=1 rewrites the golden files.
#include "cli/commands.h"
#include "cli/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "support/filecheck.h"

namespace remat::cli {
namespace {

std::string base() { return std::string(REMAT_TEST_DATA) + "/../configs/base.yml"; }

void expect_golden(const std::string& name, const std::vector<std::string>& overrides) {
  std::string got = explain_report(load_config(base(), overrides), false);
  std::string path = std::string(REMAT_TEST_DATA) + "/cli/golden/" + name;
  if (std::getenv("REMAT_UPDATE_GOLDEN")) std::ofstream(path) << got;
  EXPECT_EQ(got, testing_support::read_file(path)) << "golden " << path << " (REMAT_UPDATE_GOLDEN=1 rewrites it)";
}

TEST(Explain, TinyFull) { expect_golden("explain_tiny_full.txt", {"remat_policy=full"}); }
TEST(Explain, TinyMinimal) { expect_golden("explain_tiny_minimal.txt", {"remat_policy=minimal"}); }
TEST(Explain, TinyCustom) {
  expect_golden("explain_tiny_custom.txt",
                {"remat_policy=custom", "query_proj=offload", "key_proj=offload", "value_proj=device", "mlpwi_0=device"});
}

// Seed 001's policy as pasted from AXLearn, under AXLearn names (tests/remat/axlearn_policy_test.cpp checks
// the saved set against the regex independently).
TEST(Explain, TinyAxlearnSeedPolicy) {
  expect_golden("explain_tiny_axlearn_seed.txt",
                {"checkpoint_naming=axlearn",
                 "remat_policy=_save_and_offload_only_these_names_regex(names_which_can_be_saved=r\"(TransformerAttentionLayer\\.residual_add\" "
                 "r\"|.*\\.?(k|q|v)_proj\" r\"|.*\\.?linear1_[01]\" r\"|TransformerFeedForwardLayer\\.mlp_residual)\", "
                 "names_which_can_be_offloaded=None, offload_src=\"device\", offload_dst=\"pinned_host\")"});
}

// MaxText's fusions: minimal saves qkv_proj [B,T,H+2KV,Dh] and mlpwi [B,T,2,F], the same bytes as unfused.
TEST(Explain, TinyFusedMinimal) {
  expect_golden("explain_tiny_fused_minimal.txt", {"remat_policy=minimal", "fused_mlp=true", "fused_qkv=true"});
  nlohmann::json fused = nlohmann::json::parse(
      explain_report(load_config(base(), {"remat_policy=minimal", "fused_mlp=true", "fused_qkv=true"}), true));
  nlohmann::json plain = nlohmann::json::parse(explain_report(load_config(base(), {"remat_policy=minimal"}), true));
  EXPECT_EQ(fused["bytes_per_step"], plain["bytes_per_step"]);
  EXPECT_EQ(fused["bytes_per_step"]["saved"].get<double>(), 4 * 13.0 * (1 << 20));
}

TEST(Explain, OffloadMovesBytesFromDeviceToHost) {
  // minimal saves q, k, v, out_proj, mlpwi_0, mlpwi_1 and the layer input x; minimal_offloaded offloads the
  // same six names and keeps only x on device. Per layer (16 x 128 tokens, f32):
  //   q, k, v, out_proj: 4 x 128 x 2048 x 4 B = 4 MiB;  mlpwi_0, mlpwi_1: 2 x 512 x 2048 x 4 B = 8 MiB.
  nlohmann::json saved = nlohmann::json::parse(explain_report(load_config(base(), {"remat_policy=minimal"}), true));
  nlohmann::json moved =
      nlohmann::json::parse(explain_report(load_config(base(), {"remat_policy=minimal_offloaded"}), true));
  const double layers = 4, MiB = 1 << 20;
  EXPECT_EQ(saved["bytes_per_step"]["saved"].get<double>(), layers * 13 * MiB);
  EXPECT_EQ(saved["bytes_per_step"]["offloaded"].get<double>(), 0);
  EXPECT_EQ(moved["bytes_per_step"]["saved"].get<double>(), layers * 1 * MiB);
  EXPECT_EQ(moved["bytes_per_step"]["offloaded"].get<double>(), layers * 12 * MiB);
}

}  // namespace
}  // namespace remat::cli
