// Tracing front end: model code calls functions on Tensor handles and each call appends a node to the
// Builder's graph, with its shape checked at once (a CHECK naming the op, scope and shapes).
//
//   ir::Graph g;
//   ir::Builder b(g);
//   Tensor x = b.param("x", {DType::f32, {8, 64}});
//   Tensor w = b.param("w", {DType::f32, {64, 256}});
//   { auto s = b.scope("mlp/wi_0"); b.result(checkpoint_name(matmul(x, w), "mlpwi_0")); }
//
// Arithmetic operators broadcast numpy-style (inserting broadcast_in_dim); the primitives below them
// require equal shapes, as in lax.
#pragma once

#include "ir/graph.h"

#include <array>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace remat::ir {

class Builder;

// A handle to a value being traced. type() and shape() return copies: tracing appends values, which
// moves the graph's type table, so a reference into it would dangle.
struct Tensor {
  Builder* b = nullptr;
  ValueId id = -1;

  Type type() const;
  Shape shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  int64_t rank() const { return type().rank(); }
  int64_t dim(int64_t i) const;  // negative i counts from the back
};

class Builder {
 public:
  // `base_scope` prefixes every scope (a scan body traced inside "decoder/layers" keeps that path).
  explicit Builder(Graph& g, std::string base_scope = "") : g_(&g), scope_(std::move(base_scope)) {}

  Graph& graph() { return *g_; }
  Tensor param(std::string name, Type t);
  Tensor wrap(ValueId v) { return Tensor{this, v}; }
  void result(Tensor t) { g_->results.push_back(t.id); }

  // Appends one node after checking its types; returns its outputs.
  std::vector<Tensor> emit(Op op, std::span<const Tensor> inputs, Attrs attrs = {},
                           std::shared_ptr<Graph> body = nullptr);
  Tensor emit1(Op op, std::span<const Tensor> inputs, Attrs attrs = {});

  // RAII name scope: nodes emitted while it lives get "outer/inner" scopes.
  class ScopeGuard {
   public:
    ScopeGuard(Builder& b, const std::string& name);
    ~ScopeGuard();
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;

   private:
    Builder& b_;
    size_t saved_;
  };
  ScopeGuard scope(const std::string& name) { return ScopeGuard(*this, name); }
  const std::string& current_scope() const { return scope_; }
  // Sets the scope outright (autodiff gives backward nodes their forward node's scope).
  void set_scope(std::string scope) { scope_ = std::move(scope); }

 private:
  Graph* g_;
  std::string scope_;
};

// ---- primitives (lax names and semantics) ----
struct DotDims {
  IntList lhs_contract, rhs_contract, lhs_batch, rhs_batch;
};
Tensor dot_general(Tensor a, Tensor b, const DotDims& dims);
Tensor neg(Tensor x);
Tensor exp(Tensor x);
Tensor log(Tensor x);
Tensor tanh(Tensor x);
Tensor logistic(Tensor x);
Tensor sqrt(Tensor x);
Tensor rsqrt(Tensor x);
Tensor sin(Tensor x);
Tensor cos(Tensor x);
Tensor pow(Tensor a, Tensor b);
Tensor max(Tensor a, Tensor b);
Tensor min(Tensor a, Tensor b);
Tensor compare(Tensor a, Tensor b, const std::string& direction);  // eq ne lt le gt ge
Tensor select(Tensor pred, Tensor on_true, Tensor on_false);
Tensor broadcast_in_dim(Tensor x, const Shape& shape, const IntList& dims);
Tensor reshape(Tensor x, const Shape& shape);
Tensor transpose(Tensor x, const IntList& perm);
Tensor slice(Tensor x, const IntList& start, const IntList& limit);
Tensor dynamic_slice(Tensor x, std::span<const Tensor> starts, const Shape& sizes);
Tensor dynamic_update_slice(Tensor x, Tensor update, std::span<const Tensor> starts);
Tensor concatenate(std::span<const Tensor> xs, int64_t dim);
Tensor reduce_sum(Tensor x, const IntList& axes);
Tensor reduce_max(Tensor x, const IntList& axes);
// reduce_sum(x * x, axes), without the square's array; with `divisor` (an f32 scalar), of (x / divisor).
Tensor sum_of_squares(Tensor x, const IntList& axes, std::optional<Tensor> divisor = std::nullopt);

