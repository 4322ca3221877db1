// One device's plan under FSDP, from shapes alone (`remat plan ici_fsdp_parallelism=N`, no ranks launched), for
// llama2-70b at 1 x 4096 tokens in bf16 compute, N = 8, 64, 1024. Each claim is derived here from the model's
// dimensions, not read back from the planner:
//   - parameters and Adam moments are exactly 1/N of one device's (4 and 8 bytes per parameter);
//   - mp_cast=upfront keeps L x (one layer's local bf16 kernel shards) more live at the peak than per_layer,
//     which casts each layer's shard straight into its place in the gathered buffer (no bf16 shard copy,
//     not even of the layer being gathered), all of it as "weight copies";
//   - communication is ZeRO-3's: each layer's weights all-gathered twice (forward, and the backward's
//     recomputation), kernels in bf16, norm scales in f32, and their gradients reduce-scattered once (bf16
//     kernel gradients, summed in f32 on arrival); the embedding, final norm and logits kernel gathered once
//     and reduce-scattered once; the global norm's partial sums gathered (one f32 per embed row per
//     parameter); the loss all-reduced.
#include "cli/commands.h"
#include "cli/config.h"
#include "nn/nn.h"
#include "trainer/trainer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace remat::cli {
namespace {

Config llama70b(int64_t fsdp, const std::string& mp_cast = "per_layer") {
  return load_config(std::string(REMAT_TEST_DATA) + "/../configs/base.yml",
                     {"model=llama2-70b", "per_device_batch_size=1", "max_target_length=4096", "dtype=bfloat16",
                      fmt::format("ici_fsdp_parallelism={}", fsdp), "mp_cast=" + mp_cast});
}

nlohmann::json plan_of(const Config& c) { return nlohmann::json::parse(plan_report(c, true, "", nullptr)); }

int64_t peak_bytes(const nlohmann::json& plan) {
  int64_t sum = 0;
  for (const auto& [category, bytes] : plan.at("peak").items())
    if (category != "step") sum += bytes.get<int64_t>();
  return sum;
}

// One layer's matmul kernels, bf16 bytes: q, k, v, out and wi_0, wi_1, wo.
int64_t layer_kernel_bytes(const nn::ModelConfig& m) {
  const int64_t D = m.emb_dim, H = m.num_heads, KV = m.num_kv_heads, Dh = m.head_dim, F = m.mlp_dim;
  return 2 * (D * H * Dh + 2 * D * KV * Dh + H * Dh * D + 3 * D * F);
}

class FsdpPlan : public ::testing::TestWithParam<int64_t> {};

TEST_P(FsdpPlan, ParametersAndMomentsAreOneNth) {
  const int64_t n = GetParam();
  const nlohmann::json peak = plan_of(llama70b(n)).at("peak");
  const int64_t params = nn::param_count(llama70b(1).run.model);
  ASSERT_EQ(params % n, 0);
  EXPECT_EQ(peak.at("parameters").get<int64_t>(), 4 * params / n);
  EXPECT_EQ(peak.at("optimizer_state").get<int64_t>(), 8 * params / n);
}

TEST_P(FsdpPlan, UpfrontKeepsEveryLayersLocalBf16ShardsMore) {
  const int64_t n = GetParam();
  const nlohmann::json per_layer = plan_of(llama70b(n)), upfront = plan_of(llama70b(n, "upfront"));
  const nn::ModelConfig m = llama70b(n).run.model;
  const int64_t L = m.num_decoder_layers, shard = layer_kernel_bytes(m) / n;
  ASSERT_EQ(layer_kernel_bytes(m) % n, 0);
  EXPECT_EQ(peak_bytes(upfront) - peak_bytes(per_layer), L * shard);
  EXPECT_EQ(upfront.at("peak").at("weight_copies").get<int64_t>(), L * shard);
  EXPECT_EQ(per_layer.at("peak").at("weight_copies").get<int64_t>(), 0);
}

TEST_P(FsdpPlan, CommunicationIsZero3s) {
  const int64_t n = GetParam();
  nn::ModelConfig m = llama70b(n).run.model;
  m.mesh = trainer::mesh_of(llama70b(n).run, 0);  // one device of N, as `remat plan` sees it
  const int64_t L = m.num_decoder_layers;
  struct Expected {
    double count = 0, bytes = 0, sent = 0;
  } gather, scatter;
  for (const nn::ParamSpec& p : nn::param_specs(m)) {
    ASSERT_EQ(p.shards, n) << p.path;
    const bool layer = p.path.rfind("decoder/layers/", 0) == 0, kernel = p.path.ends_with("/kernel");
    const double local = static_cast<double>(p.type.num_elements()) / static_cast<double>(layer ? L : 1);
    const double wire = kernel ? 2 : 4;  // kernels cast to bf16 before the gather; the rest gathered in f32
    const double times = layer ? 2.0 * L : 1.0;  // a layer's: forward and recomputation; the others once
    gather.count += times;
    gather.bytes += times * local * wire;
    gather.sent += times * local * wire * static_cast<double>(n - 1);
    scatter.count += layer ? L : 1;
    scatter.bytes += (layer ? L : 1) * local * static_cast<double>(n) * wire;  // the gradient, whole, in its dtype
    scatter.sent += (layer ? L : 1) * local * wire * static_cast<double>(n - 1);
    // The global norm's f32 partial sums: per embed row (and layer, for a layer's parameter).
    const double partials = static_cast<double>(m.emb_dim / n) * static_cast<double>(layer ? L : 1);
    gather.count += 1;
    gather.bytes += 4 * partials;
    gather.sent += 4 * partials * static_cast<double>(n - 1);
  }
  const nlohmann::json c = plan_of(llama70b(n)).at("communication").at("by_op");
  EXPECT_EQ(c.at("all_gather").at("count").get<double>(), gather.count);
  EXPECT_DOUBLE_EQ(c.at("all_gather").at("bytes").get<double>(), gather.bytes);
  EXPECT_DOUBLE_EQ(c.at("all_gather").at("sent").get<double>(), gather.sent);
  EXPECT_EQ(c.at("reduce_scatter").at("count").get<double>(), scatter.count);
  EXPECT_DOUBLE_EQ(c.at("reduce_scatter").at("bytes").get<double>(), scatter.bytes);
  EXPECT_DOUBLE_EQ(c.at("reduce_scatter").at("sent").get<double>(), scatter.sent);
  EXPECT_EQ(c.at("all_reduce").at("count").get<double>(), 1);  // the loss
  EXPECT_EQ(c.at("all_reduce").at("bytes").get<double>(), 4);
}

INSTANTIATE_TEST_SUITE_P(Degrees, FsdpPlan, ::testing::Values(8, 64, 1024));

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    const Config c = load_config(std::string(REMAT_TEST_DATA) + "/../configs/base.yml", overrides);
    plan_report(c, false, "", nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FsdpConfig, ADegreeThatDoesNotDivideAParameterIsRefusedNamingIt) {
  EXPECT_NE(error_of({"ici_fsdp_parallelism=3"})
                .find("parameter token_embedder/embedding (f32[256,128]) cannot be sharded 3 ways along its 'embed' "
                      "dimension of 128: the fsdp parallelism (ici_fsdp_parallelism x dcn_fsdp_parallelism) must "
                      "divide it; 2, 4, 8, 16, 32, 64, 128 divides it"),
            std::string::npos)
      << error_of({"ici_fsdp_parallelism=3"});
  EXPECT_NE(error_of({"ici_fsdp_parallelism=-1"}).find("are both -1"), std::string::npos) << error_of({"ici_fsdp_parallelism=-1"});
}

// The report splits the step at the forward's loss (the program records it, before the sum over the ranks): under
// FSDP each device holds the same activations as one device does (its batch is one device's) and 1/N of each
// gradient, so at the peak "saved residuals" are one device's and "gradients" one N-th of them.
TEST(FsdpPlanCategories, TheLossSplitsTheStepAsOnOneDevice) {
  auto peak = [](int64_t fsdp) {
    const Config c = load_config(std::string(REMAT_TEST_DATA) + "/../configs/base.yml",
                                 {fmt::format("ici_fsdp_parallelism={}", fsdp)});
    return plan_of(c).at("peak");
  };
  const nlohmann::json one = peak(1);
  ASSERT_GT(one.at("saved_residuals").get<int64_t>(), 0);
  ASSERT_GT(one.at("gradients").get<int64_t>(), 0);
  for (const int64_t n : {2, 8}) {
    const nlohmann::json sharded = peak(n);
    EXPECT_EQ(sharded.at("saved_residuals"), one.at("saved_residuals")) << "fsdp " << n;
    EXPECT_EQ(sharded.at("gradients").get<int64_t>() * n, one.at("gradients").get<int64_t>()) << "fsdp " << n;
  }
}

}  // namespace
}  // namespace remat::cli
