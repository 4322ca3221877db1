// MaxText's fused_qkv and fused_mlp: the fused kernel is the stacked unfused ones (init and fuse_params),
// so fused and unfused models train alike; each op runs in the same dtype fused or not (the seed's cast
// fix); the fused residuals carry qkv_proj / mlpwi and minimal keeps the same bytes per layer.
#include "exec/executable.h"
#include "remat/remat.h"
#include "support/models.h"
#include "compile/compile.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <set>
#include <tuple>

namespace remat {
namespace {

nn::ModelConfig model(bool fused_qkv, bool fused_mlp, bool bf16) {
  nn::ModelConfig c = testing_support::small_model(2, true, "full");
  c.fused_qkv = fused_qkv;
  c.fused_mlp = fused_mlp;
  if (bf16) c.precision = nn::parse_precision("p=f32,c=bf16");
  return c;
}

TEST(FusedProjections, InitIsTheStackedUnfusedKernels) {
  nn::ModelConfig plain = model(false, false, false), fused = model(true, true, false);
  std::vector<exec::Array> a = nn::init_params(plain, 7), b = nn::init_params(fused, 7);
  const std::vector<nn::ParamSpec> sa = nn::param_specs(plain), sb = nn::param_specs(fused);
  auto find = [](const std::vector<nn::ParamSpec>& s, const std::string& path) {
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i].path == path) return i;
    ADD_FAILURE() << path;
    return size_t{0};
  };
  const exec::Array& qkv = b[find(sb, "decoder/layers/self_attention/qkv_proj/kernel")];
  const exec::Array& q = a[find(sa, "decoder/layers/self_attention/query/kernel")];
  const exec::Array& k = a[find(sa, "decoder/layers/self_attention/key/kernel")];
  const exec::Array& v = a[find(sa, "decoder/layers/self_attention/value/kernel")];
  EXPECT_EQ(ir::type_str(qkv.type()), "f32[2,32,8,8]");  // [L, D, H + 2KV, Dh]
  // qkv[l, d, j, e] = q[l, d, j, e] for j < H, then k, then v (H = 4, KV = 2, Dh = 8).
  for (int64_t ld = 0; ld < 2 * 32; ++ld)
    for (int64_t j = 0; j < 8; ++j)
      for (int64_t e = 0; e < 8; ++e) {
        const double want = j < 4 ? q.get((ld * 4 + j) * 8 + e) : j < 6 ? k.get((ld * 2 + j - 4) * 8 + e) : v.get((ld * 2 + j - 6) * 8 + e);
        ASSERT_EQ(qkv.get((ld * 8 + j) * 8 + e), want) << ld << " " << j << " " << e;
      }
  const exec::Array& wi = b[find(sb, "decoder/layers/mlp/wi/kernel")];
  const exec::Array& w0 = a[find(sa, "decoder/layers/mlp/wi_0/kernel")];
  const exec::Array& w1 = a[find(sa, "decoder/layers/mlp/wi_1/kernel")];
  EXPECT_EQ(ir::type_str(wi.type()), "f32[2,32,2,64]");  // [L, D, 2, F]
  for (int64_t ld = 0; ld < 2 * 32; ++ld)
    for (int64_t f = 0; f < 64; ++f) {
      ASSERT_EQ(wi.get((ld * 2 + 0) * 64 + f), w0.get(ld * 64 + f));
      ASSERT_EQ(wi.get((ld * 2 + 1) * 64 + f), w1.get(ld * 64 + f));
    }
  EXPECT_EQ(nn::param_count(plain), nn::param_count(fused));
}

// 20 AdamW steps from the same initial weights, fused and unfused: the same losses (f32: within 1e-6
// relative; bf16: within 2e-2, the bf16 rounding of differently blocked matmuls).
std::vector<double> losses(const nn::ModelConfig& c) {
  const train::StepShape shape{2, 16, 1};
  train::OptimizerConfig o;
  o.learning_rate = 1e-2;
  o.warmup_steps = 2;
  o.schedule_steps = 20;
  compile::Compiled s = compile::compile({.model = c, .shape = shape, .optimizer = o});
  const ir::Signature sig = s.signature;
  exec::Executable step(std::move(s.program), std::move(s.plan));
  std::vector<exec::Array>& args = step.own_arguments();  // zeroed: the moments start at 0
  std::vector<exec::Array> params;
  for (size_t i = 0; i < sig.args.size(); ++i)
    if (sig.args[i].role == ir::Role::parameter) params.push_back(args[i]);
  nn::init_params(c, 3, params);
  auto arg = [&](const char* name) -> exec::Array& { return args[static_cast<size_t>(sig.arg(name))]; };
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, 255);
  std::vector<double> out;
  for (int s = 0; s < 20; ++s) {
    int32_t *in = arg("inputs").data<int32_t>(), *tg = arg("targets").data<int32_t>();
    for (int64_t i = 0; i < arg("inputs").size(); ++i) {
      in[i] = tok(rng);
      tg[i] = (in[i] * 7 + 1) % 256;  // a learnable map
    }
    arg("step").set(0, s);
    out.push_back(step.run()[static_cast<size_t>(sig.result("loss"))].get(0));
  }
  return out;
}

class FusedTraining : public testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(FusedTraining, SameLossesAsUnfusedOverTwentySteps) {
  auto [qkv, mlp, bf16] = GetParam();
  std::vector<double> want = losses(model(false, false, bf16)), got = losses(model(qkv, mlp, bf16));
  const double tolerance = bf16 ? 2e-2 : 1e-6;
  for (size_t s = 0; s < want.size(); ++s) EXPECT_NEAR(got[s], want[s], tolerance * want[s]) << "step " << s + 1;
  EXPECT_LT(want.back(), want.front()) << "it learns";
}

