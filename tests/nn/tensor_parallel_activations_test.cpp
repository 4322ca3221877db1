// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"), Table 2, for remat's
// Llama layer (RMSNorm, RoPE, SwiGLU, grouped-query attention, no dropout): the activation bytes one layer saves
// per device, derived here by hand from what the layer's backward reads, against `remat explain`'s per-layer
// "saved" (its JSON, bytes per step / layers) for t = 1, 2, 4, 8, without parallelism (t = 1), tensor parallel,
// and tensor + sequence parallel, with remat none (everything_saveable: every residual the backward reads is
// kept) and with the attention recomputed (minimal: the projections kept, the attention core, norms and
// elementwise work rerun), in f32 and bf16 compute, for a small GQA model and for llama2-7b (s = 4096, b = 1, bf16).
//
// Notation: s sequence, b microbatch, h = D the model width (= a·Dh here), a = H query heads, k = KV heads, Dh head
// width, F MLP width, t the tensor degree, e the compute dtype's bytes (4 f32, 2 bf16). The norms compute in f32
// but keep no f32 array; float32_qk_product and float32_logits are on (configs/base.yml), so q and k enter
// q·kᵀ in f32 and the scores are f32. Per device a rank holds a/t query heads and F/t of the MLP; k/t kv heads
// when t divides k, else one (Megatron's replication: the kv head its query heads read).
//
// remat none (everything_saveable), per layer, elements x bytes:
//   term (read by)                                               elements        bytes each   without SP | with SP
//   each RMSNorm (2 per layer: the layer input, the residual after attention; one op, whose VJP recomputes
//   the row statistics from its input):
//     its input in the compute dtype (rms_norm_grad's x)         s·b·h           e            1          | 1/t
//     the normed output in the compute dtype (the block's
//       column-parallel matmuls' weight VJPs)                    s·b·h           e            1          | 1 (*)
//   attention:
//     q after RoPE, k after RoPE repeated to a heads, in f32
//       (q·kᵀ's VJPs) (**)                                       2·s·b·a·Dh      4            1/t        | 1/t
//     v repeated to a heads (probs·v's VJP)                      s·b·a·Dh        e            1/t        | 1/t
//     scores (the masked softmax's VJP) and its output           a·s²·b each     4 and e      1/t        | 1/t
//     context (the output projection's weight VJP)               s·b·a·Dh        e            1/t        | 1/t
//   SwiGLU MLP: gate and up (swiglu_grad's operands: it
//     recomputes the logistic and silu), silu·up (wo's VJP)      3·s·b·F         e            1/t        | 1/t
//   (*) Under SP the norm runs on s/t and its output is all-gathered before the block's matmuls; the weight
//       VJPs read the gathered [b,s,h] copy, which remat saves (Megatron saves the s/t slice and gathers again in
//       the backward): this term does not shrink with t.
//   (**) with a = k (no GQA) the repeat is the identity and k itself (named key_proj) is saved.
// In Korthikanti's form (h = a·Dh), bf16 (e = 2), without SP:
//   s·b·h·(8 + (12 + 6·F/h)/t + 6·a·s/(h·t))
// with SP:
//   s·b·h·(4/t + 4 + (12 + 6·F/h)/t + 6·a·s/(h·t))
// (f32, e = 4: 16 + (16 + 12·F/h)/t + 8·a·s/(h·t) without SP.)
//
// attention recomputed (minimal: save_only_these_names query_proj, key_proj, value_proj, out_proj, mlpwi_0,
// mlpwi_1), per layer:
//   the layer input (the region's input, always kept)            s·b·h           e            1          | 1/t
//   query_proj (q after RoPE)                                    s·b·a·Dh        e            1/t        | 1/t
//   key_proj, value_proj (this rank's kv heads)                  2·s·b·k·Dh      e            1/t (***)  | 1/t (***)
//   out_proj (the attention block's output summed over tensor,
//     as the layer adds it) (****)                               s·b·h           e            1          | 1/t
//   mlpwi_0, mlpwi_1                                             2·s·b·F         e            1/t        | 1/t
//   (***) max(k/t, 1)/k: the replicated kv heads when t > k.
//   (****) Megatron saves no output projection. remat's out_proj is the value after the all-reduce or
//       reduce-scatter (the logical value JAX names): under SP a rank keeps its s/t slice of the sum, and saving it
//       spares the recomputation that collective.
// In Korthikanti's form (h = a·Dh, k = a): s·b·h·e·(2 + (3 + 2·F/h)/t) without SP, s·b·h·e·(5 + 2·F/h)/t with SP.
#include "cli/commands.h"
#include "cli/config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace remat {
namespace {

// A small GQA model that t = 1, 2, 4, 8 all divide (heads 8, MLP 128, vocabulary 256, sequence 32); kv heads 2:
// split at t = 2, replicated (one per rank) at t = 4 and 8.
struct Layer {
  int64_t s = 32, b = 2, h = 64, a = 8, k = 2, dh = 8, f = 128, layers = 2;
  std::string model;  // a named model of these dimensions instead of the overrides
};

// llama2-7b at s = 4096, b = 1 (no GQA: a = k = 32, so t > k never occurs and k's repeat is the identity).
const Layer kLlama2_7b{.s = 4096, .b = 1, .h = 4096, .a = 32, .k = 32, .dh = 128, .f = 11008, .layers = 32,
                       .model = "llama2-7b"};

struct Case {
  std::string policy;  // everything_saveable (remat none) or minimal (attention recomputed)
  int64_t t = 1;
  bool sequence_parallel = false;
  int64_t e = 4;  // compute dtype bytes
};

// The formula of the header's tables.
double expected_saved_per_layer(const Layer& l, const Case& c) {
  const double t = static_cast<double>(c.t), e = static_cast<double>(c.e), s = static_cast<double>(l.s),
               b = static_cast<double>(l.b), h = static_cast<double>(l.h), a = static_cast<double>(l.a),
               dh = static_cast<double>(l.dh), f = static_cast<double>(l.f);
  const double sp = c.sequence_parallel ? 1.0 / t : 1.0;  // what runs between the blocks: the sequence split or not
  const double kv = static_cast<double>(std::max<int64_t>(l.k / c.t, 1));  // this rank's kv heads
  if (c.policy == "minimal")
    return e * (s * b * h * sp + s * b * a * dh / t + 2 * s * b * kv * dh + s * b * h * sp + 2 * s * b * f / t);
  const double norm = e * s * b * h * sp + e * s * b * h;
  const double attention = (2 * s * b * a * dh * 4 + 2 * s * b * a * dh * e + a * s * s * b * (4 + e)) / t;
  const double mlp = 3 * s * b * f * e / t;
  return 2 * norm + attention + mlp;
}

double explained_saved_per_layer(const Layer& l, const Case& c) {
  std::vector<std::string> overrides = {
      fmt::format("per_device_batch_size={}", l.b), fmt::format("max_target_length={}", l.s),
      fmt::format("remat_policy={}", c.policy), c.e == 2 ? "dtype=bfloat16" : "dtype=float32",
      fmt::format("{}={}", c.sequence_parallel ? "ici_tensor_sequence_parallelism" : "ici_tensor_parallelism", c.t)};
  const std::vector<std::string> dimensions =
      !l.model.empty() ? std::vector<std::string>{"model=" + l.model}
                       : std::vector<std::string>{fmt::format("base_emb_dim={}", l.h),
                                                  fmt::format("base_num_decoder_layers={}", l.layers),
                                                  fmt::format("base_num_query_heads={}", l.a),
                                                  fmt::format("base_num_kv_heads={}", l.k),
                                                  fmt::format("head_dim={}", l.dh), fmt::format("base_mlp_dim={}", l.f),
                                                  "vocab_size=256"};
  overrides.insert(overrides.begin(), dimensions.begin(), dimensions.end());  // the model first: the rest override it
  const nlohmann::json j = nlohmann::json::parse(cli::explain_report(cli::load_config("", overrides), true));
  return j["bytes_per_step"]["saved"].get<double>() / static_cast<double>(l.layers);  // scanned: one region
}

class Table2 : public testing::TestWithParam<std::tuple<std::string, int64_t, bool, int64_t>> {};

TEST_P(Table2, ExplainSavesTheDerivedBytesPerLayerPerDevice) {
  const auto [policy, t, sequence_parallel, e] = GetParam();
  const Case c{policy, t, sequence_parallel, e};
  EXPECT_EQ(explained_saved_per_layer(Layer{}, c), expected_saved_per_layer(Layer{}, c));
  if (e == 2) {  // the realistic shape in its training dtype
    EXPECT_EQ(explained_saved_per_layer(kLlama2_7b, c), expected_saved_per_layer(kLlama2_7b, c));
  }
}

INSTANTIATE_TEST_SUITE_P(PoliciesDegreesLayoutsDtypes, Table2,
                         testing::Combine(testing::Values("everything_saveable", "minimal"),
                                          testing::Values(1, 2, 4, 8), testing::Bool(), testing::Values(4, 2)),
                         [](const testing::TestParamInfo<std::tuple<std::string, int64_t, bool, int64_t>>& i) {
                           return fmt::format("{}_t{}{}_{}", std::get<0>(i.param), std::get<1>(i.param),
                                              std::get<2>(i.param) ? "_sequence" : "",
                                              std::get<3>(i.param) == 2 ? "bf16" : "f32");
                         });

}  // namespace
}  // namespace remat
