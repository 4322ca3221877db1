// `remat plan` of llama2-70b at tensor 8 x pipeline 8 x FSDP 4 (1f1b, 8 microbatches of 1 x 4096 tokens, bf16
// compute, remat_policy full), from shapes alone: every rank's parameter bytes and communication per step,
// derived here from the model's dimensions and the layout's rules, not read back from the planner:
//   - parameters: 4 bytes per element over the product of the degrees that shard it (a kernel: tensor and
//     FSDP; a norm scale: FSDP), the stage's 10 layers, the embedding on the first stage, the final norm and
//     logits kernel on the last;
//   - tensor: per microbatch and layer, the attention and MLP blocks' row-parallel sums (all-reduces of the
//     [B,T,D] bf16 partial output), the attention block's run again by the full recomputation (the MLP block's
//     feeds only the layer's output, which the next layer keeps), and the all-reduces of the replicated
//     block inputs' gradients; the vocabulary-parallel embedding's sum; the cross-entropy's maxima gathered and
//     sum-exp and target logit all-reduced (f32 [B,T]), and the logits input's gradient all-reduced; the global
//     norm's per-(layer, embed row) partial sums of the tensor-sharded parameters all-reduced;
//   - FSDP: ZeRO-3's per microbatch (each layer's weights gathered for the forward and again for the
//     recomputation, bf16 kernels and f32 norm scales; each gradient reduce-scattered), the global norm's
//     partial sums gathered, the loss all-reduced;
//   - stage: one [B,T,D] bf16 activation per microbatch to the next stage and its gradient back; the global
//     norm's partial sums of every parameter and the loss all-reduced over the stages.
#include "cli/commands.h"
#include "cli/config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>

