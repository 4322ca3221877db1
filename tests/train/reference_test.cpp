// The decoder and the training step against PyTorch (tests/ref/llama_ref.py, float64 reference):
// logits, loss, every gradient, and the loss after each of 5 AdamW updates with clipping and the
// warmup + cosine schedule. Tolerances: |ours - ref| <= rtol * |ref| + atol, with
//   logits, loss: rtol 1e-5, atol 1e-6;   gradients: rtol 1e-4, atol 1e-6 * max|ref| of that tensor;
//   post-AdamW losses, learning rates and gradient norms: rtol 1e-5.
#include "support/filecheck.h"
#include "train/step.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace remat {
namespace {

struct Reference {
  nlohmann::json config;
  std::map<std::string, exec::Array> tensors;
};

Reference load() {
  std::string bytes = testing_support::read_file(std::string(REMAT_TEST_DATA) + "/ref/llama_tiny.bin");
  Reference r;
  EXPECT_EQ(bytes.substr(0, 8), "RMTREF01");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + 8, 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(16, n));
  r.config = header["config"];
  const char* data = bytes.data() + 16 + n;
  for (const auto& t : header["tensors"]) {
    ir::Shape shape = t["shape"].get<ir::Shape>();
    exec::Array a(ir::Type{t["dtype"] == "i32" ? DType::i32 : DType::f32, shape});
    std::memcpy(a.bytes(), data + t["offset"].get<size_t>(), static_cast<size_t>(a.type().bytes()));
    r.tensors.emplace(t["name"].get<std::string>(), a);
  }
  return r;
}

nn::ModelConfig model_of(const nlohmann::json& c, bool scan) {
  nn::ModelConfig m;
  m.vocab_size = c["vocab_size"];
  m.emb_dim = c["emb_dim"];
  m.num_decoder_layers = c["num_decoder_layers"];
  m.num_heads = c["num_heads"];
  m.num_kv_heads = c["num_kv_heads"];
  m.head_dim = c["head_dim"];
  m.mlp_dim = c["mlp_dim"];
  m.rope_theta = c["rope_theta"];
  m.rms_eps = c["rms_eps"];
  m.scan_layers = scan;
  return m;
}

void expect_close(const exec::Array& ours, const exec::Array& ref, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  int bad = 0;
  for (int64_t i = 0; i < ref.size() && bad < 5; ++i) {
    double a = ours.get(i), b = ref.get(i);
    if (std::abs(a - b) > rtol * std::abs(b) + atol) {
      ADD_FAILURE() << what << "[" << i << "]: ours " << a << " vs reference " << b;
      ++bad;
    }
  }
}

double max_abs(const exec::Array& a) {
  double m = 0;
  for (int64_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a.get(i)));
  return m;
}

class Reference_ : public testing::TestWithParam<bool> {};

TEST_P(Reference_, LogitsLossAndGradientsMatchPyTorch) {
  Reference r = load();
  nn::ModelConfig m = model_of(r.config, GetParam());
  std::vector<exec::Array> args;
  for (const nn::ParamSpec& p : nn::param_specs(m)) args.push_back(r.tensors.at("params/" + p.path));
  const exec::Array& inputs = r.tensors.at("inputs");
  const exec::Array& targets = r.tensors.at("targets");
  const int64_t B = inputs.type().shape[0], T = inputs.type().shape[1];

  std::vector<exec::Array> fwd_args = args;
  fwd_args.push_back(inputs);
  fwd_args.push_back(targets);
  std::vector<exec::Array> fwd = exec::run(nn::loss_graph(m, B, T, nn::LossResults::loss_and_logits), fwd_args);
  expect_close(fwd[0], r.tensors.at("loss"), 1e-5, 1e-6, "loss");
  expect_close(fwd[1], r.tensors.at("logits"), 1e-5, 1e-6, "logits");

  std::vector<exec::Array> grad_args = args;
  grad_args.push_back(inputs.view({DType::i32, {1, B, T}}));
  grad_args.push_back(targets.view({DType::i32, {1, B, T}}));
  std::vector<exec::Array> grads = exec::run(train::grads_program(m, {B, T, 1}).graph, grad_args);
  std::vector<nn::ParamSpec> specs = nn::param_specs(m);
  for (size_t i = 0; i < specs.size(); ++i) {
    const exec::Array& ref = r.tensors.at("grads/" + specs[i].path);
    expect_close(grads[1 + i], ref, 1e-4, 1e-6 * max_abs(ref), "grad " + specs[i].path);
  }
}

