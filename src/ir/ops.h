// The op table: one X-macro row per op. Every stage keeps one function per row (shape rule in ir/, VJP in
// autodiff/, kernel in exec/), built from this list, so a missing rule is a link error that names the op.
// Primitive semantics follow jax.lax; what an op adds to lax, or an op lax lacks, is said beside its row.
//
// Each row answers, for every stage that reads it: X(op, arity, class, effects, cost)
//   arity   the number of operands; -1: variadic
//   class   what the op is: elementwise (element i of the result from element i of each operand),
//           view (the result is its operand's storage, retyped: no buffer of its own), layout (moves or
//           replicates data; rope, which rotates pairs of elements), contraction, reduction, constant, group,
//           transfer (between memory spaces), region (owns a body graph the executor runs), fused (owns a body
//           graph one kernel runs), collective (communicates between the ranks of a mesh axis)
//   effects pure, or effectful: DCE keeps it though nothing reads it; the scheduler never moves it
//   cost    FLOPs (ir/cost.h): none, per_output (one per result element), per_input (one per operand
//           element), per_update (one per element of operand 2), contraction (2·M·N·K), attention (its
//           matmuls over the (query, key) pairs it visits: 4·Dh per pair forward, 10·Dh backward), counted (per
//           element of the first operand, the count beside its row), body (its graph)
// Every column must be answered: a row with a missing one does not compile.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace remat::ir {