namespace remat::cli {
namespace {

constexpr int64_t kTensor = 8, kStages = 8, kFsdp = 4, kMicrobatches = 8, kLayersPerStage = 80 / kStages;

Config layout() {
  return load_config(std::string(REMAT_TEST_DATA) + "/../configs/base.yml",
                     {"model=llama2-70b", "per_device_batch_size=1", "max_target_length=4096", "dtype=bfloat16",
                      fmt::format("ici_tensor_parallelism={}", kTensor), fmt::format("ici_pipeline_parallelism={}", kStages),
                      fmt::format("ici_fsdp_parallelism={}", kFsdp), "pipeline_schedule=1f1b"});  // the command
}

struct Totals {
  double count = 0, bytes = 0, sent = 0;
};
struct Expected {
  Totals all, recomputed;
};
using Table = std::map<std::pair<std::string, std::string>, Expected>;  // (axis, collective)

// `count` collectives of `bytes` operand bytes each, of which each device sends `share` x bytes.
void add(Table& t, const std::string& axis, const std::string& op, double count, double bytes, double share,
         bool recomputed = false) {
  for (Totals* x : {&t[{axis, op}].all, recomputed ? &t[{axis, op}].recomputed : nullptr}) {
    if (x == nullptr) continue;
    x->count += count;
    x->bytes += count * bytes;
    x->sent += count * bytes * share;
  }
}

double all_reduce_share(double n) { return 2 * (n - 1) / n; }

class TensorPipelineFsdpPlan : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { plan_ = new nlohmann::json(nlohmann::json::parse(plan_report(layout(), true, "", nullptr))); }
  static void TearDownTestSuite() { delete plan_; }
  static const nlohmann::json& rank(int64_t r) { return plan_->at("pipeline").at("ranks").at(static_cast<size_t>(r)); }
  static nlohmann::json* plan_;
};
nlohmann::json* TensorPipelineFsdpPlan::plan_ = nullptr;

TEST_F(TensorPipelineFsdpPlan, ParameterBytesAreEachShardsOwn) {
  const nn::ModelConfig m = layout().run.model;
  const double D = static_cast<double>(m.emb_dim), H = static_cast<double>(m.num_heads),
               KV = static_cast<double>(m.num_kv_heads), Dh = static_cast<double>(m.head_dim),
               F = static_cast<double>(m.mlp_dim), V = static_cast<double>(m.vocab_size);
  const double kernel = kTensor * kFsdp, norm = kFsdp;  // the degrees that shard each
  const double layer = 4 * (D * H * Dh + 2 * D * KV * Dh + H * Dh * D + 3 * D * F) / kernel + 4 * 2 * D / norm;
  ASSERT_EQ(plan_->at("pipeline").at("ranks").size(), static_cast<size_t>(kStages));
  for (int64_t r = 0; r < kStages; ++r) {
    double want = kLayersPerStage * layer;
    if (r == 0) want += 4 * V * D / kernel;                           // the embedding
    if (r == kStages - 1) want += 4 * D / norm + 4 * D * V / kernel;  // the final norm, the logits kernel
    EXPECT_EQ(rank(r).at("arguments").at("parameters").get<double>(), want) << "rank " << r;
  }
}

TEST_F(TensorPipelineFsdpPlan, CommunicationPerStepIsTheLayoutsFormula) {
  const nn::ModelConfig m = layout().run.model;
  const double D = static_cast<double>(m.emb_dim), H = static_cast<double>(m.num_heads),
               KV = static_cast<double>(m.num_kv_heads), Dh = static_cast<double>(m.head_dim),
               F = static_cast<double>(m.mlp_dim), V = static_cast<double>(m.vocab_size),
               L = static_cast<double>(m.num_decoder_layers);
  const double B = 1, T = 4096, t = kTensor, f = kFsdp, p = kStages, M = kMicrobatches, Ls = kLayersPerStage;
  const double activation = 2 * B * T * D;  // bf16 [B,T,D]
  // One layer's matmul kernels' elements (q, k, v, out, wi_0, wi_1, wo) and its two norm scales.
  const std::vector<double> kernels = {D * H * Dh, D * KV * Dh, D * KV * Dh, H * Dh * D, D * F, D * F, F * D};
  const std::string fsdp = "fsdp";
  for (int64_t r = 0; r < kStages; ++r) {
    const bool first = r == 0, last = r == kStages - 1;
    Table want;
    // tensor
    add(want, "tensor", "all_reduce", 2 * M * Ls, activation, all_reduce_share(t));        // the blocks' sums
    // Recomputed: the attention block's (the MLP block's feeds only the layer's output, the next layer's input,
    // which the full policy keeps).
    add(want, "tensor", "all_reduce", M * Ls, activation, all_reduce_share(t), true);
    add(want, "tensor", "all_reduce", 2 * M * Ls, activation, all_reduce_share(t));        // the inputs' gradients
    if (first) add(want, "tensor", "all_reduce", M, activation, all_reduce_share(t));      // the embedding's sum
    if (last) {
      add(want, "tensor", "all_gather", M, 4 * B * T, t - 1);                 // the maxima
      add(want, "tensor", "all_reduce", 2 * M, 4 * B * T, all_reduce_share(t));  // sum-exp, the target's logit
      add(want, "tensor", "all_reduce", M, activation, all_reduce_share(t));  // the logits input's gradient
    }
    // The global norm: per (layer, embed row) of the 7 tensor-sharded kernels, per embed row of the embedding and
    // the logits kernel, whichever stage holds them.
    add(want, "tensor", "all_reduce", 7, 4 * L * D, all_reduce_share(t));
    add(want, "tensor", "all_reduce", 2, 4 * D, all_reduce_share(t));
    // FSDP
    for (double k : kernels) {
      add(want, fsdp, "all_gather", M * Ls, 2 * k / (t * f), f - 1);
      add(want, fsdp, "all_gather", M * Ls, 2 * k / (t * f), f - 1, true);
      add(want, fsdp, "reduce_scatter", M * Ls, 2 * k / t, (f - 1) / f);
      add(want, fsdp, "all_gather", 1, 4 * Ls * D / f, f - 1);  // the norm's partial sums
    }
    for (int norm = 0; norm < 2; ++norm) {
      add(want, fsdp, "all_gather", M * Ls, 4 * D / f, f - 1);
      add(want, fsdp, "all_gather", M * Ls, 4 * D / f, f - 1, true);
      add(want, fsdp, "reduce_scatter", M * Ls, 4 * D, (f - 1) / f);
      add(want, fsdp, "all_gather", 1, 4 * Ls * D / f, f - 1);
    }
    if (first) {  // the embedding, gathered in f32
      add(want, fsdp, "all_gather", M, 4 * V * D / (t * f), f - 1);
      add(want, fsdp, "reduce_scatter", M, 4 * V * D / t, (f - 1) / f);
      add(want, fsdp, "all_gather", 1, 4 * D / f, f - 1);
    }
    if (last) {  // the final norm (f32) and the logits kernel (bf16)
      add(want, fsdp, "all_gather", M, 4 * D / f, f - 1);
      add(want, fsdp, "reduce_scatter", M, 4 * D, (f - 1) / f);
      add(want, fsdp, "all_gather", M, 2 * D * V / (t * f), f - 1);
      add(want, fsdp, "reduce_scatter", M, 2 * D * V / t, (f - 1) / f);
      add(want, fsdp, "all_gather", 2, 4 * D / f, f - 1);
    }
    add(want, fsdp, "all_reduce", 1, 4, all_reduce_share(f));  // the loss
    // stage
    const double messages = M * (first || last ? 1 : 2);
    add(want, "stage", "send", messages, activation, 1);
    add(want, "stage", "recv", messages, activation, 0);
    add(want, "stage", "all_reduce", 1, 4, all_reduce_share(p));                   // the loss
    add(want, "stage", "all_reduce", 9, 4 * L * D, all_reduce_share(p));           // a layer's parameters
    add(want, "stage", "all_reduce", 3, 4 * D, all_reduce_share(p));               // embedding, final norm, logits

    const nlohmann::json& got = rank(r).at("communication").at("by_axis");
    size_t rows = 0;
    for (const auto& [axis, ops] : got.items()) rows += ops.size();
    EXPECT_EQ(rows, want.size()) << "rank " << r << ": " << got.dump();
    for (const auto& [kind, w] : want) {
      const auto& [axis, op] = kind;
      ASSERT_TRUE(got.contains(axis) && got.at(axis).contains(op)) << "rank " << r << ": no " << axis << " " << op;
      const nlohmann::json& row = got.at(axis).at(op);
      for (const auto& [name, want_part, got_part] :
           {std::tuple{"all", w.all, row}, std::tuple{"recomputed", w.recomputed, row.at("recomputed")}}) {
        EXPECT_EQ(got_part.at("count").get<double>(), want_part.count) << "rank " << r << " " << axis << " " << op << " " << name;
        EXPECT_DOUBLE_EQ(got_part.at("bytes").get<double>(), want_part.bytes) << "rank " << r << " " << axis << " " << op << " " << name;
        EXPECT_NEAR(got_part.at("sent").get<double>(), want_part.sent, 1e-9 * want_part.sent)
            << "rank " << r << " " << axis << " " << op << " " << name;
      }
    }
  }
}

}  // namespace
}  // namespace remat::cli
