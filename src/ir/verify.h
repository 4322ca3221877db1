// Structural and type checks of a graph. Each failure is a CHECK that names the node (index, op, scope,
// graph) and the offending values or shapes.
#pragma once

#include "ir/graph.h"

namespace remat::ir {

void verify(const Graph& g);

}  // namespace remat::ir
