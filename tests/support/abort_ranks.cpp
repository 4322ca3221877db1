// Under mpirun (the multi-rank tests launch remat_tests itself on each rank), a failure on one rank ends the whole
// launch at once (MPI_Abort), after the failure is printed: the other ranks would otherwise wait for that rank's
// messages until the launching test's time limit ran out (600 s), and the failure would read as a hang.
#include "exec/mesh.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace remat::testing_support {
namespace {

class AbortRanksOnFailure : public testing::EmptyTestEventListener {
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed() || exec::Mesh::launched_ranks() == 1) return;
    std::fflush(stdout);  // the default printer, called before this listener, has written the failure
    exec::Mesh::abort_launch(1);
  }
};

// Appended after gtest's default printer (gtest_main adds nothing before the tests run).
const bool registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new AbortRanksOnFailure);
  return true;
}();

}  // namespace
}  // namespace remat::testing_support
