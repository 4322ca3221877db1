#include "train/grad_norm.h"

namespace remat::train {

using namespace ir;

namespace {

Tensor sum_all(Tensor x) {
  IntList axes(static_cast<size_t>(x.rank()));
  for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
  return axes.empty() ? x : reduce_sum(x, axes);
}

}  // namespace

Tensor squared_norm(Builder& b, const nn::ModelConfig& model, std::span<const GradPart> parts, int64_t stages,
                    std::optional<Tensor> loss_scale) {
  const std::vector<nn::ParamSpec> specs = nn::param_specs(model);
  const int64_t fsdp = model.mesh.size("fsdp");
  Tensor sq = scalar(b, DType::f32, 0.0);
  for (size_t i = 0; i < specs.size(); ++i) {
    const nn::ParamSpec& spec = specs[i];
    IntList others;
    Shape whole;  // of the partial sums: the layers and fsdp dimensions of the whole parameter
    int64_t fsdp_at = -1;  // the fsdp dimension's place among them
    const bool stacked = spec.stacked();
    for (int64_t d = 0; d < static_cast<int64_t>(spec.axes.size()); ++d) {
      if (!(stacked && d == 0) && d != spec.fsdp_dim) {
        others.push_back(d);
        continue;
      }
      if (d == spec.fsdp_dim) fsdp_at = static_cast<int64_t>(whole.size());
      whole.push_back(spec.whole_type().shape[static_cast<size_t>(d)]);
    }
    ASSERT(spec.shards == 1 || fsdp_at >= 0);
    std::optional<Tensor> total;
    for (const GradPart& part : parts) {
      if (part.param != i) continue;
      Tensor partial = sum_of_squares(part.grad, others, loss_scale);
      if (spec.shards > 1) {
        ASSERT(spec.shards == fsdp);
        partial = all_gather(partial, "fsdp", fsdp, fsdp_at);
      }
      if (stacked && partial.dim(0) != whole[0]) {  // a block of the layers: zeros around it
        Shape before = whole, after = whole;
        before[0] = part.first_layer;
        after[0] = whole[0] - part.first_layer - partial.dim(0);
        std::vector<Tensor> rows;
        if (before[0] > 0) rows.push_back(full(b, {spec.type.dtype, before}, 0.0));
        rows.push_back(partial);
        if (after[0] > 0) rows.push_back(full(b, {spec.type.dtype, after}, 0.0));
        partial = concatenate(rows, 0);
      }
      total = total ? *total + partial : partial;
    }
    if (!total) total = full(b, {spec.type.dtype, whole}, 0.0);
    if (spec.tensor_shards > 1) total = all_reduce(*total, "tensor", spec.tensor_shards);
    if (stages > 1) total = all_reduce(*total, "stage", stages);
    sq = sq + sum_all(*total);
  }
  return sq;
}

}  // namespace remat::train
