// Shape rules: the output types of every op from its input types and attributes, with lax semantics; the ops remat
// adds to lax have theirs in shape_rules_model_ops.cpp. Every failure is a CHECK naming the op's location (`where`)
// and the offending shapes.
#include "ir/shape_rules.h"
#include "ir/shape_rules_ctx.h"

#include "base/check.h"

#include <algorithm>
#include <numeric>
#include <set>

namespace remat::ir {

namespace shape_rules {
std::string types_str(const std::vector<Type>& ts) {
  std::vector<std::string> parts;
  for (const Type& t : ts) parts.push_back(type_str(t));
  return fmt::format("({})", fmt::join(parts, ", "));
}
}  // namespace shape_rules

namespace {

using shape_rules::Ctx;
using shape_rules::types_str;

void check_axis_list(const Ctx& c, const IntList& axes, int64_t rank, std::string_view what) {
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    CHECK(a >= 0 && a < rank, "{}: {} axis {} is out of range for rank {} (inputs {})", c.where, what, a, rank,
          types_str(c.in));
    CHECK(seen.insert(a).second, "{}: {} axis {} appears twice (inputs {})", c.where, what, a, types_str(c.in));
  }
}

std::vector<Type> same_as_input(const Ctx& c) { return {c.in[0]}; }

std::vector<Type> binary(const Ctx& c) {
  CHECK(c.in[0] == c.in[1], "{}: operands must have equal types, got {} and {}; broadcast one explicitly",
        c.where, type_str(c.in[0]), type_str(c.in[1]));
  CHECK(c.in[0].dtype != DType::pred, "{}: arithmetic on bool operands {}", c.where, types_str(c.in));
  return {c.in[0]};
}

std::vector<Type> float_unary(const Ctx& c) {
  CHECK(is_float(c.in[0].dtype), "{}: needs a floating-point operand, got {}", c.where, type_str(c.in[0]));
  return {c.in[0]};
}

#define UNARY_RULE(op) \
  std::vector<Type> rule_##op(const Ctx& c) { return float_unary(c); }
UNARY_RULE(exp)
UNARY_RULE(log)
UNARY_RULE(tanh)
UNARY_RULE(logistic)
UNARY_RULE(sqrt)
UNARY_RULE(rsqrt)
UNARY_RULE(sin)
UNARY_RULE(cos)
#undef UNARY_RULE

#define BINARY_RULE(op) \
  std::vector<Type> rule_##op(const Ctx& c) { return binary(c); }
BINARY_RULE(add)
BINARY_RULE(sub)
BINARY_RULE(mul)
BINARY_RULE(div)
BINARY_RULE(max)
BINARY_RULE(min)
#undef BINARY_RULE

std::vector<Type> rule_pow(const Ctx& c) {
  binary(c);
  return float_unary(c);
}

std::vector<Type> rule_neg(const Ctx& c) {
  CHECK(c.in[0].dtype != DType::pred, "{}: cannot negate bool {}", c.where, type_str(c.in[0]));
  return same_as_input(c);
}

std::vector<Type> rule_dot_general(const Ctx& c) {
  const Type& a = c.in[0];
  const Type& b = c.in[1];
  const IntLists& contract = c.attrs.int_lists("contract");
  const IntLists& batch = c.attrs.int_lists("batch");
  CHECK(contract.size() == 2 && batch.size() == 2, "{}: contract and batch must each be [[lhs dims],[rhs dims]]",
        c.where);
  CHECK(a.dtype == b.dtype, "{}: operand dtypes differ: {} vs {}", c.where, type_str(a), type_str(b));
  CHECK(contract[0].size() == contract[1].size() && batch[0].size() == batch[1].size(),
        "{}: lhs and rhs must list the same number of contracting and batch dims (contract {}/{}, batch {}/{})",
        c.where, contract[0].size(), contract[1].size(), batch[0].size(), batch[1].size());
  IntList lhs_used = batch[0], rhs_used = batch[1];
  lhs_used.insert(lhs_used.end(), contract[0].begin(), contract[0].end());
  rhs_used.insert(rhs_used.end(), contract[1].begin(), contract[1].end());
  check_axis_list(c, lhs_used, a.rank(), "lhs batch/contracting");
  check_axis_list(c, rhs_used, b.rank(), "rhs batch/contracting");
  Shape out;
  for (size_t i = 0; i < batch[0].size(); ++i) {
    int64_t da = a.shape[static_cast<size_t>(batch[0][i])], db = b.shape[static_cast<size_t>(batch[1][i])];
    CHECK(da == db, "{}: batch dims differ: lhs dim {} is {}, rhs dim {} is {} ({} x {})", c.where, batch[0][i], da,
          batch[1][i], db, type_str(a), type_str(b));
    out.push_back(da);
  }
  for (size_t i = 0; i < contract[0].size(); ++i) {
    int64_t da = a.shape[static_cast<size_t>(contract[0][i])], db = b.shape[static_cast<size_t>(contract[1][i])];
    CHECK(da == db, "{}: contracting dims differ: lhs dim {} is {}, rhs dim {} is {} ({} x {})", c.where,
          contract[0][i], da, contract[1][i], db, type_str(a), type_str(b));
  }
  for (int64_t d = 0; d < a.rank(); ++d)
    if (std::find(lhs_used.begin(), lhs_used.end(), d) == lhs_used.end()) out.push_back(a.shape[static_cast<size_t>(d)]);
  for (int64_t d = 0; d < b.rank(); ++d)
    if (std::find(rhs_used.begin(), rhs_used.end(), d) == rhs_used.end()) out.push_back(b.shape[static_cast<size_t>(d)]);
  return {Type{a.dtype, out}};
}

std::vector<Type> rule_compare(const Ctx& c) {
  CHECK(c.in[0] == c.in[1], "{}: operands must have equal types, got {} and {}", c.where, type_str(c.in[0]),
        type_str(c.in[1]));
  const std::string& dir = c.attrs.str("direction");
  static const std::set<std::string> kDirections = {"eq", "ne", "lt", "le", "gt", "ge"};
  CHECK(kDirections.count(dir), "{}: direction '{}' is not one of eq, ne, lt, le, gt, ge", c.where, dir);
  return {Type{DType::pred, c.in[0].shape}};
}

std::vector<Type> rule_select(const Ctx& c) {
  CHECK(c.in[0].dtype == DType::pred && c.in[0].shape == c.in[1].shape,
        "{}: predicate must be bool with the operands' shape, got {}", c.where, types_str(c.in));
  CHECK(c.in[1] == c.in[2], "{}: branches must have equal types, got {}", c.where, types_str(c.in));
  return {c.in[1]};
}

std::vector<Type> rule_broadcast_in_dim(const Ctx& c) {
  const Shape& shape = c.attrs.ints("shape");
  const IntList& dims = c.attrs.ints("dims");
  const Type& x = c.in[0];
  CHECK(static_cast<int64_t>(dims.size()) == x.rank(), "{}: dims {} must map each of the {} operand dims ({})",
        c.where, shape_str(dims), x.rank(), type_str(x));
  check_axis_list(c, dims, static_cast<int64_t>(shape.size()), "broadcast");
  for (size_t i = 0; i < dims.size(); ++i) {
    CHECK(i == 0 || dims[i] > dims[i - 1], "{}: dims {} must be strictly increasing", c.where, shape_str(dims));
    int64_t from = x.shape[i], to = shape[static_cast<size_t>(dims[i])];
    CHECK(from == to || from == 1, "{}: operand dim {} of size {} cannot broadcast to size {} ({} -> {})", c.where, i,
          from, to, type_str(x), shape_str(shape));
  }
  return {Type{x.dtype, shape}};
}

std::vector<Type> rule_reshape(const Ctx& c) {
  const Shape& shape = c.attrs.ints("shape");
  CHECK(num_elements(shape) == c.in[0].num_elements(), "{}: cannot reshape {} ({} elements) to {} ({} elements)",
        c.where, type_str(c.in[0]), c.in[0].num_elements(), shape_str(shape), num_elements(shape));
  return {Type{c.in[0].dtype, shape}};
}

std::vector<Type> rule_transpose(const Ctx& c) {
  const IntList& perm = c.attrs.ints("perm");
  CHECK(static_cast<int64_t>(perm.size()) == c.in[0].rank(), "{}: perm {} does not match rank of {}", c.where,
        shape_str(perm), type_str(c.in[0]));
  check_axis_list(c, perm, c.in[0].rank(), "perm");
  Shape out;
  for (int64_t p : perm) out.push_back(c.in[0].shape[static_cast<size_t>(p)]);
  return {Type{c.in[0].dtype, out}};
}

std::vector<Type> rule_slice(const Ctx& c) {
  const IntList& start = c.attrs.ints("start");
  const IntList& limit = c.attrs.ints("limit");
  const Type& x = c.in[0];
  CHECK(static_cast<int64_t>(start.size()) == x.rank() && static_cast<int64_t>(limit.size()) == x.rank(),
        "{}: start {} and limit {} must have one entry per dim of {}", c.where, shape_str(start), shape_str(limit),
        type_str(x));
  Shape out;
  for (size_t i = 0; i < start.size(); ++i) {
    CHECK(0 <= start[i] && start[i] <= limit[i] && limit[i] <= x.shape[i],
          "{}: slice [{}, {}) is out of bounds for dim {} of {}", c.where, start[i], limit[i], i, type_str(x));
    out.push_back(limit[i] - start[i]);
  }
  return {Type{x.dtype, out}};
}

void check_scalar_indices(const Ctx& c, size_t first, int64_t rank) {
  CHECK(static_cast<int64_t>(c.in.size() - first) == rank, "{}: needs {} scalar i32 start indices, got {} ({})",
        c.where, rank, c.in.size() - first, types_str(c.in));
  for (size_t i = first; i < c.in.size(); ++i)
    CHECK(c.in[i].dtype == DType::i32 && c.in[i].rank() == 0, "{}: start index {} must be i32[], got {}", c.where,
          i - first, type_str(c.in[i]));
}

std::vector<Type> rule_dynamic_slice(const Ctx& c) {
  CHECK(!c.in.empty(), "{}: needs an operand", c.where);
  const Type& x = c.in[0];
  check_scalar_indices(c, 1, x.rank());
  const IntList& sizes = c.attrs.ints("sizes");
  CHECK(static_cast<int64_t>(sizes.size()) == x.rank(), "{}: sizes {} must match rank of {}", c.where,
        shape_str(sizes), type_str(x));
  for (size_t i = 0; i < sizes.size(); ++i)
    CHECK(0 <= sizes[i] && sizes[i] <= x.shape[i], "{}: size {} exceeds dim {} of {}", c.where, sizes[i], i,
          type_str(x));
  return {Type{x.dtype, sizes}};
}

std::vector<Type> rule_dynamic_update_slice(const Ctx& c) {
  CHECK(c.in.size() >= 2, "{}: needs an operand and an update", c.where);
  const Type& x = c.in[0];
  const Type& u = c.in[1];
  CHECK(x.dtype == u.dtype && x.rank() == u.rank(), "{}: update {} does not fit operand {}", c.where, type_str(u),
        type_str(x));
  for (size_t i = 0; i < x.shape.size(); ++i)
    CHECK(u.shape[i] <= x.shape[i], "{}: update {} is larger than operand {} in dim {}", c.where, type_str(u),
          type_str(x), i);
  check_scalar_indices(c, 2, x.rank());
  return {x};
}

std::vector<Type> rule_concatenate(const Ctx& c) {
  CHECK(!c.in.empty(), "{}: needs at least one operand", c.where);
  int64_t dim = c.attrs.integer("dim");
  CHECK(dim >= 0 && dim < c.in[0].rank(), "{}: dim {} out of range for {}", c.where, dim, type_str(c.in[0]));
  Type out = c.in[0];
  out.shape[static_cast<size_t>(dim)] = 0;
  for (const Type& t : c.in) {
    Type a = t, b = c.in[0];
    a.shape[static_cast<size_t>(dim)] = b.shape[static_cast<size_t>(dim)] = 0;
    CHECK(a == b, "{}: operands differ outside dim {}: {}", c.where, dim, types_str(c.in));
    out.shape[static_cast<size_t>(dim)] += t.shape[static_cast<size_t>(dim)];
  }
  return {out};
}

std::vector<Type> reduce(const Ctx& c) {
  const IntList& axes = c.attrs.ints("axes");
  check_axis_list(c, axes, c.in[0].rank(), "reduction");
  Shape out;
  for (int64_t d = 0; d < c.in[0].rank(); ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) out.push_back(c.in[0].shape[static_cast<size_t>(d)]);
  return {Type{c.in[0].dtype, out}};
}
std::vector<Type> rule_reduce_sum(const Ctx& c) { return reduce(c); }
std::vector<Type> rule_reduce_max(const Ctx& c) { return reduce(c); }
std::vector<Type> rule_sum_of_squares(const Ctx& c) {
  CHECK(c.in.size() == 1 || c.in.size() == 2, "{}: sum_of_squares takes x[, divisor], got {}", c.where, types_str(c.in));
  CHECK(is_float(c.in[0].dtype), "{}: needs a floating-point operand, got {}", c.where, type_str(c.in[0]));
  CHECK(c.in.size() == 1 || c.in[1] == (Type{DType::f32, {}}), "{}: sum_of_squares' divisor must be an f32 scalar, "
        "got {}", c.where, types_str(c.in));
  std::vector<Type> out = reduce(c);
  if (c.attrs.has("dtype")) {  // of x widened to it
    const DType to = c.attrs.dtype("dtype");
    CHECK(widens_exactly(c.in[0].dtype, to), "{}: sum_of_squares' dtype {} must hold every value of x ({}) and be "
          "wider: bf16 or f16 to f32 or f64, f32 to f64 (or leave dtype out)", c.where, dtype_name(to), type_str(c.in[0]));
    out[0].dtype = to;
  }
  return out;
}

std::vector<Type> rule_convert_element_type(const Ctx& c) { return {Type{c.attrs.dtype("dtype"), c.in[0].shape}}; }
std::vector<Type> rule_convert_group(const Ctx& c) {
  CHECK(!c.in.empty(), "{}: needs at least one operand", c.where);
  std::vector<Type> out;
  for (const Type& t : c.in) out.push_back(Type{c.attrs.dtype("dtype"), t.shape});
  return out;
}

std::vector<Type> rule_iota(const Ctx& c) {
  Type t{c.attrs.dtype("dtype"), c.attrs.ints("shape")};
  int64_t dim = c.attrs.integer("dim");
  CHECK(dim >= 0 && dim < t.rank(), "{}: iota dim {} out of range for {}", c.where, dim, type_str(t));
  return {t};
}

std::vector<Type> rule_full(const Ctx& c) { return {Type{c.attrs.dtype("dtype"), c.attrs.ints("shape")}}; }

std::vector<Type> rule_gather(const Ctx& c) {
  const Type& table = c.in[0];
  const Type& idx = c.in[1];
  CHECK(table.rank() >= 1, "{}: table must have rank >= 1, got {}", c.where, type_str(table));
  CHECK(idx.dtype == DType::i32, "{}: indices must be i32, got {}", c.where, type_str(idx));
  Shape out = idx.shape;
  out.insert(out.end(), table.shape.begin() + 1, table.shape.end());
  return {Type{table.dtype, out}};
}

std::vector<Type> rule_scatter_add(const Ctx& c) {
  const Type& table = c.in[0];
  std::vector<Type> gather_in = {c.in[0], c.in[1]};
  Ctx g{c.where, gather_in, c.attrs, nullptr};
  Type expect = rule_gather(g)[0];
  CHECK(c.in[2] == expect, "{}: updates must be {} for table {} and indices {}, got {}", c.where, type_str(expect),
        type_str(table), type_str(c.in[1]), type_str(c.in[2]));
  return {table};
}

std::vector<Type> rule_name(const Ctx& c) {
  CHECK(!c.attrs.str("name").empty(), "{}: checkpoint name must not be empty", c.where);
  return same_as_input(c);
}

std::vector<Type> rule_stop_gradient(const Ctx& c) { return same_as_input(c); }
std::vector<Type> rule_pvary(const Ctx& c) {
  CHECK(!c.attrs.str("axis").empty() && c.attrs.integer("ranks") >= 1,
        "{}: pvary needs a mesh axis name and its number of ranks (>= 1)", c.where);
  return same_as_input(c);
}

std::vector<Type> rule_axis_index(const Ctx& c) {
  CHECK(!c.attrs.str("axis").empty() && c.attrs.integer("ranks") >= 1,
        "{}: axis_index needs a mesh axis name and its number of ranks (>= 1)", c.where);
  return {Type{DType::i32, {}}};
}

std::vector<Type> rule_check_finite(const Ctx& c) {
  CHECK(is_float(c.in[0].dtype), "{}: check_finite takes a floating-point operand, got {}", c.where, type_str(c.in[0]));
  return same_as_input(c);
}
std::vector<Type> rule_offload(const Ctx& c) { return same_as_input(c); }
// all_gather and reduce_scatter: the mesh axis (or group), its ranks, a dimension of the operand, the
// number of blocks (a divisor of the ranks) and the result's dtype.
struct Sharded {
  int64_t dim, parts;
  DType dtype;
};
Sharded sharded(const Ctx& c, const char* op) {
  CHECK(is_float(c.in[0].dtype), "{}: {} takes a floating-point operand, got {}", c.where, op, type_str(c.in[0]));
  const int64_t ranks = c.attrs.integer("ranks");
  CHECK(!c.attrs.str("axis").empty() && ranks >= 1, "{}: {} needs a mesh axis name and its number of ranks (>= 1)",
        c.where, op);
  const int64_t dim = c.attrs.integer("dim");
  CHECK(dim >= 0 && dim < c.in[0].rank(), "{}: {} dim {} is not a dimension of {}", c.where, op, dim, type_str(c.in[0]));
  const int64_t parts = c.attrs.has("parts") ? c.attrs.integer("parts") : ranks;
  CHECK(parts >= 1 && ranks % parts == 0, "{}: {} into {} parts over {} ranks: the parts must divide the ranks",
        c.where, op, parts, ranks);
  const DType dtype = c.attrs.has("dtype") ? c.attrs.dtype("dtype") : c.in[0].dtype;
  CHECK(is_float(dtype), "{}: {} converts to {}, which is not a floating-point dtype", c.where, op, dtype_name(dtype));
  return {dim, parts, dtype};
}
std::vector<Type> rule_all_gather(const Ctx& c) {
  const Sharded s = sharded(c, "all_gather");
  Type t{s.dtype, c.in[0].shape};
  t.shape[static_cast<size_t>(s.dim)] *= s.parts;
  return {t};
}
std::vector<Type> rule_reduce_scatter(const Ctx& c) {
  const Sharded s = sharded(c, "reduce_scatter");
  Type t{s.dtype, c.in[0].shape};
  int64_t& d = t.shape[static_cast<size_t>(s.dim)];
  CHECK(d % s.parts == 0, "{}: reduce_scatter into {} parts needs dim {} of {} to divide by them", c.where, s.parts,
        s.dim, type_str(c.in[0]));
  d /= s.parts;
  return {t};
}
std::vector<Type> rule_all_reduce(const Ctx& c) {
  CHECK(is_float(c.in[0].dtype), "{}: all_reduce takes a floating-point operand, got {}", c.where, type_str(c.in[0]));
  CHECK(!c.attrs.str("axis").empty() && c.attrs.integer("ranks") >= 1,
        "{}: all_reduce needs a mesh axis name and its number of ranks (>= 1)", c.where);
  return same_as_input(c);
}
std::vector<Type> rule_reload(const Ctx& c) { return same_as_input(c); }
// send and recv: a mesh axis, its ranks, the peer's coordinate along it and the message kind.
void check_peer(const Ctx& c, const char* op) {
  const int64_t ranks = c.attrs.integer("ranks"), peer = c.attrs.integer("peer");
  CHECK(!c.attrs.str("axis").empty() && ranks >= 1, "{}: {} needs a mesh axis name and its number of ranks (>= 1)",
        c.where, op);
  CHECK(peer >= 0 && peer < ranks, "{}: {} peer {} is not one of the {} ranks of axis '{}'", c.where, op, peer, ranks,
        c.attrs.str("axis"));
  CHECK(c.attrs.integer("tag") >= 0, "{}: {} needs a message kind (tag >= 0)", c.where, op);
}
std::vector<Type> rule_send(const Ctx& c) {
  check_peer(c, "send");
  return same_as_input(c);
}
std::vector<Type> rule_send_done(const Ctx& c) { return same_as_input(c); }
std::vector<Type> rule_recv(const Ctx& c) {
  check_peer(c, "recv");
  return {Type{c.attrs.dtype("dtype"), c.attrs.ints("shape")}};
}

// A call of its body (remat, fusion): the body takes the operands as they are and returns the results.
std::vector<Type> call_types(const Ctx& c, std::string_view op) {
  CHECK(c.body != nullptr, "{}: {} needs a body graph", c.where, op);
  const Graph& body = *c.body;
  CHECK(body.params.size() == c.in.size(), "{}: body @{} takes {} params but the {} passes {}", c.where, body.name,
        body.params.size(), op, c.in.size());
  for (size_t i = 0; i < c.in.size(); ++i)
    CHECK(body.type(body.params[i]) == c.in[i], "{}: body param {} is {} but the {} passes {}", c.where, i,
          type_str(body.type(body.params[i])), op, type_str(c.in[i]));
  std::vector<Type> out;
  for (ValueId r : body.results) out.push_back(body.type(r));
  return out;
}

std::vector<Type> rule_remat(const Ctx& c) {
  std::vector<Type> out = call_types(c, "remat");
  const AttrValue& policy = c.attrs.get("policy");  // a string (parsed from text) or the policy value (traced)
  CHECK(std::holds_alternative<ObjectAttr>(policy) || !c.attrs.str("policy").empty(), "{}: remat needs a policy",
        c.where);
  return out;
}

// A fusion's body (ir/ops.h) is what its kernel can run: every node a fusible elementwise op (ir::is_fusible), a broadcast of a
// param, an iota or a full, every node's result of the loop shape (the results' shape), elementwise operands too.
std::vector<Type> rule_fusion(const Ctx& c) {
  std::vector<Type> out = call_types(c, "fusion");
  const Graph& body = *c.body;
  CHECK(!body.results.empty() && body.num_values() <= kMaxFusionValues,
        "{}: a fusion's body has 1 to {} values and at least one result; @{} has {} values, {} results", c.where,
        kMaxFusionValues, body.name, body.num_values(), body.results.size());
  const Shape& loop = body.type(body.results[0]).shape;
  std::vector<bool> param(body.types.size(), false), result(body.types.size(), false);
  for (ValueId p : body.params) param[static_cast<size_t>(p)] = true;
  for (ValueId r : body.results) {
    CHECK(!param[static_cast<size_t>(r)] && !result[static_cast<size_t>(r)],
          "{}: a fusion's results are distinct values its body computes; @{} returns a param or a value twice", c.where, body.name);
    result[static_cast<size_t>(r)] = true;
  }
  for (size_t i = 0; i < body.nodes.size(); ++i) {
    const Node& m = body.nodes[i];
    const std::string where = fmt::format("{}: in @{}, {}", c.where, body.name, describe_node(body, i));
    const bool broadcast = m.op == Op::broadcast_in_dim;
    CHECK(is_fusible(m.op) || broadcast || m.op == Op::iota || m.op == Op::full,
          "{}: a fusion holds elementwise ops, broadcasts of its params, iotas and fulls only", where);
    CHECK(m.outputs.size() == 1 && body.type(m.outputs[0]).shape == loop, "{}: every value a fusion computes has its loop shape {}",
          where, shape_str(loop));
    for (ValueId v : m.inputs)
      CHECK(broadcast ? param[static_cast<size_t>(v)] : body.type(v).shape == loop,
            "{}: {}", where, broadcast ? "a fused broadcast reads a param" : "an elementwise operand has the loop shape");
    CHECK(!(m.op == Op::div && body.type(m.inputs[0]).dtype == DType::i32), "{}: integer division is not fused", where);
  }
  return out;
}

std::vector<Type> rule_scan(const Ctx& c) {
  CHECK(c.body != nullptr, "{}: scan needs a body graph", c.where);
  const Graph& body = *c.body;
  // `reverse` is not part of the types, but the executor reads it: scan_attrs checks that it is a bool.
  const auto [length, nc, nh, reverse] = scan_attrs(c.attrs);
  CHECK(length >= 1, "{}: scan length must be >= 1, got {}", c.where, length);
  int64_t n_in = static_cast<int64_t>(c.in.size());
  CHECK(nc >= 0 && nh >= 0 && nc <= n_in && nh <= n_in - nc, "{}: num_consts {} + num_carry {} exceed {} inputs", c.where, nc, nh,
        n_in);
  CHECK(body.params.size() == c.in.size(), "{}: body @{} takes {} params but the scan passes {}", c.where, body.name,
        body.params.size(), c.in.size());
  for (int64_t i = 0; i < n_in; ++i) {
    Type expect = c.in[static_cast<size_t>(i)];
    if (i >= nc + nh) {
      CHECK(expect.rank() >= 1 && expect.shape[0] == length, "{}: xs input {} must be stacked [{}, ...], got {}",
            c.where, i, length, type_str(expect));
      expect.shape.erase(expect.shape.begin());
    }
    const Type& got = body.type(body.params[static_cast<size_t>(i)]);
    CHECK(got == expect, "{}: body param {} is {} but the scan passes {}", c.where, i, type_str(got),
          type_str(expect));
  }
  CHECK(static_cast<int64_t>(body.results.size()) >= nh, "{}: body returns {} values, fewer than {} carries",
        c.where, body.results.size(), nh);
  std::vector<Type> out;
  for (size_t i = 0; i < body.results.size(); ++i) {
    Type t = body.type(body.results[i]);
    if (static_cast<int64_t>(i) < nh) {
      const Type& carry_in = c.in[static_cast<size_t>(nc) + i];
      CHECK(t == carry_in, "{}: carry {} enters as {} but the body returns {}", c.where, i, type_str(carry_in),
            type_str(t));
    } else {
      t.shape.insert(t.shape.begin(), length);
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace

std::vector<Type> infer_types(Op op, const std::vector<Type>& inputs, const Attrs& attrs, const Graph* body,
                              std::string_view where) {
  int arity = op_arity(op);
  CHECK(arity < 0 || static_cast<int>(inputs.size()) == arity, "{}: takes {} operands, got {}", where, arity,
        inputs.size());
  using namespace shape_rules;  // the rules of the ops beyond lax (shape_rules_model_ops.cpp)
  Ctx c{where, inputs, attrs, body};
  switch (op) {
#define X(e, ...)  \
  case Op::e:    \
    return rule_##e(c);
    REMAT_OPS(X)
#undef X
  }
  ASSERT(false);
  return {};
}

}  // namespace remat::ir
