// The time limit on end-to-end commands: a command that hangs — here every rank of an mpirun, as in a deadlock —
// is killed with everything it started, and the test that ran it fails naming itself.
#include "support/command.h"
#include "support/mpirun.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <chrono>

namespace remat {
namespace {

using testing_support::Output;
using testing_support::run_command;

TEST(CommandTimeout, AHungMpirunIsKilledWithItsRanksAndFailsTheTestByName) {
  ASSERT_TRUE(testing_support::mpirun_installed()) << "mpirun is not installed (scripts/setup.sh installs it)";
  // A sleep no other process runs, so that pgrep finds only the ranks' own.
  const std::string marker = "sleep 4321.5";
  const auto start = std::chrono::steady_clock::now();
  Output out;
  EXPECT_NONFATAL_FAILURE(out = run_command(testing_support::mpirun(2) + " " + marker, 2),
                          "CommandTimeout.AHungMpirunIsKilledWithItsRanksAndFailsTheTestByName: the command ran past "
                          "its limit of 2 s");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(out.timed_out);
  EXPECT_LT(seconds, 15) << "killed at the limit (SIGKILL 10 s after SIGTERM at the latest)";
  EXPECT_NE(run_command("pgrep -f '[s]" + marker.substr(1) + "'").status, 0) << "no rank left running";
}

TEST(CommandTimeout, ACommandWithinItsLimitKeepsItsStatusAndOutput) {
  const Output out = run_command("echo 'it''s' \"quoted\"; exit 3", 30);
  EXPECT_FALSE(out.timed_out);
  EXPECT_EQ(out.status, 3);
  EXPECT_EQ(out.text, "its quoted\n");
}

}  // namespace
}  // namespace remat
