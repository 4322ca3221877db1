// Fusion (docs/performance.md, "Fusion"; the `fusion` op in ir/ops.h): chains of elementwise ops of one shape,
// with the broadcasts they read, become `fusion` nodes, in this graph and inside every scan body. It runs on the
// differentiated, remat-inlined step before planning, so checkpoint names and policies have already decided what
// is saved; the planner then sees only each fusion's outputs (its values read elsewhere), and no broadcast it
// reads is ever stored whole. The program's results keep their bits: each fused op runs the loop its own kernel
// runs.
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
// operand or makes a constant, not runs of their own.
constexpr bool copied_into_fusions(Op op) { return op == Op::broadcast_in_dim || op == Op::iota || op == Op::full; }

// The rule by which runs are counted (rematerialize::Explanation::runs, exec::Profile::runs_by_origin): one
// call of kernel `n`, a node of `g`, runs each op of a fusion's body once but the ones it copies in (0: counted,
// not run), and any other node once. f(graph, node, runs) for each op in that call, with the graph holding it.
template <class F>
void for_each_op_run(const Graph& g, const Node& n, F&& f) {
  if (n.op != Op::fusion) return f(g, n, int64_t{1});
  for (const Node& m : n.body->nodes) f(*n.body, m, int64_t{copied_into_fusions(m.op) ? 0 : 1});
}

}  // namespace remat::ir
