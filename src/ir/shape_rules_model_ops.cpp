// Shape rules of the ops remat adds to lax (ir/ops.h says what each adds): the model's row ops, flash attention,
// the loss's log-probabilities and the fused optimizer. shape_rules.cpp dispatches to them.
#include "ir/shape_rules_ctx.h"

#include "base/check.h"

#include <algorithm>
#include <cmath>

namespace remat::ir::shape_rules {
namespace {

// q [B,T,H,Dh], k and v [B,S,KV,Dh] of q's float dtype, KV dividing H; causal needs T == S.
void check_attention(const Ctx& c) {
  const Type &q = c.in[0], &k = c.in[1], &v = c.in[2];
  CHECK(is_float(q.dtype) && q.rank() == 4 && k.rank() == 4 && k == v && k.dtype == q.dtype && k.shape[0] == q.shape[0] &&
            k.shape[3] == q.shape[3] && k.shape[2] > 0 && q.shape[2] % k.shape[2] == 0,
        "{}: attention takes q [B,T,H,Dh] and k, v [B,S,KV,Dh] of one float dtype with KV dividing H, got {}", c.where,
        types_str(c.in));
  CHECK(!c.attrs.boolean("causal") || q.shape[1] == k.shape[1], "{}: causal attention needs as many keys as queries, got {}",
        c.where, types_str(c.in));
  c.attrs.real("scale");
}

// x [..., D] and w [D] of float dtypes; eps > 0 (a NaN eps is refused too).
void check_rms_norm(const Ctx& c) {
  const Type &x = c.in[0], &w = c.in[1];
  CHECK(is_float(x.dtype) && is_float(w.dtype) && x.rank() >= 1 && w.rank() == 1 && w.shape[0] == x.shape.back(),
        "{}: rms_norm takes x [..., D] and its scale w [D], floats, got {}", c.where, types_str(c.in));
  CHECK(c.attrs.real("eps") > 0, "{}: rms_norm's eps must be > 0, got {}", c.where, c.attrs.real("eps"));
}

}  // namespace

// x [B,T,N,Dh] of a float dtype, Dh even; cos and sin [T,Dh/2] of x's dtype.
std::vector<Type> rule_rope(const Ctx& c) {
  const Type& x = c.in[0];
  const bool tables = x.rank() == 4 && c.in[1].rank() == 2 && c.in[1].shape[0] == x.shape[1] &&
                      2 * c.in[1].shape[1] == x.shape[3];
  CHECK(is_float(x.dtype) && tables && c.in[1] == c.in[2] && c.in[1].dtype == x.dtype,
        "{}: rope takes x [B,T,N,Dh] with Dh even and cos, sin [T,Dh/2] of x's float dtype, got {}", c.where,
        types_str(c.in));
  return {x};
}

std::vector<Type> rule_attention(const Ctx& c) {
  check_attention(c);
  const Shape& q = c.in[0].shape;
  return {c.in[0], Type{c.in[0].dtype == DType::f64 ? DType::f64 : DType::f32, {q[0], q[2], q[1]}}};
}
std::vector<Type> rule_attention_grad(const Ctx& c) {
  const std::vector<Type> forward = rule_attention(c);
  CHECK(c.in[3] == forward[0] && c.in[4] == forward[1] && c.in[5] == forward[0],
        "{}: attention_grad takes q, k, v, the context {}, the log-sum-exp {} and d context {}, got {}", c.where,
        type_str(forward[0]), type_str(forward[1]), type_str(forward[0]), types_str(c.in));
  return {c.in[0], c.in[1], c.in[2]};
}

// softmax's optional mask, operand k: bool [S, T], x's last two dims, and then a finite scale; none: no scale.
void check_softmax_mask(const Ctx& c, size_t k) {
  if (c.in.size() <= k) {
    CHECK(!c.attrs.has("scale"), "{}: {}'s scale comes with a mask; give the mask (bool [S, T]) or no scale", c.where,
          k == 1 ? "softmax" : "softmax_grad");
    return;
  }
  const Type &x = c.in[0], &mask = c.in[k];
  CHECK(mask.dtype == DType::pred && mask.rank() == 2 && x.rank() >= 2 &&
            std::equal(mask.shape.begin(), mask.shape.end(), x.shape.end() - 2),
        "{}: {}'s mask must be bool [S, T] for x [..., S, T], got {}", c.where, k == 1 ? "softmax" : "softmax_grad",
        types_str(c.in));
  CHECK(std::isfinite(c.attrs.real("scale")), "{}: softmax's scale must be finite, got {}", c.where,
        c.attrs.real("scale"));
}
std::vector<Type> rule_softmax(const Ctx& c) {
  CHECK(c.in.size() <= 2 && is_float(c.in[0].dtype) && c.in[0].rank() >= 1,
        "{}: softmax takes a floating-point x of rank >= 1 and optionally its mask, got {}", c.where, types_str(c.in));
  check_softmax_mask(c, 1);
  const DType to = c.attrs.dtype("dtype");
  CHECK(is_float(to), "{}: softmax's dtype must be a floating-point type, got {}", c.where, dtype_name(to));
  return {Type{to, c.in[0].shape}};
}
std::vector<Type> rule_softmax_grad(const Ctx& c) {
  CHECK((c.in.size() == 2 || c.in.size() == 3) && is_float(c.in[0].dtype) && is_float(c.in[1].dtype) &&
            c.in[0].rank() >= 1 && c.in[0].shape == c.in[1].shape,
        "{}: softmax_grad takes softmax's input x, the probabilities' cotangent (floats of one shape) and optionally "
        "the mask, got {}",
        c.where, types_str(c.in));
  check_softmax_mask(c, 2);
  return {c.in[0]};
}
std::vector<Type> rule_log_softmax(const Ctx& c) {
  CHECK(is_float(c.in[0].dtype) && c.in[0].rank() >= 1,
        "{}: log_softmax needs a floating-point operand of rank >= 1, got {}", c.where, type_str(c.in[0]));
  return {c.in[0]};
}
std::vector<Type> rule_log_softmax_grad(const Ctx& c) {
  CHECK(is_float(c.in[0].dtype) && c.in[0] == c.in[1] && c.in[0].rank() >= 1,
        "{}: log_softmax_grad takes log_softmax's result y and its cotangent, floats of one type, got {}", c.where,
        types_str(c.in));
  return {c.in[0]};
}

std::vector<Type> rule_rms_norm(const Ctx& c) {
  check_rms_norm(c);
  const DType to = c.attrs.dtype("dtype");
  CHECK(is_float(to), "{}: rms_norm's dtype must be a floating-point type, got {}", c.where, dtype_name(to));
  return {Type{to, c.in[0].shape}};
}
std::vector<Type> rule_rms_norm_grad(const Ctx& c) {
  check_rms_norm(c);
  CHECK(is_float(c.in[2].dtype) && c.in[2].shape == c.in[0].shape,
        "{}: rms_norm_grad takes x, w and the result's cotangent g, a float of x's shape, got {}", c.where,
        types_str(c.in));
  return {c.in[0], c.in[1]};
}

// x [..., V] a float, targets [...] i32; dtype a float (the log-probabilities'). -> (y [...], stats [..., 2]).
std::vector<Type> rule_target_log_prob(const Ctx& c) {
  const Type &x = c.in[0], &t = c.in[1];
  CHECK(is_float(x.dtype) && x.rank() >= 1 && t.dtype == DType::i32 &&
            t.shape == Shape(x.shape.begin(), x.shape.end() - 1),
        "{}: target_log_prob takes logits x [..., V] of a float dtype and targets [...] i32, got {}", c.where,
        types_str(c.in));
  // The log-probabilities' dtype holds every value of x's (the kernel reads x as it is, not rounded to it).
  const DType to = c.attrs.dtype("dtype");
  const bool holds = to == x.dtype || (to == DType::f64 && is_float(x.dtype)) ||
                     (to == DType::f32 && (x.dtype == DType::bf16 || x.dtype == DType::f16));
  CHECK(holds, "{}: target_log_prob's dtype must be x's float dtype or wider, got {} for {}", c.where, dtype_name(to),
        type_str(x));
  Shape stats = t.shape;
  stats.push_back(2);  // each row's max and log Σ exp, in the kernel's accumulator type
  return {Type{to, t.shape}, Type{to == DType::f64 ? DType::f64 : DType::f32, stats}};
}
std::vector<Type> rule_target_log_prob_grad(const Ctx& c) {
  const std::vector<Type> forward = rule_target_log_prob(c);
  CHECK(c.in[2] == forward[1] && c.in[3] == forward[0],
        "{}: target_log_prob_grad takes x, targets, the forward's row statistics {} and the cotangent {}, got {}",
        c.where, type_str(forward[1]), type_str(forward[0]), types_str(c.in));
  return {c.in[0]};
}

// gate, up (and swiglu_grad's g) of one float type.
std::vector<Type> rule_swiglu(const Ctx& c) {
  bool same = is_float(c.in[0].dtype);
  for (const Type& t : c.in) same = same && t == c.in[0];
  CHECK(same, "{}: {} takes {} of one float type, got {}", c.where, c.in.size() == 2 ? "swiglu" : "swiglu_grad",
        c.in.size() == 2 ? "gate and up" : "gate, up and the product's cotangent g", types_str(c.in));
  return {c.in[0]};
}
std::vector<Type> rule_swiglu_grad(const Ctx& c) { return {rule_swiglu(c)[0], c.in[0]}; }

// p, m, v, g of one float type; scale, lr, bias1, bias2 f32 scalars; optionally finite, a bool scalar, and then
// the loss scale, an f32 scalar.
std::vector<Type> rule_adamw(const Ctx& c) {
  CHECK(c.in.size() >= 8 && c.in.size() <= 10,
        "{}: adamw takes p, m, v, g, scale, lr, bias1, bias2[, finite[, loss_scale]], got {}", c.where, types_str(c.in));
  CHECK(is_float(c.in[0].dtype) && c.in[1] == c.in[0] && c.in[2] == c.in[0] && c.in[3].shape == c.in[0].shape &&
            (c.in[3].dtype == c.in[0].dtype || widens_exactly(c.in[3].dtype, c.in[0].dtype)),
        "{}: adamw's p, m, v must have one floating-point type and g its shape, in it or a narrower float that it "
        "holds exactly (bf16 or f16 for f32 p), got {}", c.where, types_str(c.in));
  for (size_t i = 4; i < 8; ++i)
    CHECK(c.in[i] == (Type{DType::f32, {}}), "{}: adamw's operand {} (scale, lr, bias1, bias2) must be an f32 scalar, got {}",
          c.where, i, types_str(c.in));
  CHECK(c.in.size() == 8 || c.in[8] == (Type{DType::pred, {}}), "{}: adamw's `finite` must be a bool scalar, got {}",
        c.where, types_str(c.in));
  CHECK(c.in.size() < 10 || c.in[9] == (Type{DType::f32, {}}), "{}: adamw's loss_scale must be an f32 scalar, got {}",
        c.where, types_str(c.in));
  for (const char* key : {"b1", "b2", "eps", "weight_decay"}) c.attrs.real(key);  // present, numbers
  return {c.in[0], c.in[0], c.in[0]};
}

}  // namespace remat::ir::shape_rules
