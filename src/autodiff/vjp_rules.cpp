// VJP rules of the primitive ops (scan's is in scan_vjp.cpp). Each emits IR for the input cotangents,
// following jax.lax's transpose and JVP rules.
#include "autodiff/vjp.h"

#include "base/check.h"

#include <algorithm>
#include <numeric>

namespace remat::autodiff {
namespace {

using namespace remat::ir;
using Cots = std::span<const Cot>;

Tensor in(Builder& b, const Node& n, size_t i) { return b.wrap(n.inputs[i]); }
Tensor out(Builder& b, const Node& n, size_t i = 0) { return b.wrap(n.outputs[i]); }

// Cotangent of one dot_general operand `a`, given the other operand `o` and g = [batch, lhs free, rhs free]:
// a dot_general of g and o contracting o's free dims, transposed back into a's dim order. Of the two operand
// orders, (g, o) gives [batch, a free, a contract] and (o, g) gives [batch, a contract, a free]; the one
// that already matches a's layout is used, so the common weight and activation gradients need no transpose.
Tensor dot_transpose(Tensor g, Tensor o, int64_t a_rank, const IntList& a_contract, const IntList& o_contract,
                     const IntList& a_batch, const IntList& o_batch, bool a_is_lhs) {
  auto free_dims = [](int64_t rank, const IntList& c, const IntList& bt) {
    IntList f;
    for (int64_t d = 0; d < rank; ++d)
      if (std::find(c.begin(), c.end(), d) == c.end() && std::find(bt.begin(), bt.end(), d) == bt.end()) f.push_back(d);
    return f;
  };
  const int64_t nb = static_cast<int64_t>(a_batch.size()), nk = static_cast<int64_t>(a_contract.size());
  IntList a_free = free_dims(a_rank, a_contract, a_batch);
  IntList o_free = free_dims(o.rank(), o_contract, o_batch);
  const int64_t na = static_cast<int64_t>(a_free.size()), no = static_cast<int64_t>(o_free.size());
  IntList g_o_free(static_cast<size_t>(no)), g_batch(static_cast<size_t>(nb));
  std::iota(g_o_free.begin(), g_o_free.end(), a_is_lhs ? nb + na : nb);
  std::iota(g_batch.begin(), g_batch.end(), 0);
  IntList sorted_oc = o_contract;
  std::sort(sorted_oc.begin(), sorted_oc.end());
  // perm[d] = position of a's dim d in the raw product, for either operand order.
  auto perm_for = [&](bool g_first) {
    IntList perm(static_cast<size_t>(a_rank));
    const int64_t free_at = g_first ? nb : nb + nk, contract_at = g_first ? nb + na : nb;
    for (int64_t i = 0; i < nb; ++i) perm[static_cast<size_t>(a_batch[static_cast<size_t>(i)])] = i;
    for (int64_t j = 0; j < na; ++j) perm[static_cast<size_t>(a_free[static_cast<size_t>(j)])] = free_at + j;
    for (size_t k = 0; k < a_contract.size(); ++k) {
      int64_t rank_in_o = std::find(sorted_oc.begin(), sorted_oc.end(), o_contract[k]) - sorted_oc.begin();
      perm[static_cast<size_t>(a_contract[k])] = contract_at + rank_in_o;
    }
    return perm;
  };
  IntList identity(static_cast<size_t>(a_rank));
  std::iota(identity.begin(), identity.end(), 0);
  if (perm_for(false) == identity) return dot_general(o, g, DotDims{o_free, g_o_free, o_batch, g_batch});
  Tensor raw = dot_general(g, o, DotDims{g_o_free, o_free, g_batch, o_batch});
  IntList perm = perm_for(true);
  return perm == identity ? raw : transpose(raw, perm);
}

// The cotangent that reads the larger operand comes first: that operand (a layer's activation, next to a weight)
// often dies there, before the other cotangent is allocated — never a higher peak than the other order.
std::vector<Cot> vjp_dot_general(Builder& b, size_t, const Node& n, Cots c, Context&) {
  const IntLists& ct = n.attrs.int_lists("contract");
  const IntLists& bt = n.attrs.int_lists("batch");
  Tensor x = in(b, n, 0), y = in(b, n, 1);
  auto of_x = [&] { return dot_transpose(*c[0], y, x.rank(), ct[0], ct[1], bt[0], bt[1], true); };
  auto of_y = [&] { return dot_transpose(*c[0], x, y.rank(), ct[1], ct[0], bt[1], bt[0], false); };
  if (x.type().bytes() > y.type().bytes()) {
    Tensor dy = of_y();
    return {of_x(), dy};
  }
  Tensor dx = of_x();
  return {dx, of_y()};
}

std::vector<Cot> vjp_add(Builder&, size_t, const Node&, Cots c, Context&) { return {c[0], c[0]}; }
std::vector<Cot> vjp_sub(Builder&, size_t, const Node&, Cots c, Context&) { return {c[0], neg(*c[0])}; }
std::vector<Cot> vjp_mul(Builder& b, size_t, const Node& n, Cots c, Context&) {
  return {*c[0] * in(b, n, 1), *c[0] * in(b, n, 0)};
}
std::vector<Cot> vjp_div(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor y = in(b, n, 1);
  Tensor gx = *c[0] / y;
  return {gx, neg(gx * out(b, n))};
}

// lax's balanced rule for max/min: the cotangent goes to the operand that equals the output, split in
// half on ties.
std::vector<Cot> vjp_chooser(Builder& b, const Node& n, Cots c) {
  Tensor x = in(b, n, 0), y = in(b, n, 1), z = out(b, n);
  Tensor zero = zeros_like(x), one = full(b, x.type(), 1.0), half = full(b, x.type(), 0.5);
  Tensor x_eq = compare(x, z, "eq"), y_eq = compare(y, z, "eq");
  Tensor wx = select(x_eq, select(y_eq, half, one), zero);
  Tensor wy = select(y_eq, select(x_eq, half, one), zero);
  return {*c[0] * wx, *c[0] * wy};
}
std::vector<Cot> vjp_max(Builder& b, size_t, const Node& n, Cots c, Context&) { return vjp_chooser(b, n, c); }
std::vector<Cot> vjp_min(Builder& b, size_t, const Node& n, Cots c, Context&) { return vjp_chooser(b, n, c); }

std::vector<Cot> vjp_pow(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor x = in(b, n, 0), y = in(b, n, 1), z = out(b, n);
  Tensor one = full(b, x.type(), 1.0);
  // d/dx x^y = y x^(y-1), which is 0 where y == 0 (lax's rule; x^-1 at x == 0 would give 0 * inf).
  Tensor zero = zeros_like(x);
  Tensor gx = select(compare(y, zero, "eq"), zero, *c[0] * y * pow(x, y - one));
  // d/dy x^y = log(x) x^y, with log(0) replaced by 0 as lax does.
  Tensor safe_log = log(select(compare(x, zeros_like(x), "eq"), one, x));
  return {gx, *c[0] * z * safe_log};
}

std::vector<Cot> vjp_neg(Builder&, size_t, const Node&, Cots c, Context&) { return {neg(*c[0])}; }
std::vector<Cot> vjp_exp(Builder& b, size_t, const Node& n, Cots c, Context&) { return {*c[0] * out(b, n)}; }
std::vector<Cot> vjp_log(Builder& b, size_t, const Node& n, Cots c, Context&) { return {*c[0] / in(b, n, 0)}; }
std::vector<Cot> vjp_tanh(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor z = out(b, n);
  return {*c[0] * (1.0 - z * z)};
}
std::vector<Cot> vjp_logistic(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor z = out(b, n);
  return {*c[0] * (z * (1.0 - z))};
}
std::vector<Cot> vjp_sqrt(Builder& b, size_t, const Node& n, Cots c, Context&) { return {(*c[0] * 0.5) / out(b, n)}; }
std::vector<Cot> vjp_rsqrt(Builder& b, size_t, const Node& n, Cots c, Context&) {
  // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 * rsqrt(x) / x
  return {(*c[0] * -0.5) * (out(b, n) / in(b, n, 0))};
}

std::vector<Cot> vjp_sin(Builder& b, size_t, const Node& n, Cots c, Context&) { return {*c[0] * cos(in(b, n, 0))}; }
std::vector<Cot> vjp_cos(Builder& b, size_t, const Node& n, Cots c, Context&) { return {neg(*c[0] * sin(in(b, n, 0)))}; }

std::vector<Cot> vjp_compare(Builder&, size_t, const Node&, Cots, Context&) { return {std::nullopt, std::nullopt}; }
std::vector<Cot> vjp_select(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor p = in(b, n, 0), zero = zeros_like(*c[0]);
  return {std::nullopt, select(p, *c[0], zero), select(p, zero, *c[0])};
}

std::vector<Cot> vjp_broadcast_in_dim(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor x = in(b, n, 0);
  const IntList& dims = n.attrs.ints("dims");
  const Shape& shape = n.attrs.ints("shape");
  IntList axes;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    auto it = std::find(dims.begin(), dims.end(), d);
    if (it == dims.end() || (x.shape()[static_cast<size_t>(it - dims.begin())] == 1 && shape[static_cast<size_t>(d)] != 1))
      axes.push_back(d);
  }
  Tensor r = axes.empty() ? *c[0] : reduce_sum(*c[0], axes);
  return {reshape(r, x.shape())};
}

std::vector<Cot> vjp_reshape(Builder& b, size_t, const Node& n, Cots c, Context&) {
  return {reshape(*c[0], in(b, n, 0).shape())};
}

std::vector<Cot> vjp_transpose(Builder&, size_t, const Node& n, Cots c, Context&) {
  const IntList& perm = n.attrs.ints("perm");
  IntList inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  return {transpose(*c[0], inverse)};
}

std::vector<Tensor> index_constants(Builder& b, const IntList& starts) {
  std::vector<Tensor> out;
  for (int64_t s : starts) out.push_back(scalar(b, DType::i32, static_cast<double>(s)));
  return out;
}

std::vector<Cot> vjp_slice(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor x = in(b, n, 0);
  return {dynamic_update_slice(zeros_like(x), *c[0], index_constants(b, n.attrs.ints("start")))};
}

std::vector<Tensor> start_indices(Builder& b, const Node& n, size_t first) {
  std::vector<Tensor> s;
  for (size_t i = first; i < n.inputs.size(); ++i) s.push_back(in(b, n, i));
  return s;
}

std::vector<Cot> vjp_dynamic_slice(Builder& b, size_t, const Node& n, Cots c, Context&) {
  std::vector<Cot> r(n.inputs.size());
  r[0] = dynamic_update_slice(zeros_like(in(b, n, 0)), *c[0], start_indices(b, n, 1));
  return r;
}

std::vector<Cot> vjp_dynamic_update_slice(Builder& b, size_t, const Node& n, Cots c, Context&) {
  std::vector<Cot> r(n.inputs.size());
  std::vector<Tensor> starts = start_indices(b, n, 2);
  Tensor u = in(b, n, 1);
  r[0] = dynamic_update_slice(*c[0], zeros_like(u), starts);
  r[1] = dynamic_slice(*c[0], starts, u.shape());
  return r;
}

std::vector<Cot> vjp_concatenate(Builder& b, size_t, const Node& n, Cots c, Context&) {
  int64_t dim = n.attrs.integer("dim");
  std::vector<Cot> r;
  IntList start(static_cast<size_t>(c[0]->rank()), 0);
  IntList limit = c[0]->shape();
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    limit[static_cast<size_t>(dim)] = start[static_cast<size_t>(dim)] + in(b, n, i).shape()[static_cast<size_t>(dim)];
    r.push_back(slice(*c[0], start, limit));
    start[static_cast<size_t>(dim)] = limit[static_cast<size_t>(dim)];
  }
  return r;
}