#define REMAT_OPS(X)                                                                                                 \
  X(dot_general, 2, contraction, pure, contraction)                                                                  \
  /* flash attention, (q [B,T,H,Dh], k and v [B,S,KV,Dh], KV dividing H: grouped-query) -> (context [B,T,H,Dh] in */ \
  /* q's dtype, per-row log-sum-exp [B,H,T] f32): softmax(q·kᵀ·scale, causal when `causal`)·v by an online */        \
  /* softmax over blocks of keys, in f32 (f64 for f64 operands, lse too); no score-sized array exists */             \
  X(attention, 3, contraction, pure, attention)                                                                      \
  /* (q, k, v, context, lse, d context) -> dq, dk, dv, the scores recomputed block by block from the log-sum-exp: */ \
  /* attention's VJP, not differentiable itself */                                                                   \
  X(attention_grad, 6, contraction, pure, attention)                                                                 \
  X(add, 2, elementwise, pure, per_output)                                                                           \
  X(sub, 2, elementwise, pure, per_output)                                                                           \
  X(mul, 2, elementwise, pure, per_output)                                                                           \
  X(div, 2, elementwise, pure, per_output)                                                                           \
  X(max, 2, elementwise, pure, per_output)                                                                           \
  X(min, 2, elementwise, pure, per_output)                                                                           \
  X(pow, 2, elementwise, pure, per_output)                                                                           \
  X(neg, 1, elementwise, pure, per_output)                                                                           \
  X(exp, 1, elementwise, pure, per_output)                                                                           \
  X(log, 1, elementwise, pure, per_output)                                                                           \
  X(tanh, 1, elementwise, pure, per_output)                                                                          \
  X(logistic, 1, elementwise, pure, per_output)                                                                      \
  X(sqrt, 1, elementwise, pure, per_output)                                                                          \
  X(rsqrt, 1, elementwise, pure, per_output)                                                                         \
  X(sin, 1, elementwise, pure, per_output)                                                                           \
  X(cos, 1, elementwise, pure, per_output)                                                                           \
  X(compare, 2, elementwise, pure, per_output)                                                                       \
  X(select, 3, elementwise, pure, per_output)                                                                        \
  /* The optimizer's fused ops need no full-size temporaries and give the bits of the primitives they replace. */    \
  /* adamw (p, m, v, g, scale, lr, bias1, bias2[, finite[, loss_scale]]), attributes b1, b2, eps, weight_decay: */   \
  /* g' = (g / loss_scale)·scale (the quotient rounded as sum_of_squares rounds it), m' = b1·m + (1−b1)·g', v' = */  \
  /* b2·v + (1−b2)·g'², p' = (p − p·(lr·wd)) − (m'/bias1) / (√(v'/bias2) + eps)·lr, each operation rounded to p's */ \
  /* dtype in that order; `finite` false returns p, m, v unchanged; elementwise: written over p, m, v (donation). */ \
  /* g may be of a narrower float than p (bf16 for f32 p): read as p's type, which holds it exactly */              \
  X(adamw, -1, elementwise, pure, per_output)                                                                        \
  X(broadcast_in_dim, 1, layout, pure, none)                                                                         \
  X(reshape, 1, view, pure, none)                                                                                    \
  X(transpose, 1, layout, pure, none)                                                                                \
  X(slice, 1, layout, pure, none)                                                                                    \
  X(dynamic_slice, -1, layout, pure, none)                                                                           \
  X(dynamic_update_slice, -1, layout, pure, none)                                                                    \
  X(concatenate, -1, layout, pure, none)                                                                             \
  X(reduce_sum, 1, reduction, pure, per_input)                                                                       \
  X(reduce_max, 1, reduction, pure, per_input)                                                                       \
  /* (x[, d]): reduce_sum(x·x) over `axes`, the square rounded to x's dtype and summed as reduce_sum sums; with d */ \
  /* (an f32 scalar: the loss scale) of x / d, the quotient in x's compute type rounded to x's dtype. With the */   \
  /* attribute dtype (wider than x's, holding it exactly): of convert_element_type(x, dtype), in and of that type */ \
  X(sum_of_squares, -1, reduction, pure, per_input)                                                                  \
  /* (x[, mask]): exp(x − max) / Σ exp(x − max) over the last axis in f32 (f64 for f64 x), the result in `dtype` */  \
  /* (attention's probabilities straight in the matmul's dtype); a row all −inf gives NaN, as the primitives do. */  \
  /* With a mask (bool [S, T], x [..., S, T]; attribute scale), Megatron's scaled masked softmax: the row is first */\
  /* select(mask, x·scale, −inf), the product rounded to x's dtype (the bits of that mul and select); a row's */     \
  /* hidden tail (past its last visible key: causal attention's upper triangle) is not exponentiated. 5 flops per */ \
  /* element (7 with a mask: the product and the select) */                                                          \
  X(softmax, -1, reduction, pure, counted)                                                                           \
  /* (x, g[, mask]): softmax's VJP from its input, p recomputed as softmax computes it, then p·(g − Σ g·p) in x's */ \
  /* dtype; with a mask, that rounded to x's dtype where visible (+0 where hidden), times scale, rounded again (the */\
  /* VJPs of select and mul). g (in the probabilities' dtype) read as it is: no f32 copy of a bf16 cotangent. The */ \
  /* max held constant, as jax.nn.softmax's stop_gradient (its cotangent is zero up to rounding). Not */             \
  /* differentiable. 9 flops per element: softmax's 5, g·p summed, g − Σ, times p (11 with a mask) */                \
  X(softmax_grad, -1, reduction, pure, counted)                                                                      \
  /* (x): (x − max) − log Σ exp(x − max) over the last axis in f32 (f64 for f64 x), the result in x's dtype (the */  \
  /* loss's log-probabilities: one pass, no exp array). 5 flops per element: max, subtract, exp, sum, minus log */   \
  X(log_softmax, 1, reduction, pure, counted)                                                                        \
  /* (y, g): log_softmax's VJP from its result y, g − exp(y)·Σ g in y's dtype (max held constant; in bf16 or f16 */  \
  /* exp(y) inherits y's rounding: up to |y|·2⁻⁹ relative in p, 2⁻⁹/e of |Σ g| in dx). Not differentiable. 4 */      \
  /* flops per element: Σ g, exp, times, subtract */                                                                 \
  X(log_softmax_grad, 2, reduction, pure, counted)                                                                   \
  /* (x [..., D], w [D]), attribute eps: RMSNorm, x·r·w with r = 1/√(Σ x²/D + eps) per row of the last axis, in */   \
  /* A = f32 (f64 for f64 x), the result in `dtype`. The bits of its composition of primitives: each square, */       \
  /* product and quotient rounded to A, Σ x² as reduce_sum sums (8 lanes in f64), Σ/D as a product by 1/D, then */   \
  /* + eps, 1/√, x·r, ·w. 4 flops per element: square, sum, ·r, ·w */                                                 \
  X(rms_norm, 2, reduction, pure, counted)                                                                           \
  /* (x, w, g) -> (dx in x's dtype, dw in w's dtype): rms_norm's VJP, r recomputed as rms_norm has it; with */      \
  /* gw = g·w, c = ((Σ gw·x)·(−½)·(r / a))·(1/D) (a = Σ x²/D + eps): dx = (gw·r + c·x) + c·x, dw = Σ over rows of */ \
  /* g·(x·r) in row order — the bits of the composition's VJP, its sums as reduce_sum's. Not differentiable. 10 */   \
  /* flops per element: g·w, ·x, Σ, ·r, c·x twice, two adds, x·r·g */                                                \
  X(rms_norm_grad, 3, reduction, pure, counted)                                                                      \
  /* (x [..., V], targets [...] i32), attribute dtype -> (y [...] in dtype, stats [..., 2]): y is */              \
  /* log_softmax(convert(x, dtype))[target] along the last axis (the loss's log-probability of each target) */     \
  /* without an array of x's size: the row's max m and log Σ exp(x − m) as log_softmax has them, (x_t − m) − log Σ */ \
  /* rounded to `dtype`; 0 where the target is outside [0, V). The bits of that log_softmax picked by a one-hot */ \
  /* reduce_sum. stats holds each row's (m, log Σ) in f32 (f64 for an f64 dtype): the VJP's residual, so the */      \
  /* backward does not find them again. 5 flops per element, as log_softmax */                                    \
  X(target_log_prob, 2, reduction, pure, counted)                                                                    \
  /* (x, targets, stats, g) -> dx in x's dtype: target_log_prob's VJP from the forward's row statistics; dx = */   \
  /* [j = t]·g − exp(y)·g with y the log-probabilities in `dtype` (g summed over the one-hot row as */               \
  /* log_softmax_grad sums it), rounded to `dtype`, then to x's (the composition's convert). Not differentiable. */ \
  /* 6 flops per element */                                                                                          \
  X(target_log_prob_grad, 4, reduction, pure, counted)                                                               \
  /* (gate, up) of one float type: SwiGLU's product silu(gate)·up = (gate·logistic(gate))·up, each of the */         \
  /* logistic and the two products rounded to that type; a bf16 product computes them in f32 and rounds its */       \
  /* result alone (XLA's excess precision; f16 keeps each rounding): the bits of that composition of logistic */     \
  /* and mul, between converts for bf16; */                                                                          \
  /* its VJP recomputes logistic(gate), so no array of the logistic or of silu outlives the op. A kernel of its */   \
  /* own, never fused. 3 flops per element: logistic, two products */                                                \
  X(swiglu, 2, elementwise, pure, counted)                                                                           \
  /* (gate, up, g) -> (dgate, dup): swiglu's VJP, s = logistic(gate) and a = gate·s recomputed; dup = g·a and, */    \
  /* with t = g·up, dgate = t·s + (t·gate)·(s·(1 − s)), each operation rounded to the type (f32 for bf16, as */      \
  /* swiglu) in the composition's order (the bits of the VJPs of mul and logistic). Not differentiable. */           \
  /* 10 flops per element */                                                                                         \
  X(swiglu_grad, 3, elementwise, pure, counted)                                                                      \
  /* (x [B,T,N,Dh], cos and sin [T,Dh/2] of x's dtype): the rotary position embedding (RoFormer; HF Llama's */      \
  /* rotate_half), element i of each head paired with element i + Dh/2 and the pair rotated by its position's */    \
  /* angle: y₁ = x₁·cos − x₂·sin, y₂ = x₂·cos + x₁·sin, each product and the sum rounded to x's dtype (the bits */   \
  /* of that composition of mul, neg, add). Its VJP is the rotation back, rope(g, cos, −sin). 3 flops per element */ \
  X(rope, 3, layout, pure, counted)                                                                                  \
  X(convert_element_type, 1, elementwise, pure, none)                                                                \
  /* several arrays converted to one dtype in one allocation, kept whole by the planner: its outputs live and die */ \
  /* together (a layer's compute copy of its weights, as jmp's cast_to_compute or FSDP's flat parameter) */          \
  X(convert_group, -1, group, pure, none)                                                                            \
  X(iota, 0, constant, pure, none)                                                                                   \
  /* a constant of a shape */                                                                                        \
  X(full, 0, constant, pure, none)                                                                                   \
  X(gather, 2, layout, pure, none)                                                                                   \
  X(scatter_add, 3, layout, pure, per_update)                                                                        \
  /* the identity that carries a checkpoint name (`name`) for remat policies */                                      \
  X(name, 1, view, pure, none)                                                                                       \
  /* the identity whose cotangent is zero: a value the backward treats as a constant (jax.lax.stop_gradient) */      \
  X(stop_gradient, 1, view, pure, none)                                                                              \
  /* the identity on a value every rank of mesh axis `axis` (`ranks` of them) holds alike, marking where rank- */    \
  /* varying computation reads it (jax.lax.pvary; Megatron's f): its transpose sums the ranks' cotangents */         \
  X(pvary, 1, view, pure, none)                                                                                      \
  /* the identity that fails the run, naming its scope, when its operand holds a NaN or an infinity */               \
  /* (jax_debug_nans as an op); effectful: never removed, never reordered against another effectful op */            \
  X(check_finite, 1, view, effectful, none)                                                                          \
  /* offload copies a value to host memory, reload brings it back; the remat VJP (autodiff/) inserts them */         \
  X(offload, 1, transfer, pure, none)                                                                                \
  X(reload, 1, transfer, pure, none)                                                                                 \
  /* Collectives over the `ranks` processes of mesh axis `axis`, or a group of axes ("data,fsdp"); effectful, so */  \
  /* every rank issues them in the same order. all_reduce (psum): every rank gets the same bits, summed in rank */   \
  /* order whatever the MPI library does (exec/mesh.h). Its result is replicated: its transpose is the */           \
  /* identity (Megatron's g; a replicated value read by rank-varying computation goes through pvary) */              \
  X(all_reduce, 1, collective, effectful, per_input)                                                                 \
  /* this rank's coordinate along mesh axis `axis` (of `ranks`), an i32 scalar (jax.lax.axis_index): one program */  \
  /* for every rank of the axis, each finding its own block (a vocabulary range, a kv head) */                       \
  X(axis_index, 0, constant, pure, none)                                                                             \
  /* the ranks' operands concatenated along `dim` in rank order; over a group, in `parts` blocks (those of its */    \
  /* last axis); `dtype`: converted before it communicates (FSDP's cast before the gather) */                        \
  X(all_gather, 1, collective, effectful, none)                                                                      \
  /* psum_scatter: the ranks' operands summed (in rank order), the rank keeping its block of `dim`; `parts` as */    \
  /* all_gather's; `dtype`: summed in it */                                                                          \
  X(reduce_scatter, 1, collective, effectful, per_input)                                                             \
  /* Point to point along a mesh axis (the pipeline's `stage`), effectful, so run in the order traced. send */       \
  /* starts sending its operand to coordinate `peer` as message kind `tag` and returns it (a view, untouched) */     \
  X(send, 1, view, effectful, none)                                                                                  \
  /* (a send's result) waits until that send completed, so the buffer lives until then */                            \
  X(send_done, 1, view, effectful, none)                                                                             \
  /* waits for the next message of kind `tag` from `peer` (of its `dtype` and `shape`); messages of one kind */      \
  /* between two ranks arrive in the order sent */                                                                   \
  X(recv, 0, constant, effectful, none)                                                                              \
  /* lax.scan with a closed body graph */                                                                            \
  X(scan, -1, region, pure, body)                                                                                    \
  /* jax.checkpoint: a call of its body graph whose residuals its `policy` attribute decides (remat/) */             \
  X(remat, -1, region, pure, body)                                                                                   \
  /* its body graph run as one kernel over tiles of its results (made by ir/fuse.h after autodiff and remat): */     \
  /* elementwise ops of one shape, the shape of every result, broadcasts of its params to it, iotas and fulls of */  \
  /* it; no intermediate, broadcast or constant is stored whole */                                                   \
  X(fusion, -1, fused, pure, body)

