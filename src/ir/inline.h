// Inlining of remat regions: every remat node of a graph (and of its scans' bodies) is replaced by its
// body's nodes. A remat region only matters to differentiation; after it, the region is a plain call, and
// the planner and executor see its nodes inline.
#pragma once

#include "ir/graph.h"

namespace remat::ir {

// Whether there was a region to inline.
bool inline_remat_regions(Graph& g);

}  // namespace remat::ir