IntList kept_dims(int64_t rank, const IntList& axes) {
  IntList kept;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) kept.push_back(d);
  return kept;
}

std::vector<Cot> vjp_reduce_sum(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor x = in(b, n, 0);
  return {broadcast_in_dim(*c[0], x.shape(), kept_dims(x.rank(), n.attrs.ints("axes")))};
}

// lax's chooser rule: split the cotangent evenly among the locations that attain the maximum.
std::vector<Cot> vjp_reduce_max(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor x = in(b, n, 0);
  const IntList& axes = n.attrs.ints("axes");
  IntList kept = kept_dims(x.rank(), axes);
  Tensor hits = convert(compare(x, broadcast_in_dim(out(b, n), x.shape(), kept), "eq"), x.dtype());
  Tensor share = *c[0] / reduce_sum(hits, axes);
  return {broadcast_in_dim(share, x.shape(), kept) * hits};
}

// d/dx Σ x² = 2x.
std::vector<Cot> vjp_sum_of_squares(Builder& b, size_t, const Node& n, Cots c, Context&) {
  CHECK(n.inputs.size() == 1, "cannot differentiate sum_of_squares with a divisor (scope '{}'): it unscales the "
        "optimizer's gradients", n.scope);
  CHECK(!n.attrs.has("dtype"), "cannot differentiate sum_of_squares with a dtype (scope '{}'): it reads the "
        "optimizer's gradients widened", n.scope);
  Tensor x = in(b, n, 0);
  return {broadcast_in_dim(*c[0], x.shape(), kept_dims(x.rank(), n.attrs.ints("axes"))) * (x + x)};
}

