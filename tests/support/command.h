// Runs a shell command line for an end-to-end test and returns its exit status and output.
//   testing_support::Output o = testing_support::run_command("cd /tmp && remat plan 2>&1");
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace remat::testing_support {

struct Output {
  int status = -1;   // the exit status; -1 when the command could not start or was killed by a signal
  std::string text;  // what it wrote to stdout (append 2>&1 to the command for stderr too)
};

inline Output run_command(const std::string& command) {
  Output out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.text.append(buf, n);
  const int status = pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

}  // namespace remat::testing_support
