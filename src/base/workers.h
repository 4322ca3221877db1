// Independent jobs on the machine's cores: `remat plan` plans a pipeline's ranks at once.
#pragma once

#include <cstdint>
#include <functional>

namespace remat {

// Calls job(i) for each i in [0, n), on up to one thread per core (the caller's among them; at most
// `max_threads` when positive, 1: in order on the caller's), each with the caller's OpenMP thread count
// (kernels size their workspaces by it). Returns when all are done; rethrows the exception of the lowest i
// that threw, if any.
void for_each_parallel(int64_t n, const std::function<void(int64_t)>& job, int64_t max_threads = 0);

}  // namespace remat