// From softmax's input: the probabilities are recomputed row by row (ops.h), so the backward keeps x (the raw
// scores of a masked softmax, whose mask and scale it reads again) and reads the cotangent in the probabilities'
// dtype. The mask, a bool, has no cotangent.
std::vector<Cot> vjp_softmax(Builder& b, size_t, const Node& n, Cots c, Context&) {
  const bool masked = n.inputs.size() == 2;
  if (!c[0]) return std::vector<Cot>(n.inputs.size(), std::nullopt);
  if (!masked) return {softmax_grad(in(b, n, 0), *c[0])};
  return {softmax_grad(in(b, n, 0), *c[0], in(b, n, 1), n.attrs.real("scale")), std::nullopt};
}
std::vector<Cot> vjp_softmax_grad(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate softmax_grad (scope '{}'): second derivatives of softmax are not built", n.scope);
  return {};
}
// From log_softmax's result: exp(y) is the softmax, so the backward keeps y (x may die at the forward).
std::vector<Cot> vjp_log_softmax(Builder& b, size_t, const Node& n, Cots c, Context&) {
  if (!c[0]) return {std::nullopt};
  return {log_softmax_grad(out(b, n), *c[0])};
}
std::vector<Cot> vjp_log_softmax_grad(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate log_softmax_grad (scope '{}'): second derivatives of log_softmax are not built",
        n.scope);
  return {};
}

