#include "ir/ops.h"

namespace remat::ir {

std::string_view op_name(Op op) {
  switch (op) {
#define X(e, ...) \
  case Op::e:       \
    return #e;
    REMAT_OPS(X)
#undef X
  }
  return "?";
}

std::optional<Op> parse_op(std::string_view text) {
#define X(e, ...) \
  if (text == #e) return Op::e;
  REMAT_OPS(X)
#undef X
  return std::nullopt;
}

}  // namespace remat::ir
