// Output types of an op from its operand types, attributes and (for scan) body graph.
#pragma once

#include "ir/graph.h"

#include <string_view>
#include <vector>

namespace remat::ir {

// `where` names the op's location for error messages (see describe_node).
std::vector<Type> infer_types(Op op, const std::vector<Type>& inputs, const Attrs& attrs, const Graph* body,
                              std::string_view where);

}  // namespace remat::ir
