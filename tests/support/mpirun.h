// How the MPI tests launch ranks: `mpirun -np N` as a small machine needs it (more ranks than cores, OpenMP
// threads not pinned to one core, root allowed when root, one OpenMP thread per rank: with more ranks than
// cores, a rank's spinning OpenMP threads take the cores the other ranks wait for, 10-20x slower) and, in
// the sanitizer build, without leak reports (Open MPI's own allocations outlive MPI_Finalize: not the
// engine's leaks). run_command's time limit covers every launch: a deadlock fails the test instead of hanging.
//   run_command(fmt::format("{} '{}' train ...", testing_support::mpirun(2), REMAT_BINARY));
#pragma once

#include "exec/exec.h"
#include "support/command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <string>

namespace remat::testing_support {

inline std::string mpirun(int ranks) {
  return fmt::format("{}mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1{} -np {}",
                     exec::kAddressSanitizer ? "env ASAN_OPTIONS=detect_leaks=0 " : "",
                     geteuid() == 0 ? " --allow-run-as-root" : "", ranks);
}

// The one-process reference the ranks are compared with: a fixed number of OpenMP threads (not the machine's
// core count) unlike the ranks' one, so that every bit-identity comparison also shows that the thread count
// changes no bits (tests/exec/thread_count_test.cpp checks it in one process).
inline std::string one_process() { return "env OMP_NUM_THREADS=3"; }

// `remat ARGS` run in `dir` under `launcher` (mpirun(N) or one_process()), its output and errors together.
inline Output launch_remat(const std::string& dir, const std::string& launcher, const std::string& args) {
  return run_command(fmt::format("cd '{}' && {} '{}' {} 2>&1", dir, launcher, REMAT_BINARY, args));
}

// scripts/setup.sh installs it; the MPI tests fail without it.
inline bool mpirun_installed() { return run_command("command -v mpirun").status == 0; }

}  // namespace remat::testing_support