enum class Op : uint8_t {
#define X(e, ...) e,
  REMAT_OPS(X)
#undef X
};

inline constexpr int kNumOps = 0
#define X(e, ...) +1
    REMAT_OPS(X)
#undef X
    ;

enum class OpClass : uint8_t {
  elementwise, view, layout, contraction, reduction, constant, group, transfer, region, fused, collective
};
enum class OpEffects : uint8_t { pure, effectful };
enum class OpCost : uint8_t { none, per_output, per_input, per_update, contraction, attention, counted, body };

struct OpTraits {
  int arity;  // number of inputs, or -1 when variadic
  OpClass cls;
  OpEffects effects;
  OpCost cost;
};

constexpr OpTraits op_traits(Op op) {
  switch (op) {
#define X(e, arity, cls, effects, cost) \
  case Op::e:                           \
    return {arity, OpClass::cls, OpEffects::effects, OpCost::cost};
    REMAT_OPS(X)
#undef X
  }
  return {};
}

std::string_view op_name(Op op);
std::optional<Op> parse_op(std::string_view text);
constexpr int op_arity(Op op) { return op_traits(op).arity; }
// Element i of the result depends only on element i of each operand (safe to compute in place).
constexpr bool is_elementwise(Op op) { return op_traits(op).cls == OpClass::elementwise; }
// The elementwise ops a fusion may hold: all but those that run as kernels of their own (adamw, swiglu and
// swiglu_grad: several results, or a composition whose fused form would store its intermediates).
constexpr bool is_fusible(Op op) {
  return is_elementwise(op) && op != Op::adamw && op != Op::swiglu && op != Op::swiglu_grad;
}
// The operand whose storage the op's kernel may write result `k` over, when nothing reads it afterwards (the
// planner's in-place reuse): softmax_grad's x, log_softmax's x and log_softmax_grad's y, since each row of that
// operand is read whole (or element j before result element j is written) before that row of the result is
// written; rope's x, whose pair (i, i + Dh/2) is read before that pair of the result is written; swiglu's gate,
// and swiglu_grad's gate (dgate) and up (dup): element i of every operand is read before result i is written;
// scatter_add's operand, which its kernel copies into the result before adding each update to its row there (in
// place the copy is skipped: the embedding's gradient, a table of zeros, is not copied whole).
// -1: none.
constexpr int in_place_operand(Op op, size_t k = 0) {
  if (op == Op::swiglu_grad) return k < 2 ? static_cast<int>(k) : -1;
  return k == 0 && (op == Op::softmax_grad || op == Op::log_softmax || op == Op::log_softmax_grad || op == Op::rope ||
                    op == Op::swiglu || op == Op::scatter_add)
             ? 0
             : -1;
}
// The result is the operand's storage, retyped: planned and executed without a buffer of its own.
constexpr bool is_view(Op op) { return op_traits(op).cls == OpClass::view; }
// Kept by DCE though nothing reads it, and never moved by the scheduler.
constexpr bool is_effectful(Op op) { return op_traits(op).effects == OpEffects::effectful; }
// Ops that own a body graph.
constexpr bool has_body(Op op) { return op_traits(op).cls == OpClass::region || op_traits(op).cls == OpClass::fused; }
// The most values (params and node outputs) a fusion's body may hold: its kernel keeps a table of them per tile.
inline constexpr int kMaxFusionValues = 96;
// Ops whose body the executor runs itself (a fusion's body is run by its kernel).
constexpr bool is_region(Op op) { return op_traits(op).cls == OpClass::region; }

}  // namespace remat::ir
