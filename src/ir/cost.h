// The cost model of the op table: floating-point operations of a node. dot_general counts
// 2 per multiply-add; elementwise ops and reductions one per element; data movement none. Scan and remat
// count their bodies (scan times its length).
#pragma once

#include "ir/graph.h"

#include <map>

namespace remat::ir {

double flops(const Graph& g, const Node& n);
double flops(const Graph& g);  // every node of g

// What one rank's collectives (and messages: send, recv) of one kind move per run of a graph (scan bodies
// times their length).
struct Communication {
  int64_t count = 0;  // collectives run
  double bytes = 0;   // their operands' bytes, in the dtype they are sent in (all_gather's `dtype`)
  double sent = 0;    // bytes this rank sends, for b operand bytes over N ranks in P parts (P = N unless the
                      // op has `parts`): all_reduce 2 (N-1)/N b, reduce_scatter (N-1)/P b (a block to every
                      // other rank), all_gather (P-1) b (its shard to the other ranks of its last axis); send b,
                      // recv 0 (it receives b)
};
std::map<Op, Communication> communication(const Graph& g);

}  // namespace remat::ir
