// Public header of the executor (docs/design.md, "The stages"). One executor, exec::Executable (executable.h),
// runs a planned graph over its arenas through a backend (backend.h: memory, copies, the kernel table, workspace
// sizes; the CPU's kernels are plain functions per op in exec/kernels/, dot_general through oneDNN with a
// naive reference twin in kernels/ref/). exec::run is the one-call form for tests and small programs: it
// plans the graph (remat regions inlined) and runs it once.
//
//   std::vector<exec::Array> out = exec::run(graph, {x, w});
#pragma once

#include "exec/array.h"
#include "exec/backend.h"

#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace remat::exec {

// What the kernel calls of the runs it watches did (scan bodies count their own ops; scan itself is not counted).
struct Profile {
  // Runs per traced op (Node::origin), clones included, accumulated over runs, as ir::for_each_op_run counts them.
  std::map<uint64_t, int64_t> runs_by_origin;

  // With `record`: every kernel call in order (a timeline), times in seconds of the steady clock.
  struct Call {
    const ir::Node* node;  // the program's node (valid while its executable lives)
    double start, end;
    double bytes = 0;  // its operands' and results' bytes (what it reads and writes, each once)
    double flops = 0;  // ir::flops of the node
    std::vector<ir::Type> operands;  // of contractions only (matmuls and attention: what matmul_floor times)
  };
  bool record = false;
  std::vector<Call> timeline;
  // From the timeline: time, share, calls, bytes moved (GB/s) and GFLOP/s by op kind, then by scope (the `top`
  // slowest), then the share of time in matmuls and attention — what a step is made of.
  std::string breakdown(int top = 15) const;
};

#ifdef __SANITIZE_ADDRESS__
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

class Mesh;  // exec/mesh.h

struct Options {
  const Backend* backend = &cpu();  // memory, copies and kernels
  bool reference_kernels = false;  // use the naive reference twins (tests compare the two)
  Profile* profile = nullptr;      // when set, every kernel call is timed into it
  const Mesh* mesh = nullptr;      // the ranks collectives run over (null: one process)
  // Checks of the memory plan (exec::Executable only):
  // Fill every arena buffer with 0xFF bytes (NaN in every float dtype) outside its planned live range:
  // before the run, and after each buffer's last planned read. A kernel that reads a buffer before its
  // first write or after its planned end then computes with NaNs, and the results show it.
  bool poison = false;
  // Each planned buffer in its own allocation of its exact size instead of one arena, so that AddressSanitizer
  // catches an overflow past a buffer's end (in one arena it lands silently in a neighbour). On in ASan builds.
  bool separate_buffers = kAddressSanitizer;
};

// Plans g (a copy, remat regions inlined, with the backend's workspace) and runs it once on `args` (one per
// param, types must match). Errors name the node that failed. The results keep the run's arena alive.
std::vector<Array> run(const ir::Graph& g, std::span<const Array> args, const Options& options = {});

// The matmul floor of a recorded profile: the time its matmuls and attention would take at the rate oneDNN
// reaches on their shapes run alone, in this process (its thread count), now. Each dot_general shape is timed
// alone (the best of a few runs in its own planned arena); an attention call (forward or backward) counts its
// FLOPs at the rate of the batched score and context matmuls of its heads (q·kᵀ and p·v, over at most 1024
// positions: the rate, not the memory, of the products it tiles). What a step at its matmuls' speed would take.
struct MatmulFloor {
  double seconds = 0, flops = 0;
  int64_t shapes = 0;  // distinct shapes timed
};
MatmulFloor matmul_floor(const Profile& profile);

// The planner's workspace question, answered by `backend` (plan::Options::workspace).
std::function<int64_t(const ir::Node&, std::span<const ir::Type>)> workspace_of(const Backend& backend);

}  // namespace remat::exec
