// The op table: one X-macro row per op, X(enumerator, arity). Arity -1 means variadic.
// Every stage keeps one function per row (shape rule in ir/, VJP in autodiff/, kernel in exec/), built
// from this list, so a missing rule is a link error that names the op.
// Primitive semantics follow jax.lax (see DESIGN §2); `full` makes a constant of a shape, `name` is the
// identity that carries a checkpoint name, `scan` is lax.scan with a closed body graph, `remat` is
// jax.checkpoint: a call of its body graph whose residuals its `policy` attribute decides (see remat/).
// `offload` copies a value to host memory and `reload` brings it back; the remat pass inserts them.
// `convert_group` converts several arrays to one dtype into a single allocation: its outputs live and
// die together (a layer's compute copy of its weights as one buffer, like jmp's cast_to_compute of a
// layer's parameters or FSDP's flat parameter); the planner keeps it whole.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace remat::ir {

#define REMAT_OPS(X)              \
  X(dot_general, 2)               \
  X(add, 2)                       \
  X(sub, 2)                       \
  X(mul, 2)                       \
  X(div, 2)                       \
  X(max, 2)                       \
  X(min, 2)                       \
  X(pow, 2)                       \
  X(neg, 1)                       \
  X(exp, 1)                       \
  X(log, 1)                       \
  X(tanh, 1)                      \
  X(logistic, 1)                  \
  X(sqrt, 1)                      \
  X(rsqrt, 1)                     \
  X(sin, 1)                       \
  X(cos, 1)                       \
  X(compare, 2)                   \
  X(select, 3)                    \
  X(broadcast_in_dim, 1)          \
  X(reshape, 1)                   \
  X(transpose, 1)                 \
  X(slice, 1)                     \
  X(dynamic_slice, -1)            \
  X(dynamic_update_slice, -1)     \
  X(concatenate, -1)              \
  X(reduce_sum, 1)                \
  X(reduce_max, 1)                \
  X(convert_element_type, 1)      \
  X(convert_group, -1)            \
  X(iota, 0)                      \
  X(full, 0)                      \
  X(gather, 2)                    \
  X(scatter_add, 3)               \
  X(name, 1)                      \
  X(offload, 1)                   \
  X(reload, 1)                    \
  X(scan, -1)                     \
  X(remat, -1)

enum class Op : uint8_t {
#define X(e, arity) e,
  REMAT_OPS(X)
#undef X
};

inline constexpr int kNumOps = 0
#define X(e, arity) +1
    REMAT_OPS(X)
#undef X
    ;

std::string_view op_name(Op op);
std::optional<Op> parse_op(std::string_view text);
// Number of inputs, or -1 when variadic.
int op_arity(Op op);
bool is_elementwise_unary(Op op);
bool is_elementwise_binary(Op op);
// Ops whose output element i depends only on element i of each operand (safe to compute in place).
inline bool is_elementwise(Op op) {
  return is_elementwise_unary(op) || is_elementwise_binary(op) || op == Op::select || op == Op::compare ||
         op == Op::convert_element_type;
}
// Ops that own a body graph.
inline bool has_body(Op op) { return op == Op::scan || op == Op::remat; }

}  // namespace remat::ir