// The rotary position embedding of x [B,T,N,Dh] by the angles whose cos and sin are [T,Dh/2] (ir/ops.h).
Tensor rope(Tensor x, Tensor cos, Tensor sin);
// RMSNorm of x [..., D] over its last axis with the scale w [D] (ir/ops.h), in `dtype` (x's when unset); its VJP
// (dx, dw).
Tensor rms_norm(Tensor x, Tensor w, double eps, std::optional<DType> dtype = std::nullopt);
std::array<Tensor, 2> rms_norm_grad(Tensor x, Tensor w, Tensor g, double eps);
// log_softmax(convert(x, dtype))[targets] along the last axis, without an array of x's size (ir/ops.h); its VJP.
std::array<Tensor, 2> target_log_prob(Tensor x, Tensor targets, DType dtype);  // (log-probabilities, row stats)
Tensor target_log_prob_grad(Tensor x, Tensor targets, Tensor stats, Tensor g, DType dtype);
// SwiGLU's product silu(gate)·up as one op (ir/ops.h), and its VJP (dgate, dup) from gate, up and the cotangent.
Tensor swiglu(Tensor gate, Tensor up);
std::array<Tensor, 2> swiglu_grad(Tensor gate, Tensor up, Tensor g);
// Flash attention (ir/ops.h): the context [B,T,H,Dh] and the log-sum-exp [B,H,T] (f32, f64 for f64); its VJP.
std::array<Tensor, 2> attention(Tensor q, Tensor k, Tensor v, bool causal, double scale);
// softmax's VJP from its input x and the cotangent g (and a masked softmax's mask and scale)
Tensor softmax_grad(Tensor x, Tensor g, std::optional<Tensor> mask = std::nullopt, double scale = 1);
Tensor log_softmax_grad(Tensor y, Tensor g);  // log_softmax's VJP from its result y and the cotangent g
std::array<Tensor, 3> attention_grad(Tensor q, Tensor k, Tensor v, Tensor context, Tensor lse, Tensor dcontext,
                                     bool causal, double scale);

// AdamW's update of one parameter as one fused op (ir/ops.h): the new p, m and v. With `loss_scale` (an f32
// scalar; needs `finite`) g is divided by it first.
struct AdamwHyper {
  double b1, b2, eps, weight_decay;
};
std::array<Tensor, 3> adamw(Tensor p, Tensor m, Tensor v, Tensor g, Tensor scale, Tensor lr, Tensor bias1, Tensor bias2,
                            std::optional<Tensor> finite, const AdamwHyper& h,
                            std::optional<Tensor> loss_scale = std::nullopt);
Tensor convert(Tensor x, DType to);
// Converts every x to `to` into one allocation (the outputs live and die together); see ops.h.
std::vector<Tensor> convert_group(std::span<const Tensor> xs, DType to);
Tensor iota(Builder& b, DType dtype, const Shape& shape, int64_t dim);
Tensor full(Builder& b, Type t, double value);
Tensor gather(Tensor table, Tensor indices);
Tensor scatter_add(Tensor operand, Tensor indices, Tensor updates);
Tensor checkpoint_name(Tensor x, const std::string& name);
// This rank's coordinate along mesh axis `axis` of `ranks` ranks: an i32 scalar (0 with one rank).
Tensor axis_index(Builder& b, const std::string& axis, int64_t ranks);
// x as a constant for differentiation: its cotangent is zero (jax.lax.stop_gradient).
Tensor stop_gradient(Tensor x);
// x, which every rank of mesh axis `axis` holds alike, where rank-varying computation reads it: the identity,
// whose transpose sums the cotangents over the `ranks` ranks (jax.lax.pvary; Megatron's f).
Tensor pvary(Tensor x, const std::string& axis, int64_t ranks);
// x, after failing the run (naming the scope) if it holds a NaN or an infinity; kept even if unread.
Tensor check_finite(Tensor x);
// The sum of x over the `ranks` ranks of mesh axis `axis` (psum), in rank order. `axis` may name a group of
// axes, "data,fsdp": the sum is then over all their ranks, in row-major order. The result is replicated: its
// transpose is the identity (read by rank-varying computation, it goes through pvary).
Tensor all_reduce(Tensor x, const std::string& axis, int64_t ranks);
// The ranks' x concatenated along `dim`, in rank order (all_gather). The blocks are those of the `parts`
// ranks of the last axis of `axis` (default 0: all `ranks`); over a group ("data,fsdp") x is the same on the
// ranks that differ only in the other axes (replicas of one shard), which each use the whole result, so that
// the transpose sums over all `ranks`. `to`: x is converted to this dtype first, the dtype on the wire and of
// the result (FSDP's cast before the gather).
Tensor all_gather(Tensor x, const std::string& axis, int64_t ranks, int64_t dim, int64_t parts = 0,
                  std::optional<DType> to = std::nullopt);
