#include "ir/builder.h"

#include "base/check.h"
#include "ir/shape_rules.h"

#include <algorithm>
#include <numeric>

namespace remat::ir {

Type Tensor::type() const {
  ASSERT(b != nullptr);
  return b->graph().type(id);
}

int64_t Tensor::dim(int64_t i) const {
  int64_t r = rank();
  int64_t k = i < 0 ? i + r : i;
  CHECK(k >= 0 && k < r, "dim {} is out of range for {}", i, type_str(type()));
  return shape()[static_cast<size_t>(k)];
}

Tensor Builder::param(std::string name, Type t) { return Tensor{this, g_->add_param(std::move(name), std::move(t))}; }

std::vector<Tensor> Builder::emit(Op op, std::span<const Tensor> inputs, Attrs attrs, std::shared_ptr<Graph> body) {
  std::vector<Type> in_types;
  Node n;
  n.op = op;
  for (const Tensor& t : inputs) {
    ASSERT(t.b == this);
    in_types.push_back(t.type());
    n.inputs.push_back(t.id);
  }
  std::string where = scope_.empty() ? fmt::format("{}", op_name(op))
                                     : fmt::format("{} (scope '{}')", op_name(op), scope_);
  std::vector<Type> out_types = infer_types(op, in_types, attrs, body.get(), where);
  std::vector<Tensor> outs;
  for (Type& t : out_types) {
    ValueId v = g_->new_value(std::move(t));
    n.outputs.push_back(v);
    outs.push_back(Tensor{this, v});
  }
  n.attrs = std::move(attrs);
  n.scope = scope_;
  n.body = std::move(body);
  n.origin = next_origin();
  g_->nodes.push_back(std::move(n));
  return outs;
}

Tensor Builder::emit1(Op op, std::span<const Tensor> inputs, Attrs attrs) {
  std::vector<Tensor> outs = emit(op, inputs, std::move(attrs));
  ASSERT(outs.size() == 1);
  return outs[0];
}

Builder::ScopeGuard::ScopeGuard(Builder& b, const std::string& name) : b_(b), saved_(b.scope_.size()) {
  CHECK(!name.empty() && name.find('"') == std::string::npos, "scope name '{}' must be non-empty and have no quotes",
        name);
  b_.scope_ += b_.scope_.empty() ? name : "/" + name;
}

Builder::ScopeGuard::~ScopeGuard() { b_.scope_.resize(saved_); }

namespace {
Tensor un(Op op, Tensor x) { return x.b->emit1(op, std::array{x}); }
Tensor bin(Op op, Tensor a, Tensor b) {
  CHECK(a.b == b.b, "{}: operands come from different graphs", op_name(op));
  return a.b->emit1(op, std::array{a, b});
}
}  // namespace

Tensor dot_general(Tensor a, Tensor b, const DotDims& d) {
  Attrs attrs;
  attrs.set("contract", IntLists{d.lhs_contract, d.rhs_contract});
  attrs.set("batch", IntLists{d.lhs_batch, d.rhs_batch});
  return a.b->emit1(Op::dot_general, std::array{a, b}, std::move(attrs));
}
Tensor neg(Tensor x) { return un(Op::neg, x); }
Tensor exp(Tensor x) { return un(Op::exp, x); }
Tensor log(Tensor x) { return un(Op::log, x); }
Tensor tanh(Tensor x) { return un(Op::tanh, x); }
Tensor logistic(Tensor x) { return un(Op::logistic, x); }
Tensor sqrt(Tensor x) { return un(Op::sqrt, x); }
Tensor rsqrt(Tensor x) { return un(Op::rsqrt, x); }
Tensor sin(Tensor x) { return un(Op::sin, x); }
Tensor cos(Tensor x) { return un(Op::cos, x); }
Tensor pow(Tensor a, Tensor b) { return bin(Op::pow, a, b); }
Tensor max(Tensor a, Tensor b) { return bin(Op::max, a, b); }
Tensor min(Tensor a, Tensor b) { return bin(Op::min, a, b); }

Tensor compare(Tensor a, Tensor b, const std::string& direction) {
  return a.b->emit1(Op::compare, std::array{a, b}, Attrs().set("direction", direction));
}
Tensor select(Tensor pred, Tensor on_true, Tensor on_false) {
  return pred.b->emit1(Op::select, std::array{pred, on_true, on_false});
}
Tensor broadcast_in_dim(Tensor x, const Shape& shape, const IntList& dims) {
  return x.b->emit1(Op::broadcast_in_dim, std::array{x}, Attrs().set("shape", shape).set("dims", dims));
}
Tensor reshape(Tensor x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return x.b->emit1(Op::reshape, std::array{x}, Attrs().set("shape", shape));
}
Tensor transpose(Tensor x, const IntList& perm) {
  return x.b->emit1(Op::transpose, std::array{x}, Attrs().set("perm", perm));
}
Tensor slice(Tensor x, const IntList& start, const IntList& limit) {
  return x.b->emit1(Op::slice, std::array{x}, Attrs().set("start", start).set("limit", limit));
}
Tensor dynamic_slice(Tensor x, std::span<const Tensor> starts, const Shape& sizes) {
  std::vector<Tensor> in{x};
  in.insert(in.end(), starts.begin(), starts.end());
  return x.b->emit1(Op::dynamic_slice, in, Attrs().set("sizes", sizes));
}
Tensor dynamic_update_slice(Tensor x, Tensor update, std::span<const Tensor> starts) {
  std::vector<Tensor> in{x, update};
  in.insert(in.end(), starts.begin(), starts.end());
  return x.b->emit1(Op::dynamic_update_slice, in);
}
Tensor concatenate(std::span<const Tensor> xs, int64_t dim) {
  CHECK(!xs.empty(), "concatenate needs at least one operand");
  return xs[0].b->emit1(Op::concatenate, xs, Attrs().set("dim", dim));
}
Tensor reduce_sum(Tensor x, const IntList& axes) {
  return x.b->emit1(Op::reduce_sum, std::array{x}, Attrs().set("axes", axes));
}
Tensor reduce_max(Tensor x, const IntList& axes) {
  return x.b->emit1(Op::reduce_max, std::array{x}, Attrs().set("axes", axes));
}
Tensor sum_of_squares(Tensor x, const IntList& axes, std::optional<Tensor> divisor) {
  std::vector<Tensor> in{x};
  if (divisor) in.push_back(*divisor);
  return x.b->emit1(Op::sum_of_squares, in, Attrs().set("axes", axes));
}
std::array<Tensor, 2> attention(Tensor q, Tensor k, Tensor v, bool causal, double scale) {
  std::vector<Tensor> out = q.b->emit(Op::attention, std::array{q, k, v}, Attrs().set("causal", causal).set("scale", scale));
  return {out[0], out[1]};
}
Tensor rope(Tensor x, Tensor cos, Tensor sin) { return x.b->emit1(Op::rope, std::array{x, cos, sin}, Attrs()); }
Tensor rms_norm(Tensor x, Tensor w, double eps, std::optional<DType> dtype) {
  return x.b->emit1(Op::rms_norm, std::array{x, w}, Attrs().set("eps", eps).set("dtype", dtype.value_or(x.dtype())));
}
std::array<Tensor, 2> rms_norm_grad(Tensor x, Tensor w, Tensor g, double eps) {
  std::vector<Tensor> out = x.b->emit(Op::rms_norm_grad, std::array{x, w, g}, Attrs().set("eps", eps));
  return {out[0], out[1]};
}
std::array<Tensor, 2> target_log_prob(Tensor x, Tensor targets, DType dtype) {
  std::vector<Tensor> out = x.b->emit(Op::target_log_prob, std::array{x, targets}, Attrs().set("dtype", dtype));
  return {out[0], out[1]};
}
Tensor target_log_prob_grad(Tensor x, Tensor targets, Tensor stats, Tensor g, DType dtype) {
  return x.b->emit1(Op::target_log_prob_grad, std::array{x, targets, stats, g}, Attrs().set("dtype", dtype));
}
Tensor swiglu(Tensor gate, Tensor up) { return gate.b->emit1(Op::swiglu, std::array{gate, up}, Attrs()); }
std::array<Tensor, 2> swiglu_grad(Tensor gate, Tensor up, Tensor g) {
  std::vector<Tensor> out = gate.b->emit(Op::swiglu_grad, std::array{gate, up, g}, Attrs());
  return {out[0], out[1]};
}
Tensor softmax_grad(Tensor x, Tensor g, std::optional<Tensor> mask, double scale) {
  if (!mask) return x.b->emit1(Op::softmax_grad, std::array{x, g}, Attrs());
  return x.b->emit1(Op::softmax_grad, std::array{x, g, *mask}, Attrs().set("scale", scale));
}
Tensor log_softmax_grad(Tensor y, Tensor g) { return y.b->emit1(Op::log_softmax_grad, std::array{y, g}, Attrs()); }

std::array<Tensor, 3> attention_grad(Tensor q, Tensor k, Tensor v, Tensor context, Tensor lse, Tensor dcontext,
                                     bool causal, double scale) {
  std::vector<Tensor> out = q.b->emit(Op::attention_grad, std::array{q, k, v, context, lse, dcontext},
                                      Attrs().set("causal", causal).set("scale", scale));
  return {out[0], out[1], out[2]};
}
std::array<Tensor, 3> adamw(Tensor p, Tensor m, Tensor v, Tensor g, Tensor scale, Tensor lr, Tensor bias1, Tensor bias2,
                            std::optional<Tensor> finite, const AdamwHyper& h, std::optional<Tensor> loss_scale) {
  ASSERT(finite || !loss_scale);
  std::vector<Tensor> in = {p, m, v, g, scale, lr, bias1, bias2};
  if (finite) in.push_back(*finite);
  if (loss_scale) in.push_back(*loss_scale);
  std::vector<Tensor> out = p.b->emit(Op::adamw, in,
                                      Attrs().set("b1", h.b1).set("b2", h.b2).set("eps", h.eps).set("weight_decay", h.weight_decay));
  return {out[0], out[1], out[2]};
}
Tensor convert(Tensor x, DType to) {
  if (x.dtype() == to) return x;
  return x.b->emit1(Op::convert_element_type, std::array{x}, Attrs().set("dtype", to));
}
std::vector<Tensor> convert_group(std::span<const Tensor> xs, DType to) {
  ASSERT(!xs.empty());
  return xs[0].b->emit(Op::convert_group, xs, Attrs().set("dtype", to));
}
Tensor iota(Builder& b, DType dtype, const Shape& shape, int64_t dim) {
  return b.emit1(Op::iota, {}, Attrs().set("dtype", dtype).set("shape", shape).set("dim", dim));
}
Tensor full(Builder& b, Type t, double value) {
  return b.emit1(Op::full, {}, Attrs().set("dtype", t.dtype).set("shape", t.shape).set("value", value));
}
Tensor gather(Tensor table, Tensor indices) { return bin(Op::gather, table, indices); }
Tensor scatter_add(Tensor operand, Tensor indices, Tensor updates) {
  return operand.b->emit1(Op::scatter_add, std::array{operand, indices, updates});
}
Tensor checkpoint_name(Tensor x, const std::string& name) {
  return x.b->emit1(Op::name, std::array{x}, Attrs().set("name", name));
}

Tensor axis_index(Builder& b, const std::string& axis, int64_t ranks) {
  return b.emit1(Op::axis_index, std::span<const Tensor>{}, Attrs().set("axis", axis).set("ranks", ranks));
}
Tensor stop_gradient(Tensor x) { return x.b->emit1(Op::stop_gradient, std::array{x}); }
Tensor pvary(Tensor x, const std::string& axis, int64_t ranks) {
  return x.b->emit1(Op::pvary, std::array{x}, Attrs().set("axis", axis).set("ranks", ranks));
}
Tensor check_finite(Tensor x) { return x.b->emit1(Op::check_finite, std::array{x}); }
Tensor all_reduce(Tensor x, const std::string& axis, int64_t ranks) {
  return x.b->emit1(Op::all_reduce, std::array{x}, Attrs().set("axis", axis).set("ranks", ranks));
}
Tensor send(Tensor x, const std::string& axis, int64_t ranks, int64_t peer, int64_t tag) {
  return x.b->emit1(Op::send, std::array{x}, Attrs().set("axis", axis).set("ranks", ranks).set("peer", peer).set("tag", tag));
}
Tensor send_done(Tensor sent) {
  return sent.b->emit1(Op::send_done, std::array{sent});
}
Tensor recv(Builder& b, const Type& t, const std::string& axis, int64_t ranks, int64_t peer, int64_t tag) {
  return b.emit1(Op::recv, {},
                 Attrs().set("axis", axis).set("ranks", ranks).set("peer", peer).set("tag", tag).set("dtype", t.dtype).set("shape", t.shape));
}

namespace {
// all_gather and reduce_scatter's attributes: `parts` and `dtype` only where they differ from the defaults.
Attrs sharding_attrs(Tensor x, const std::string& axis, int64_t ranks, int64_t dim, int64_t parts, std::optional<DType> to) {
  Attrs a = Attrs().set("axis", axis).set("ranks", ranks).set("dim", dim);
  if (parts != 0 && parts != ranks) a.set("parts", parts);
  if (to && *to != x.dtype()) a.set("dtype", *to);
  return a;
}
}  // namespace

Tensor all_gather(Tensor x, const std::string& axis, int64_t ranks, int64_t dim, int64_t parts, std::optional<DType> to) {
  return x.b->emit1(Op::all_gather, std::array{x}, sharding_attrs(x, axis, ranks, dim, parts, to));
}
Tensor reduce_scatter(Tensor x, const std::string& axis, int64_t ranks, int64_t dim, int64_t parts,
                      std::optional<DType> to) {
  return x.b->emit1(Op::reduce_scatter, std::array{x}, sharding_attrs(x, axis, ranks, dim, parts, to));
}

std::vector<Tensor> scan(Builder& b, int64_t length, std::span<const Tensor> consts, std::span<const Tensor> carries,
                         std::span<const Tensor> xs, const ScanBody& body, const std::string& name, bool reverse) {
  auto g = std::make_shared<Graph>();
  g->name = name;
  Builder bb(*g, b.current_scope());
  std::vector<Tensor> c, h, x;
  for (size_t i = 0; i < consts.size(); ++i) c.push_back(bb.param(fmt::format("c{}", i), consts[i].type()));
  for (size_t i = 0; i < carries.size(); ++i) h.push_back(bb.param(fmt::format("h{}", i), carries[i].type()));
  for (size_t i = 0; i < xs.size(); ++i) {
    Type t = xs[i].type();
    CHECK(t.rank() >= 1 && t.shape[0] == length, "scan '{}': xs {} must be stacked [{}, ...], got {}", name, i, length,
          type_str(t));
    t.shape.erase(t.shape.begin());
    x.push_back(bb.param(fmt::format("x{}", i), t));
  }
  for (Tensor r : body(bb, c, h, x)) bb.result(r);
  std::vector<Tensor> in(consts.begin(), consts.end());
  in.insert(in.end(), carries.begin(), carries.end());
  in.insert(in.end(), xs.begin(), xs.end());
  Attrs attrs;
  ScanAttrs{.length = length, .num_consts = static_cast<int64_t>(consts.size()),
            .num_carry = static_cast<int64_t>(carries.size()), .reverse = reverse}
      .write(attrs);
  return b.emit(Op::scan, in, std::move(attrs), std::move(g));
}

std::vector<Tensor> checkpoint(Builder& b, std::span<const Tensor> inputs, const RematBody& body,
                               AttrValue policy, const std::string& name,
                               std::span<const std::string> param_names) {
  CHECK(param_names.empty() || param_names.size() == inputs.size(), "checkpoint '{}': {} param names for {} inputs",
        name, param_names.size(), inputs.size());
  auto g = std::make_shared<Graph>();
  g->name = name;
  Builder bb(*g, b.current_scope());
  std::vector<Tensor> params;
  for (size_t i = 0; i < inputs.size(); ++i)
    params.push_back(bb.param(param_names.empty() ? fmt::format("a{}", i) : param_names[i], inputs[i].type()));
  for (Tensor r : body(bb, params)) bb.result(r);
  return b.emit(Op::remat, inputs, Attrs().set("policy", std::move(policy)), std::move(g));
}

// ---- composites ----

Tensor broadcast_to(Tensor x, const Shape& shape) {
  if (x.shape() == shape) return x;
  int64_t offset = static_cast<int64_t>(shape.size()) - x.rank();
  CHECK(offset >= 0, "cannot broadcast {} to {}", type_str(x.type()), shape_str(shape));
  IntList dims(static_cast<size_t>(x.rank()));
  std::iota(dims.begin(), dims.end(), offset);
  return broadcast_in_dim(x, shape, dims);
}

namespace {
Shape broadcast_shape(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    CHECK(da == db || da == 1 || db == 1, "shapes {} and {} do not broadcast", shape_str(a), shape_str(b));
    out[i] = std::max(da, db);
  }
  return out;
}

Tensor broadcasting(Op op, Tensor a, Tensor b) {
  Shape s = broadcast_shape(a.shape(), b.shape());
  return bin(op, broadcast_to(a, s), broadcast_to(b, s));
}
}  // namespace

