// Dead code elimination: removes nodes none of whose outputs reach a result. Inside a scan it also drops
// stacked outputs (ys) nobody reads, and consts/xs the body no longer reads, then cleans the body.
#pragma once

#include "ir/graph.h"

namespace remat::ir {

void dce(Graph& g);

}  // namespace remat::ir
