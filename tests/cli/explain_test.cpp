// `remat explain` on the tiny model: golden text under full, minimal and custom (tests/cli/golden/), and
// offloading moves residual bytes from device to host. REMAT_UPDATE_GOLDEN=1 rewrites the golden files, so
// each golden's recompute FLOPs are also derived here from the model's shapes.
#include "cli/commands.h"
#include "cli/config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "remat/layer_flops.h"
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
const std::vector<std::string> kSeedPolicy = {
    "checkpoint_naming=axlearn",
    "remat_policy=_save_and_offload_only_these_names_regex(names_which_can_be_saved=r\"(TransformerAttentionLayer\\.residual_add\" "
    "r\"|.*\\.?(k|q|v)_proj\" r\"|.*\\.?linear1_[01]\" r\"|TransformerFeedForwardLayer\\.mlp_residual)\", "
    "names_which_can_be_offloaded=None, offload_src=\"device\", offload_dst=\"pinned_host\")"};

TEST(Explain, TinyAxlearnSeedPolicy) {
  expect_golden("explain_tiny_axlearn_seed.txt", kSeedPolicy);
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

// The goldens' recompute FLOPs from the shapes (base.yml: tiny, 16 x 128 tokens). What the backward reads of a
// layer: the normed inputs h of the projections, the softmax's probs, the context (Wo's gradient), x + out_proj
// (the second norm's input), silu(gate)·up (the MLP's Wo); a remat policy recomputes what it does not save of
// them and of what they are made from. Wo of the MLP and the last residual add are never recomputed.
TEST(Explain, GoldenRecomputeFlopsAreTheOnesDerivedFromTheShapes) {
  auto recompute = [](const std::vector<std::string>& overrides) {
    return nlohmann::json::parse(explain_report(load_config(base(), overrides), true))["flops"]["recompute"].get<double>();
  };
  const Config c = load_config(base(), {});
  const testing_support::LayerFlops t(c.run.model, c.run.shape);
  // Kept q, k, v (after RoPE), out_proj, mlpwi_0 and mlpwi_1: the norms, probs and context again, x + out_proj,
  // silu(gate)·up.
  const double minimal = t.norm() + t.scores_gemm() + t.probs() + t.context_gemm() + t.residual_add() + t.norm() +
                         t.silu_times_up();
  EXPECT_EQ(recompute({"remat_policy=full"}),
            t.L * (minimal + t.qkv_gemms() + t.rope(t.Q) + t.rope(t.K) + t.out_gemm() + 2 * t.wi_gemm()));
  EXPECT_EQ(recompute({"remat_policy=minimal"}), t.L * minimal);
  // Unnamed in the custom policy: out_proj and mlpwi_1 recomputed.
  EXPECT_EQ(recompute({"remat_policy=custom", "query_proj=offload", "key_proj=offload", "value_proj=device", "mlpwi_0=device"}),
            t.L * (minimal + t.out_gemm() + t.wi_gemm()));
  // Seed 001 keeps x + out_proj itself (TransformerAttentionLayer.residual_add), not out_proj: no add again.
  EXPECT_EQ(recompute(kSeedPolicy), t.L * (minimal - t.residual_add()));
  // Fused, minimal keeps qkv_proj from before RoPE: q's and k's RoPE again.
  EXPECT_EQ(recompute({"remat_policy=minimal", "fused_mlp=true", "fused_qkv=true"}), t.L * (minimal + t.rope(t.Q) + t.rope(t.K)));
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
