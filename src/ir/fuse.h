// Fusion (DESIGN §1, the `fusion` op in ir/ops.h): chains of elementwise ops of one shape, with the broadcasts
// they read, become `fusion` nodes, in this graph and inside every scan body. It runs on the differentiated,
// remat-inlined step before planning, so checkpoint names and policies have already decided what is saved;
// the planner then sees only each fusion's outputs (its values read elsewhere), and no broadcast it reads is
// ever stored whole. The program's results keep their bits: each fused op runs the loop its own kernel runs.
//
// Nodes are taken in order. An elementwise node (not adamw, not an integer division) joins the fusions of
// its operands, merging them, when they (a) have its shape, (b) are recomputes exactly when it is one (the
// scheduler places recomputes late), (c) have not yet been read by any node outside them, and (d) stay within
// kMaxFusionValues; (e) no effectful op (a message, a collective, a check) stands between them and it, so a
// pipeline's fusions stay within one action. By (c) a fusion can run where its last node stood, every other
// node keeping its place.
// A broadcast, iota or full read by a fused node is copied into the fusion (a broadcast reading its operand):
// there it is how the fusion reads that operand or makes that constant, tile by tile, never stored whole; the
// original stays for readers outside fusions, else dead code elimination removes it. A lone node becomes a
// fusion only when it reads such a copy.
#pragma once

#include "ir/graph.h"

namespace remat::ir {

// Whether it changed the graph.
bool fuse(Graph& g);

// The ops a fusion copies in (broadcast_in_dim, iota, full): in a fusion's body they are how it reads an
// operand or makes a constant, not runs of their own (Explanation::runs and exec::Profile count them so).
constexpr bool copied_into_fusions(Op op) { return op == Op::broadcast_in_dim || op == Op::iota || op == Op::full; }

}  // namespace remat::ir