INSTANTIATE_TEST_SUITE_P(Fusions, FusedTraining,
                         testing::Values(std::tuple(true, false, false), std::tuple(false, true, false),
                                         std::tuple(true, true, false), std::tuple(true, true, true)),
                         [](const testing::TestParamInfo<std::tuple<bool, bool, bool>>& i) {
                           return fmt::format("{}{}{}", std::get<0>(i.param) ? "qkv_" : "", std::get<1>(i.param) ? "mlp_" : "",
                                              std::get<2>(i.param) ? "bf16" : "f32");
                         });

// Which dtypes each kind of op runs in: (op, its operands' dtypes -> its results' dtypes, each a set: a
// convert_group casts 7 kernels unfused, 4 fused), over the whole step.
void dtype_signatures(const ir::Graph& g, std::set<std::string>& out) {
  for (const ir::Node& n : g.nodes) {
    std::set<std::string> in, result;
    for (ir::ValueId v : n.inputs) in.emplace(dtype_name(g.type(v).dtype));
    for (ir::ValueId v : n.outputs) result.emplace(dtype_name(g.type(v).dtype));
    out.insert(fmt::format("{}({}) -> {}", ir::op_name(n.op), fmt::join(in, " "), fmt::join(result, " ")));
    if (n.body) dtype_signatures(*n.body, out);
  }
}

TEST(FusedProjections, EachOpRunsInTheSameDtypeFusedOrNot) {
  for (bool qk_f32 : {true, false})
    for (bool logits_f32 : {false, true}) {
      std::set<std::string> plain, fused;
      nn::ModelConfig a = model(false, false, true), b = model(true, true, true);
      for (nn::ModelConfig* c : {&a, &b}) {
        c->float32_qk_product = qk_f32;
        c->logits_dot_in_fp32 = logits_f32;
      }
      dtype_signatures(train::grads_program(a, {2, 16, 1}).graph, plain);
      dtype_signatures(train::grads_program(b, {2, 16, 1}).graph, fused);
      // Only the fused step slices its projections' results (q, k, v; gate and up): those slices and their VJPs,
      // bf16 zeros updated at i32 starts.
      for (const char* slicing : {"slice(bf16) -> bf16", "dynamic_update_slice(bf16 i32) -> bf16", "full() -> i32",
                                  "full() -> bf16"})
        if (!plain.count(slicing)) fused.erase(slicing);
      std::vector<std::string> only_plain, only_fused;
      std::ranges::set_difference(plain, fused, std::back_inserter(only_plain));
      std::ranges::set_difference(fused, plain, std::back_inserter(only_fused));
      EXPECT_TRUE(only_plain.empty() && only_fused.empty())
          << "unfused only: " << fmt::format("{}", fmt::join(only_plain, "; ")) << "\nfused only: "
          << fmt::format("{}", fmt::join(only_fused, "; ")) << "\nfloat32_qk_product=" << qk_f32
          << " logits_dot_in_fp32=" << logits_f32;
      EXPECT_TRUE(fused.count("dot_general(bf16) -> bf16")) << "the fused projections run in bf16";
      EXPECT_TRUE(fused.count("swiglu(bf16) -> bf16")) << "SwiGLU in the compute dtype, as unfused";
    }
}

// The fused residuals under minimal: mlpwi [B,T,2,F] and qkv_proj [B,T,H+2KV,Dh] are saved; per layer the
// same bytes as unfused minimal (the same tensors, grouped).
TEST(FusedProjections, MinimalSavesTheFusedTensorsAndTheSameBytes) {
  auto saved = [](bool fused) {
    nn::ModelConfig c = model(fused, fused, false);
    c.remat_policy = nn::parse_remat_policy("minimal", c);
    rematerialize::Decider d;
    train::grads_program(c, {2, 16, 1}, &d);
    std::map<std::string, std::string> out;  // name -> type
    int64_t bytes = 0;
    for (const rematerialize::ResidualRecord& r : d.records())
      if (r.residency == rematerialize::Residency::save && !r.region_input && !r.alias) {
        out[r.what] = ir::type_str(r.type);
        bytes += r.type.bytes();
      }
    return std::pair(out, bytes);
  };
  auto [fused, fused_bytes] = saved(true);
  auto [plain, plain_bytes] = saved(false);
  EXPECT_EQ(fused, (std::map<std::string, std::string>{{"qkv_proj", "f32[2,16,8,8]"}, {"mlpwi", "f32[2,16,2,64]"},
                                                       {"out_proj", "f32[2,16,32]"}}));
  EXPECT_EQ(plain.count("query_proj") + plain.count("key_proj") + plain.count("value_proj") + plain.count("mlpwi_0") +
                plain.count("mlpwi_1"),
            5u);
  EXPECT_EQ(fused_bytes, plain_bytes);
}

TEST(FusedProjections, UnfusedNamesUnderAFusionAreLintErrors) {
  nn::ModelConfig c = model(true, true, false);
  c.remat_policy = nn::parse_remat_policy("save_only_these_names(query_proj, mlpwi_0)", c);
  try {
    rematerialize::lint(nn::loss_graph(c, 2, 16), c.remat_policy, {});
    FAIL() << "lint accepted names the fused layer does not have";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("name 'query_proj' matches no checkpoint name in the model; the names are: "
                                         "context, decoder_layer_input, mlpwi, mlpwo, out_proj, qkv_proj"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace remat
