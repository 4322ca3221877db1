// Runs a shell command line for an end-to-end test and returns its exit status and output. Every command runs
// under a time limit: a hang (an MPI deadlock, a rank waiting forever) fails the test that started it, naming it,
// instead of stopping the suite.
//   testing_support::Output o = testing_support::run_command("cd /tmp && remat plan 2>&1");
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace remat::testing_support {

// Ten times the slowest command of the sanitizer build: generous, and still a failure within the CI's time.
inline constexpr int kCommandTimeoutSeconds = 600;

struct Output {
  int status = -1;         // the exit status; -1 when the command could not start or was killed by a signal
  std::string text;        // what it wrote to stdout (append 2>&1 to the command for stderr too)
  bool timed_out = false;  // killed at the time limit (then the test has already failed)
};

// `command` as one single-quoted shell word.
inline std::string shell_quoted(const std::string& command) {
  std::string q = "'";
  for (char c : command) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// coreutils' timeout runs the command in a process group of its own and signals the whole group (mpirun and its
// ranks): SIGTERM at the limit, SIGKILL 10 s later; it then exits 124, or 137 after the SIGKILL.
inline Output run_command(const std::string& command, int timeout_seconds = kCommandTimeoutSeconds) {
  Output out;
  const std::string limited = "timeout --kill-after=10 " + std::to_string(timeout_seconds) + " sh -c " + shell_quoted(command);
  FILE* pipe = popen(limited.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.text.append(buf, n);
  const int status = pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  out.timed_out = out.status == 124 || out.status == 137;
  if (out.timed_out) {
    const testing::TestInfo* test = testing::UnitTest::GetInstance()->current_test_info();
    ADD_FAILURE() << (test ? std::string(test->test_suite_name()) + "." + test->name() : std::string("a test"))
                  << ": the command ran past its limit of " << timeout_seconds << " s and was killed: " << command
                  << "\nits output:\n" << out.text;
  }
  return out;
}

}  // namespace remat::testing_support
