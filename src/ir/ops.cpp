#include "ir/ops.h"

namespace remat::ir {

std::string_view op_name(Op op) {
  switch (op) {
#define X(e, arity) \
  case Op::e:       \
    return #e;
    REMAT_OPS(X)
#undef X
  }
  return "?";
}

std::optional<Op> parse_op(std::string_view text) {
#define X(e, arity) \
  if (text == #e) return Op::e;
  REMAT_OPS(X)
#undef X
  return std::nullopt;
}

int op_arity(Op op) {
  switch (op) {
#define X(e, arity) \
  case Op::e:       \
    return arity;
    REMAT_OPS(X)
#undef X
  }
  return 0;
}

bool is_elementwise_unary(Op op) {
  switch (op) {
    case Op::neg: case Op::exp: case Op::log: case Op::tanh: case Op::logistic: case Op::sqrt: case Op::rsqrt: case Op::sin: case Op::cos:
      return true;
    default:
      return false;
  }
}

bool is_elementwise_binary(Op op) {
  switch (op) {
    case Op::add: case Op::sub: case Op::mul: case Op::div: case Op::max: case Op::min: case Op::pow:
      return true;
    default:
      return false;
  }
}

}  // namespace remat::ir