// From the logits and the forward's row statistics (no log-probabilities array).
std::vector<Cot> vjp_target_log_prob(Builder& b, size_t, const Node& n, Cots c, Context&) {
  CHECK(!c[1], "cannot differentiate target_log_prob's row statistics (scope '{}'): they are a residual of the "
        "backward", n.scope);
  if (!c[0]) return {std::nullopt, std::nullopt};
  return {target_log_prob_grad(in(b, n, 0), in(b, n, 1), out(b, n, 1), *c[0], n.attrs.dtype("dtype")), std::nullopt};
}
std::vector<Cot> vjp_target_log_prob_grad(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate target_log_prob_grad (scope '{}'): second derivatives of the loss are not built",
        n.scope);
  return {};
}

// From the norm's input and scale: r is recomputed row by row (ops.h), so the backward keeps x (no f32 copy of it,
// no normalized array) and gives dx and dw in one op.
std::vector<Cot> vjp_rms_norm(Builder& b, size_t, const Node& n, Cots c, Context& ctx) {
  if (!c[0]) return {std::nullopt, std::nullopt};
  auto wanted = [&](size_t i) { return ctx.differentiable[static_cast<size_t>(n.inputs[i])]; };
  const auto [dx, dw] = rms_norm_grad(in(b, n, 0), in(b, n, 1), *c[0], n.attrs.real("eps"));
  return {wanted(0) ? Cot(dx) : std::nullopt, wanted(1) ? Cot(dw) : std::nullopt};
}
std::vector<Cot> vjp_rms_norm_grad(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate rms_norm_grad (scope '{}'): second derivatives of rms_norm are not built", n.scope);
  return {};
}

