// Public header of the executor (DESIGN §1, §11): runs a graph on the CPU.
// Kernels are plain functions per op (exec/kernels/); dot_general goes through oneDNN for f32 and has a
// naive reference twin (kernels/ref/). Scan runs its body `length` times over views of the stacked
// inputs. Buffers are freed after their last use (the memory planner replaces this with an arena).
//
//   std::vector<exec::Array> out = exec::run(graph, {x, w});
#pragma once

#include "exec/array.h"

#include <map>
#include <span>
#include <string>
#include <vector>

namespace remat::exec {

// Time spent per op, accumulated over runs (scan bodies count their own ops; scan itself is not counted).
struct Profile {
  std::map<std::string, double> seconds;
  std::map<std::string, int64_t> calls;
  std::map<uint64_t, int64_t> runs_by_origin;  // kernel calls per traced op (Node::origin), clones included
  std::string table() const;  // ops by time, descending
};

#ifdef __SANITIZE_ADDRESS__
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

struct Options {
  bool reference_kernels = false;  // use the naive reference twins (tests compare the two)
  Profile* profile = nullptr;      // when set, every kernel call is timed into it
  // Checks of the memory plan (exec::Executable only):
  // Fill every arena buffer with 0xFF bytes (NaN in every float dtype) outside its planned live range:
  // before the run, and after each buffer's last planned read. A kernel that reads a buffer before its
  // first write or after its planned end then computes with NaNs, and the results show it.
  bool poison = false;
  // Each planned buffer in its own allocation of its exact size instead of one arena, so that AddressSanitizer
  // catches an overflow past a buffer's end (in one arena it lands silently in a neighbour). On in ASan builds.
  bool separate_buffers = kAddressSanitizer;
};

// Runs g on `args` (one per param, types must match). Errors name the node that failed.
std::vector<Array> run(const ir::Graph& g, std::span<const Array> args, const Options& options = {});

}  // namespace remat::exec
