// The cost model of the op table: floating-point operations of a node (DESIGN §2). dot_general counts
// 2 per multiply-add; elementwise ops and reductions one per element; data movement none. Scan and remat
// count their bodies (scan times its length).
#pragma once

#include "ir/graph.h"

namespace remat::ir {

double flops(const Graph& g, const Node& n);
double flops(const Graph& g);  // every node of g

}  // namespace remat::ir
