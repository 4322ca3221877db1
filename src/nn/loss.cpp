// The loss (nn/loss.cpp): log-probabilities of the targets, the mean cross-entropy of logits, and its tiled form.
#include "nn/layer.h"
#include "nn/tensor_parallel.h"

#include <numeric>

namespace remat::nn::detail {

using namespace ir;
namespace tp = tensor_parallel;

namespace {

constexpr DType kF32 = DType::f32;

// log_softmax(logits)[target] in f32 along the last (vocabulary) axis: the shape of `targets`. One op reading the
// logits as the matmul gave them (target_log_prob), or under tensor parallelism from the rank's block of the
// vocabulary (tensor_parallel.h).
Tensor target_log_probs(Builder& b, const ModelConfig& c, Tensor logits, Tensor targets) {
  auto s = b.scope("loss");
  if (tp::degree(c) > 1) return tp::target_log_probs(b, c, convert(logits, kF32), targets);
  if (logits.dtype() == DType::f64) logits = convert(logits, kF32);  // the loss of f64 models in f32, as all of it
  return target_log_prob(logits, targets, kF32)[0];
}

// packing=false: the log-probabilities of padding targets (< 0) zeroed, so a sum counts only real targets.
Tensor without_padding(const ModelConfig& c, Tensor picked, Tensor targets) {
  if (!c.padded_targets) return picked;
  return select(compare(targets, zeros_like(targets), "ge"), picked, zeros_like(picked));
}

// The mean of a sum of log-probabilities over `targets`: divided by their number, or under packing=false by
// the number of real ones (at least 1: a microbatch of padding alone has loss 0), negated.
Tensor mean_loss(Builder& b, const ModelConfig& c, Tensor sum, Tensor targets) {
  if (!c.padded_targets) return neg(sum * (1.0 / static_cast<double>(num_elements(targets.shape()))));
  IntList all(static_cast<size_t>(targets.rank()));
  std::iota(all.begin(), all.end(), int64_t{0});
  Tensor real = reduce_sum(convert(compare(targets, zeros_like(targets), "ge"), kF32), all);
  return neg(sum / max(real, scalar(b, kF32, 1.0)));
}

}  // namespace

// Mean cross-entropy over the batch's tokens.
Tensor cross_entropy(Builder& b, const ModelConfig& c, Tensor logits, Tensor targets) {
  Tensor picked = target_log_probs(b, c, logits, targets);
  auto s = b.scope("loss");
  if (!c.padded_targets) return neg(mean(picked, {0, 1}));
  return mean_loss(b, c, reduce_sum(without_padding(c, picked, targets), {0, 1}), targets);
}

// num_vocab_tiling = k > 1 (MaxText's vocabulary tiling, which chunks the tokens): the normed hidden states
// [B,T,D] and targets as k chunks of N = B*T/k tokens, scanned; each chunk's projection and cross-entropy is a
// remat region saving only its inputs, so one chunk's [N,V] logits exist at a time, forward and backward (where
// they are recomputed). The output kernel is a const of the scan in f32 (f64 for f64 weights), gathered so
// under FSDP (twice the bytes of the untiled head's gather in a 16-bit compute dtype): its gradient accumulates
// over the chunks in it, the kernel cast to the dot's dtype inside each chunk. The loss's cotangent reaches the
// hidden states' gradients as it reaches the kernel's (MaxText's custom VJP scales only the latter): autodiff.
Tensor tiled_cross_entropy(Builder& b, const ModelConfig& c, Tensor x, Tensor out, Tensor targets) {
  const int64_t k = c.num_vocab_tiling, tokens = x.dim(0) * x.dim(1);
  CHECK(tokens % k == 0,
        "config key 'num_vocab_tiling' ({}) must divide the tokens of one microbatch on one device (batch {} x "
        "sequence {} = {}): choose a divisor, or 1 to turn tiling off",
        k, x.dim(0), x.dim(1), tokens);
  Tensor chunks = reshape(x, {k, tokens / k, x.dim(2)});
  Tensor target_chunks = reshape(targets, {k, tokens / k});
  auto body = [&](Builder& sb, std::span<const Tensor> consts, std::span<const Tensor> carry,
                  std::span<const Tensor> xs) {
    auto chunk = [&](Builder& rb, std::span<const Tensor> in) {
      Tensor picked = target_log_probs(rb, c, logits_of(c, in[0], in[2]), in[1]);
      auto s = rb.scope("loss");
      return std::vector<Tensor>{reduce_sum(without_padding(c, picked, in[1]), {0})};
    };
    const std::array<Tensor, 3> in{xs[0], xs[1], consts[0]};
    const std::array<std::string, 3> names{"hidden", "targets", c.logits_via_embedding ? "embedding" : "kernel"};
    Tensor sum = checkpoint(sb, in, chunk, rematerialize::policy_attr(rematerialize::parse_policy("full")), "vocab_tile",
                            names)[0];
    auto s = sb.scope("loss");
    return std::vector<Tensor>{carry[0] + sum};
  };
  const std::array<Tensor, 2> xs{chunks, target_chunks};
  Tensor total;
  {
    auto s = b.scope("decoder/logits_dense");  // the scan's body: the projection, then the loss under ".../loss"
    total = scan(b, k, std::array{out}, std::array{scalar(b, kF32, 0.0)}, xs, body, "vocab_tiles")[0];
  }
  auto s = b.scope("loss");
  return mean_loss(b, c, total, targets);
}

}  // namespace remat::nn::detail
