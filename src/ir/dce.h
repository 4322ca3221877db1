// Dead code elimination: removes nodes none of whose outputs reach a result. For scan and remat nodes it
// also drops outputs nobody reads (a scan keeps its carries) and inputs the cleaned body no longer reads;
// a convert_group loses the operands whose outputs nobody reads.
#pragma once

#include "ir/graph.h"

namespace remat::ir {

// Whether it removed anything.
bool dce(Graph& g);

}  // namespace remat::ir
