#include "nn/tensor_parallel.h"

#include <numeric>

namespace remat::nn::tensor_parallel {

using namespace ir;

namespace {

constexpr const char* kAxis = "tensor";

// The leading dimensions of `x` but its last: how a [...] value broadcasts into [..., n].
IntList leading(const Tensor& x) {
  IntList dims(static_cast<size_t>(x.rank() - 1));
  std::iota(dims.begin(), dims.end(), int64_t{0});
  return dims;
}

// The first vocabulary id of this rank's block of `block` ids, broadcast to `shape`.
Tensor first_id(Builder& b, int64_t t, int64_t block, const Shape& shape) {
  Tensor first = axis_index(b, kAxis, t) * scalar(b, DType::i32, static_cast<double>(block));
  return broadcast_in_dim(first, shape, {});
}

}  // namespace

int64_t degree(const ModelConfig& c) { return c.mesh.size(kAxis); }

Tensor enter(const ModelConfig& c, Tensor h) {
  const int64_t t = degree(c);
  if (t == 1) return h;
  return c.sequence_parallel ? all_gather(h, kAxis, t, 1) : pvary(h, kAxis, t);
}

Tensor leave(const ModelConfig& c, Tensor partial) {
  const int64_t t = degree(c);
  if (t == 1) return partial;
  return c.sequence_parallel ? reduce_scatter(partial, kAxis, t, 1) : all_reduce(partial, kAxis, t);
}

Tensor whole_param(const ModelConfig& c, Tensor p) {
  const int64_t t = degree(c);
  return t > 1 && c.sequence_parallel ? pvary(p, kAxis, t) : p;
}

Tensor kv_kernel(Builder& b, const ModelConfig& c, Tensor kernel) {
  const int64_t t = degree(c), kv = c.num_kv_heads;
  if (t == 1 || kv % t == 0) return kernel;  // the rank's own block of kv heads
  // Query heads [r·H/t, (r+1)·H/t) all read kv head r·KV/t (t is a multiple of KV: validate_tensor).
  Tensor head = axis_index(b, kAxis, t) * scalar(b, DType::i32, static_cast<double>(kv)) /
                scalar(b, DType::i32, static_cast<double>(t));
  Tensor zero = scalar(b, DType::i32, 0);
  const Shape& s = kernel.shape();
  return dynamic_slice(pvary(kernel, kAxis, t), std::array{zero, head, zero}, {s[0], 1, s[2]});
}

Tensor embed(Builder& b, const ModelConfig& c, Tensor table, Tensor inputs, DType dtype) {
  const int64_t t = degree(c), block = table.dim(0);
  CHECK(!c.sequence_parallel || inputs.dim(1) % t == 0,
        "sequence parallelism splits the sequence over {} tensor ranks: config key 'max_target_length' ({}) must be a "
        "multiple of {}", t, inputs.dim(1), t);
  Tensor local = inputs - first_id(b, t, block, inputs.shape());
  Tensor zero = zeros_like(local);
  Tensor above = compare(local, zero, "ge");
  Tensor inside = select(above, compare(local, full(b, local.type(), static_cast<double>(block)), "lt"), above);
  Tensor rows = gather(table, select(inside, local, zero));
  rows = select(broadcast_in_dim(inside, rows.shape(), {0, 1}), rows, zeros_like(rows));
  return leave(c, convert(rows, dtype));
}

Tensor target_log_probs(Builder& b, const ModelConfig& c, Tensor logits, Tensor targets) {
  const int64_t t = degree(c), v = logits.rank() - 1;
  const IntList lead = leading(logits);
  // The max over the whole vocabulary: the ranks' maxima gathered in rank order, a constant for the gradient
  // (as the single-device log_softmax holds it).
  Shape one = targets.shape();
  one.push_back(1);
  Tensor maxima = all_gather(reshape(reduce_max(logits, {v}), one), kAxis, t, v);
  Tensor max = stop_gradient(reduce_max(maxima, {v}));
  Tensor shifted = logits - broadcast_in_dim(max, logits.shape(), lead);
  Tensor sum = all_reduce(reduce_sum(exp(shifted), {v}), kAxis, t);
  // The target's shifted logit: on the rank whose block holds it (a one-hot there, none elsewhere), summed.
  Tensor local = targets - first_id(b, t, logits.dim(v), targets.shape());
  Tensor hot = compare(iota(b, DType::i32, logits.shape(), v), broadcast_in_dim(local, logits.shape(), lead), "eq");
  Tensor picked = all_reduce(reduce_sum(select(hot, shifted, zeros_like(shifted)), {v}), kAxis, t);
  return picked - log(sum);
}

Tensor gather_logits(const ModelConfig& c, Tensor logits) {
  const int64_t t = degree(c);
  return t == 1 ? logits : all_gather(logits, kAxis, t, logits.rank() - 1);
}

}  // namespace remat::nn::tensor_parallel
