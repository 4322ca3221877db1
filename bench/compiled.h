// The benches' executable: a graph planned and compiled once, so that a timed run is its kernels alone.
// exec::run plans, allocates and faults in a fresh arena at every call: ~5 faults of 2 MiB pages (each zeroed by
// the OS) per ~6 ms flash forward at the medium config's 4 x 512, all of it inside the timed loop.
#pragma once

#include "exec/executable.h"

namespace remat {

inline exec::Executable compiled(const ir::Graph& g) {
  return exec::Executable(g.clone(), plan::build(g, {.workspace = exec::workspace_of(exec::cpu())}));
}

}  // namespace remat