// From gate and up, which the matmuls before it made (a policy saves them or not): the logistic is recomputed in
// swiglu_grad, so the backward keeps no array of the logistic or of silu.
std::vector<Cot> vjp_swiglu(Builder& b, size_t, const Node& n, Cots c, Context& ctx) {
  if (!c[0]) return {std::nullopt, std::nullopt};
  auto wanted = [&](size_t i) { return ctx.differentiable[static_cast<size_t>(n.inputs[i])]; };
  const auto [dgate, dup] = swiglu_grad(in(b, n, 0), in(b, n, 1), *c[0]);
  return {wanted(0) ? Cot(dgate) : std::nullopt, wanted(1) ? Cot(dup) : std::nullopt};
}
std::vector<Cot> vjp_swiglu_grad(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate swiglu_grad (scope '{}'): second derivatives of swiglu are not built", n.scope);
  return {};
}

// The rotation back: dx = rope(g, cos, −sin). The tables' cotangents, only where they depend on a differentiated
// value (the model's come from iota), sum over batch and heads: dcos = Σ g₁·x₁ + g₂·x₂, dsin = Σ g₂·x₁ − g₁·x₂.
std::vector<Cot> vjp_rope(Builder& b, size_t, const Node& n, Cots c, Context& ctx) {
  auto wanted = [&](size_t i) { return ctx.differentiable[static_cast<size_t>(n.inputs[i])]; };
  Tensor x = in(b, n, 0), cos = in(b, n, 1), sin = in(b, n, 2);
  const Tensor& g = *c[0];
  std::vector<Cot> r(3);
  if (wanted(0)) r[0] = rope(g, cos, neg(sin));
  if (!wanted(1) && !wanted(2)) return r;
  const Shape& s = x.shape();
  const int64_t h = s[3] / 2;
  auto half = [&](Tensor t, int64_t k) { return slice(t, {0, 0, 0, k * h}, {s[0], s[1], s[2], (k + 1) * h}); };
  Tensor x1 = half(x, 0), x2 = half(x, 1), g1 = half(g, 0), g2 = half(g, 1);
  if (wanted(1)) r[1] = reduce_sum(g1 * x1 + g2 * x2, {0, 2});
  if (wanted(2)) r[2] = reduce_sum(g2 * x1 - g1 * x2, {0, 2});
  return r;
}

// A value as the backward should read it: through its checkpoint name when the forward gave it one (the kernel's
// residuals are named where the model names them, so policies decide them by that name).
Tensor as_named(Builder& b, ValueId v) {
  for (const Node& m : b.graph().nodes)
    if (m.op == Op::name && m.inputs[0] == v) return b.wrap(m.outputs[0]);
  return b.wrap(v);
}

// From the saved q, k, v, context and log-sum-exp; the log-sum-exp is a residual, not a result to differentiate.
std::vector<Cot> vjp_attention(Builder& b, size_t, const Node& n, Cots c, Context&) {
  CHECK(!c[1], "cannot differentiate attention's log-sum-exp (scope '{}'): it is a residual of the backward", n.scope);
  if (!c[0]) return {std::nullopt, std::nullopt, std::nullopt};
  const auto [dq, dk, dv] = attention_grad(in(b, n, 0), in(b, n, 1), in(b, n, 2), as_named(b, n.outputs[0]),
                                           as_named(b, n.outputs[1]), *c[0], n.attrs.boolean("causal"), n.attrs.real("scale"));
  return {dq, dk, dv};
}
std::vector<Cot> vjp_attention_grad(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate attention_grad (scope '{}'): second derivatives of attention are not built", n.scope);
  return {};
}

// The optimizer's update is not differentiated (nothing differentiates through a training step).
std::vector<Cot> vjp_adamw(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate through adamw (scope '{}'): it is the optimizer's update", n.scope);
  return {};
}

std::vector<Cot> vjp_convert_element_type(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor x = in(b, n, 0);
  if (!is_float(x.dtype())) return {std::nullopt};
  return {convert(*c[0], x.dtype())};
}

std::vector<Cot> vjp_convert_group(Builder& b, size_t, const Node& n, Cots c, Context&) {
  std::vector<Cot> out;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    Tensor x = in(b, n, i);
    out.push_back(is_float(x.dtype()) && c[i] ? Cot(convert(*c[i], x.dtype())) : std::nullopt);
  }
  return out;
}

std::vector<Cot> vjp_iota(Builder&, size_t, const Node&, Cots, Context&) { return {}; }
std::vector<Cot> vjp_full(Builder&, size_t, const Node&, Cots, Context&) { return {}; }

