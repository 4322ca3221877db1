// The free-at-last-use reference executor: the planner's independent twin in tests. Every value gets its
// own fresh allocation (freed after its last reader), every kernel call its own fresh workspace, scans
// and remat regions run their bodies by recursion; no plan, no arena. Planned runs are compared with it
// bit for bit. The kernels are the backend's (they have their own reference twins).
#pragma once

#include "exec/exec.h"

namespace remat::testing_support {

std::vector<exec::Array> reference_run(const ir::Graph& g, std::span<const exec::Array> args,
                                       const exec::Options& options = {});

}  // namespace remat::testing_support