Tensor operator+(Tensor a, Tensor b) { return broadcasting(Op::add, a, b); }
Tensor operator-(Tensor a, Tensor b) { return broadcasting(Op::sub, a, b); }
Tensor operator*(Tensor a, Tensor b) { return broadcasting(Op::mul, a, b); }
Tensor operator/(Tensor a, Tensor b) { return broadcasting(Op::div, a, b); }
Tensor operator-(Tensor a) { return neg(a); }
Tensor scalar(Builder& b, DType dtype, double value) { return full(b, Type{dtype, {}}, value); }
Tensor operator+(Tensor a, double s) { return a + scalar(*a.b, a.dtype(), s); }
Tensor operator*(Tensor a, double s) { return a * scalar(*a.b, a.dtype(), s); }
Tensor operator*(double s, Tensor a) { return a * s; }
Tensor operator-(double s, Tensor a) { return scalar(*a.b, a.dtype(), s) - a; }
Tensor zeros_like(Tensor x) { return full(*x.b, x.type(), 0.0); }

Tensor matmul(Tensor a, Tensor b) {
  CHECK(a.rank() >= 2 && (b.rank() == 2 || b.rank() == a.rank()),
        "matmul: lhs must be (..., M, K) and rhs (K, N) or (..., K, N), got {} and {}", type_str(a.type()),
        type_str(b.type()));
  int64_t r = a.rank();
  if (b.rank() == 2) return dot_general(a, b, DotDims{{r - 1}, {0}, {}, {}});
  IntList batch(static_cast<size_t>(r - 2));
  std::iota(batch.begin(), batch.end(), 0);
  return dot_general(a, b, DotDims{{r - 1}, {r - 2}, batch, batch});
}

Tensor silu(Tensor x) { return x * logistic(x); }
Tensor square(Tensor x) { return x * x; }

Tensor mean(Tensor x, const IntList& axes) {
  int64_t n = 1;
  for (int64_t a : axes) n *= x.dim(a);
  return reduce_sum(x, axes) * (1.0 / static_cast<double>(n));
}

Tensor softmax(Tensor x, std::optional<DType> dtype) {
  return x.b->emit1(Op::softmax, std::array{x}, Attrs().set("dtype", dtype.value_or(x.dtype())));
}
Tensor masked_softmax(Tensor x, Tensor mask, double scale, DType dtype) {
  return x.b->emit1(Op::softmax, std::array{x, mask}, Attrs().set("dtype", dtype).set("scale", scale));
}

Tensor log_softmax(Tensor x) { return x.b->emit1(Op::log_softmax, std::array{x}, Attrs()); }

}  // namespace remat::ir