std::vector<Cot> vjp_gather(Builder& b, size_t, const Node& n, Cots c, Context&) {
  Tensor table = in(b, n, 0), idx = in(b, n, 1);
  return {scatter_add(zeros_like(table), idx, *c[0]), std::nullopt};
}

std::vector<Cot> vjp_scatter_add(Builder& b, size_t, const Node& n, Cots c, Context&) {
  return {c[0], std::nullopt, gather(*c[0], in(b, n, 1))};
}

// Memory-space moves are identities for differentiation.
std::vector<Cot> vjp_offload(Builder&, size_t, const Node&, Cots c, Context&) { return {c[0]}; }
std::vector<Cot> vjp_reload(Builder&, size_t, const Node&, Cots c, Context&) { return {c[0]}; }

// The cotangent is not named (as in JAX: only the primal carries the checkpoint name).
std::vector<Cot> vjp_name(Builder&, size_t, const Node&, Cots c, Context&) { return {c[0]}; }
std::vector<Cot> vjp_check_finite(Builder&, size_t, const Node&, Cots c, Context&) { return {c[0]}; }  // identity

std::vector<Cot> vjp_axis_index(Builder&, size_t, const Node&, Cots, Context&) { return {}; }  // no operands
std::vector<Cot> vjp_stop_gradient(Builder&, size_t, const Node&, Cots, Context&) { return {std::nullopt}; }

// The objective is the replicated loss counted once (shard_map's rule, Megatron's f and g): psum's result is
// replicated, so its transpose hands every rank the cotangent as it is; pvary's transpose sums the ranks'
// partial cotangents of a replicated value. all_gather (whose result rank-varying computation reads) and
// psum_scatter are each other's transposes.
std::vector<Cot> vjp_all_reduce(Builder&, size_t, const Node&, Cots c, Context&) { return {c[0]}; }
std::vector<Cot> vjp_pvary(Builder&, size_t, const Node& n, Cots c, Context&) {
  return {all_reduce(*c[0], n.attrs.str("axis"), n.attrs.integer("ranks"))};
}
// Each with the other's attributes, converting back to the operand's dtype: the transpose of a cast before
// the gather is a sum in the operand's dtype (FSDP reduces bf16 gradients in f32 when the weights are f32).
int64_t parts_of(const Node& n) { return n.attrs.has("parts") ? n.attrs.integer("parts") : 0; }
std::vector<Cot> vjp_all_gather(Builder& b, size_t, const Node& n, Cots c, Context&) {
  return {reduce_scatter(*c[0], n.attrs.str("axis"), n.attrs.integer("ranks"), n.attrs.integer("dim"), parts_of(n),
                         in(b, n, 0).dtype())};
}
std::vector<Cot> vjp_reduce_scatter(Builder& b, size_t, const Node& n, Cots c, Context&) {
  return {all_gather(*c[0], n.attrs.str("axis"), n.attrs.integer("ranks"), n.attrs.integer("dim"), parts_of(n),
                     in(b, n, 0).dtype())};
}

// Messages carry no cotangent back: a pipeline sends the gradient itself, as a message of its own.
std::vector<Cot> vjp_send(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate through send (scope '{}'): a stage's backward sends gradients explicitly", n.scope);
  return {};
}
std::vector<Cot> vjp_send_done(Builder& b, size_t i, const Node& n, Cots c, Context& ctx) { return vjp_send(b, i, n, c, ctx); }
// Fusion runs after autodiff and remat, on the step that is already differentiated.
std::vector<Cot> vjp_fusion(Builder&, size_t, const Node& n, Cots, Context&) {
  CHECK(false, "cannot differentiate a fusion (scope '{}'): fuse the differentiated step, not the model", n.scope);
  return {};
}
std::vector<Cot> vjp_recv(Builder&, size_t, const Node&, Cots, Context&) { return {}; }  // no operands

}  // namespace

VjpRule vjp_rule(Op op) {
  switch (op) {
#define X(e, ...) \
  case Op::e:       \
    return &vjp_##e;
    REMAT_OPS(X)
#undef X
  }
  ASSERT(false);
  return nullptr;
}

}  // namespace remat::autodiff