// The sum of all `ranks` ranks' x (in rank order), this rank's block of `dim` (psum_scatter): the block of
// its coordinate along the last axis of `axis`, of `parts` blocks (default: `ranks`). `to`: the sum is taken
// and returned in this dtype (each rank's x sent as it is, converted as it is added).
Tensor reduce_scatter(Tensor x, const std::string& axis, int64_t ranks, int64_t dim, int64_t parts = 0,
                      std::optional<DType> to = std::nullopt);
// Point to point along mesh axis `axis` (of `ranks` ranks) with the rank at coordinate `peer`, messages of kind
// `tag` (ops.h): send returns x (its buffer must live until send_done of that result), recv the next message.
Tensor send(Tensor x, const std::string& axis, int64_t ranks, int64_t peer, int64_t tag);
Tensor send_done(Tensor sent);
Tensor recv(Builder& b, const Type& t, const std::string& axis, int64_t ranks, int64_t peer, int64_t tag);

// lax.scan. `body(b, consts, carries, x_slices)` returns carries' next values followed by the y slices.
// Returns the final carries followed by the stacked ys ([length, ...]).
using ScanBody = std::function<std::vector<Tensor>(Builder& b, std::span<const Tensor> consts,
                                                   std::span<const Tensor> carries, std::span<const Tensor> xs)>;
std::vector<Tensor> scan(Builder& b, int64_t length, std::span<const Tensor> consts, std::span<const Tensor> carries,
                         std::span<const Tensor> xs, const ScanBody& body, const std::string& name = "body",
                         bool reverse = false);

// jax.checkpoint: traces `body(b, inputs)` into a remat region whose residuals `policy` decides when the
// graph is differentiated: the policy value (rematerialize::policy_attr) or its text (see remat/ for the
// policy language). Returns the body's results.
using RematBody = std::function<std::vector<Tensor>(Builder& b, std::span<const Tensor> inputs)>;
// `param_names` name the body's params (for reports); default a0, a1, ...
std::vector<Tensor> checkpoint(Builder& b, std::span<const Tensor> inputs, const RematBody& body,
                               AttrValue policy, const std::string& name = "checkpointed",
                               std::span<const std::string> param_names = {});

// ---- composites built from primitives ----
Tensor operator+(Tensor a, Tensor b);
Tensor operator-(Tensor a, Tensor b);
Tensor operator*(Tensor a, Tensor b);
Tensor operator/(Tensor a, Tensor b);
Tensor operator-(Tensor a);
Tensor operator+(Tensor a, double s);
Tensor operator*(Tensor a, double s);
Tensor operator*(double s, Tensor a);
Tensor operator-(double s, Tensor a);
Tensor scalar(Builder& b, DType dtype, double value);           // rank-0 constant
Tensor broadcast_to(Tensor x, const Shape& shape);              // numpy rules, trailing alignment
Tensor zeros_like(Tensor x);
Tensor matmul(Tensor a, Tensor b);       // a: (..., M, K), b: (K, N) or same-batch (..., K, N)
Tensor silu(Tensor x);
Tensor square(Tensor x);
Tensor mean(Tensor x, const IntList& axes);
// softmax along the last axis (the `softmax` op), its result in `dtype` (x's when unset).
Tensor softmax(Tensor x, std::optional<DType> dtype = std::nullopt);
// Megatron's scaled masked softmax (the `softmax` op with a mask): softmax(select(mask, x·scale, −inf)), the mask
// bool [S, T] for x [..., S, T]: attention's probabilities from the raw scores, in `dtype`.
Tensor masked_softmax(Tensor x, Tensor mask, double scale, DType dtype);
Tensor log_softmax(Tensor x);  // along the last axis (the `log_softmax` op), in x's dtype

}  // namespace remat::ir
