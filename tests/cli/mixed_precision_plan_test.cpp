// Seed 004's claim, measured by `remat plan`: casting every layer's weights to bf16 before the layer loop
// (mp_cast=upfront) keeps (L - 1) x (one layer's bf16 weights) more memory live at the peak than casting
// each layer's weights inside the scanned body (mp_cast=per_layer) — exactly under remat full, and more where
// a layer's backward peaks before it needs its query, key and value kernels. Both modes compute the same
// numbers: their losses and gradients are bit-identical.
#include "cli/commands.h"
#include "cli/config.h"
#include "exec/exec.h"
#include "train/step.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

namespace remat::cli {
namespace {

Config tiny_bf16(const std::string& mp_cast, const std::vector<std::string>& more = {}) {
  std::vector<std::string> overrides{"dtype=bfloat16", "mp_cast=" + mp_cast};
  overrides.insert(overrides.end(), more.begin(), more.end());
  return load_config(std::string(REMAT_TEST_DATA) + "/../configs/base.yml", overrides);
}

int64_t planned_total(const Config& c) {
  return nlohmann::json::parse(plan_report(c, true, "", nullptr))["total"].get<int64_t>();
}

nlohmann::json peak(const Config& c) { return nlohmann::json::parse(plan_report(c, true, "", nullptr))["peak"]; }

// The bf16 bytes of one layer's weights that matmuls read (the RMSNorm scales stay f32 in both modes).
int64_t layer_kernel_bytes(const nn::ModelConfig& m) {
  const int64_t D = m.emb_dim, H = m.num_heads, KV = m.num_kv_heads, Dh = m.head_dim, F = m.mlp_dim;
  return 2 * (D * H * Dh + 2 * D * KV * Dh + H * Dh * D + 3 * D * F);
}

// tiny: D=128, H=KV=4, Dh=32, F=512, L=4, batch 16 x 128, remat full.
//   one layer's kernels: q, k, v, out 4 x 128*128 = 65,536 + wi_0, wi_1, wo 3 x 128*512 = 196,608
//   = 262,144 weights x 2 B = 524,288 B (512 KiB).
// upfront: the stacked bf16 copy of all 4 layers (2 MiB) is live from before the forward scan to the end
//   of the backward scan, which holds the peak (the backward body's sub-arena).
// per_layer: the backward body casts its layer's kernels into two buffers (convert_groups: q, k and v's, and the
//   rest), 512 KiB together, both live across the body's peak under remat full; nothing else differs (the
//   weight gradients leave the backward body in f32 in both modes, and the RMSNorm scales are not cast).
// Difference at the peak: 4 x 524,288 - 524,288 = 3 x 524,288 = 1,572,864 B.
TEST(MixedPrecisionPlan, UpfrontCastKeepsLMinusOneLayersOfBf16WeightsMoreAtThePeak) {
  Config per_layer = tiny_bf16("per_layer"), upfront = tiny_bf16("upfront");
  ASSERT_TRUE(per_layer.run.model.scan_layers);
  const int64_t L = per_layer.run.model.num_decoder_layers, w = layer_kernel_bytes(per_layer.run.model);
  ASSERT_EQ(L, 4);
  ASSERT_EQ(w, 524288);
  EXPECT_EQ(planned_total(upfront) - planned_total(per_layer), (L - 1) * w);
  EXPECT_EQ((L - 1) * w, 1572864);
  // The report names the cause: at the peak, upfront's stacked copy (L x 512 KiB) is "weight copies";
  // per_layer's one layer's copy is inside the backward body's sub-arena (temporaries).
  EXPECT_EQ(peak(upfront)["weight_copies"].get<int64_t>(), L * w);
  EXPECT_EQ(peak(per_layer)["weight_copies"].get<int64_t>(), 0);
  EXPECT_EQ(peak(upfront)["temporaries"].get<int64_t>() + w, peak(per_layer)["temporaries"].get<int64_t>());
}

// The same arithmetic with 8 layers (7 x 512 KiB), under remat_policy=minimal (the backward body's peak
// moves, the layer's copy is still live across it), and on llama2-7b at 1 x 4096 tokens: 31 layers x
// 2 B x (4 x 4096^2 + 3 x 4096 x 11008) = 31 x 404,750,336 B = 12,547,260,416 B (11.69 GiB).
TEST(MixedPrecisionPlan, TheDifferenceScalesWithLayersAndHoldsUnderOtherPolicies) {
  for (const std::vector<std::string>& more :
       {std::vector<std::string>{"base_num_decoder_layers=8"}, std::vector<std::string>{"remat_policy=minimal"},
        std::vector<std::string>{"model=llama2-7b", "per_device_batch_size=1", "max_target_length=4096"}}) {
    Config per_layer = tiny_bf16("per_layer", more), upfront = tiny_bf16("upfront", more);
    const nn::ModelConfig& m = per_layer.run.model;
    const int64_t L = m.num_decoder_layers, w = layer_kernel_bytes(m);
    const int64_t difference = planned_total(upfront) - planned_total(per_layer);
    if (more[0] == "base_num_decoder_layers=8") {
      EXPECT_EQ(difference, (L - 1) * w);
    }
    // minimal keeps the projections, so the backward body reaches its peak (the MLP's backward) before it needs
    // the query, key and value kernels: their bf16 copy (the first of the layer's two) is not made yet there.
    if (more[0] == "remat_policy=minimal") {
      EXPECT_EQ(difference, (L - 1) * w + 2 * m.emb_dim * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim);
    }
    if (more[0] == "model=llama2-7b") {
      EXPECT_GE(difference, (L - 1) * w);
      EXPECT_EQ((L - 1) * w, 12547260416);
    }
  }
}

// Where the cast happens changes memory, not arithmetic: loss and every gradient are bit-identical.
TEST(MixedPrecisionPlan, BothCastPlacementsGiveBitIdenticalLossAndGradients) {
  std::vector<std::vector<exec::Array>> outs;
  for (const char* mode : {"per_layer", "upfront"}) {
    Config c = tiny_bf16(mode, {"per_device_batch_size=2", "max_target_length=32"});
    ir::Graph g = train::grads_program(c.run.model, c.run.shape).graph;
    std::vector<exec::Array> args = nn::init_params(c.run.model, 7);
    for (int k = 0; k < 2; ++k) {
      exec::Array t({DType::i32, {1, 2, 32}});
      for (int64_t i = 0; i < t.size(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + k * 11) % 256);
      args.push_back(t);
    }
    outs.push_back(exec::run(g, args));
  }
  ASSERT_EQ(outs[0].size(), outs[1].size());
  for (size_t i = 0; i < outs[0].size(); ++i) {
    ASSERT_EQ(outs[0][i].type(), outs[1][i].type()) << "result " << i;
    EXPECT_EQ(std::memcmp(outs[0][i].bytes(), outs[1][i].bytes(), static_cast<size_t>(outs[0][i].type().bytes())), 0)
        << "result " << i;
  }
}

}  // namespace
}  // namespace remat::cli