TEST_P(Reference_, FiveAdamWStepsMatchPyTorch) {
  Reference r = load();
  const nlohmann::json& c = r.config;
  nn::ModelConfig m = model_of(c, GetParam());
  train::OptimizerConfig o;
  o.learning_rate = c["learning_rate"];
  o.warmup_steps = c["warmup_steps"];
  o.schedule_steps = c["total_steps"];
  o.final_lr_fraction = c["min_lr_ratio"];
  o.b1 = c["adam_b1"];
  o.b2 = c["adam_b2"];
  o.eps = c["adam_eps"];
  o.weight_decay = c["weight_decay"];
  o.clip_norm = c["max_grad_norm"];
  const exec::Array& inputs = r.tensors.at("inputs");
  const int64_t B = inputs.type().shape[0], T = inputs.type().shape[1];
  exec::Array in3 = inputs.view({DType::i32, {1, B, T}}), tg3 = r.tensors.at("targets").view({DType::i32, {1, B, T}});
  train::Program step = train::step_program(m, {B, T, 1}, o);
  const ir::Signature& sig = step.signature;
  ir::Graph loss = nn::loss_graph(m, B, T);
  std::vector<exec::Array> args;  // by the signature: PyTorch's initial parameters, zero moments
  for (size_t i = 0; i < sig.args.size(); ++i)
    args.push_back(sig.args[i].role == ir::Role::parameter ? r.tensors.at("params/" + sig.args[i].name)
                                                           : exec::Array::zeros(step.graph.type(step.graph.params[i])));
  auto arg = [&](const std::string& name) -> exec::Array& { return args[static_cast<size_t>(sig.arg(name))]; };
  arg("inputs") = in3;
  arg("targets") = tg3;
  const std::vector<nn::ParamSpec> specs = nn::param_specs(m);
  for (int s = 0; s < 5; ++s) {
    arg("step") = exec::Array::from<int32_t>({}, {s});
    std::vector<exec::Array> out = exec::run(step.graph, args);
    const double norm = out[static_cast<size_t>(sig.result("grad_norm"))].get(0), lr = out[static_cast<size_t>(sig.result("lr"))].get(0);
    EXPECT_NEAR(norm, r.tensors.at("grad_norms").get(s), 1e-5 * r.tensors.at("grad_norms").get(s)) << "step " << s;
    EXPECT_NEAR(lr, r.tensors.at("lrs").get(s), 1e-5 * r.tensors.at("lrs").get(s)) << "step " << s;
    for (auto [result, a] : sig.updates()) args[static_cast<size_t>(a)] = out[static_cast<size_t>(result)];
    std::vector<exec::Array> largs;
    for (const nn::ParamSpec& p : specs) largs.push_back(arg(p.path));
    largs.push_back(inputs);
    largs.push_back(r.tensors.at("targets"));
    double after = exec::run(loss, largs)[0].get(0), ref = r.tensors.at("losses_after_adamw").get(s);
    EXPECT_NEAR(after, ref, 1e-5 * ref) << "loss after update " << s + 1;
  }
  // After the 5th update, every parameter and both Adam moments, element by element (f32 here, f64 in
  // PyTorch): within 1e-4 of the tensor's largest magnitude.
  for (size_t i = 0; i < specs.size(); ++i) {
    for (auto [what, got] : {std::pair{"params_after_adamw/", &arg(specs[i].path)},
                             std::pair{"m_after_adamw/", &arg("opt_m/" + specs[i].path)},
                             std::pair{"v_after_adamw/", &arg("opt_v/" + specs[i].path)}}) {
      const exec::Array& want = r.tensors.at(what + specs[i].path);
      ASSERT_EQ(want.type(), got->type()) << what << specs[i].path;
      double scale = 0, worst = 0;
      for (int64_t k = 0; k < want.size(); ++k) scale = std::max(scale, std::abs(want.get(k)));
      for (int64_t k = 0; k < want.size(); ++k) worst = std::max(worst, std::abs(got->get(k) - want.get(k)));
      EXPECT_LE(worst, 1e-4 * scale) << what << specs[i].path << " (largest |value| " << scale << ")";
      if (std::getenv("REMAT_PRINT_ERRORS")) std::printf("%s%s: %.3g of %.3g\n", what, specs[i].path.c_str(), worst, scale);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ScanLayers, Reference_, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "scanned" : "unrolled"; });

}  // namespace
}  // namespace remat
