// The cost model of the op table: floating-point operations of a node. dot_general counts
// 2 per multiply-add; elementwise ops and reductions one per element; data movement none. Scan and remat
// count their bodies (scan times its length).
#pragma once

#include "ir/graph.h"

#include <map>
#include <string>

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
  Communication& operator+=(const Communication& o) {
    count += o.count, bytes += o.bytes, sent += o.sent;
    return *this;
  }
};

// One kind of collective over one group of mesh axes (its `axis` attribute: "tensor", "fsdp", "data,fsdp",
// "stage").
struct CommunicationKind {
  std::string axis;
  Op op;
  auto operator<=>(const CommunicationKind&) const = default;
};

// All of a kind, and the part of it that recomputation runs again (nodes marked recomputed, or inside a
// recomputed region or scan).
struct CommunicationTotals {
  Communication all, recomputed;
};
using CommunicationTable = std::map<CommunicationKind, CommunicationTotals>;

CommunicationTable communication(const Graph& g);
// The table's rows of one op, every axis together.
CommunicationTotals communication_of(const CommunicationTable& t, Op op);

}  // namespace remat::ir
