// `remat` as a child process for end-to-end tests that kill it: started with fork/exec (its pid, to signal),
// watched without reaping, and its run's metrics and resume point read back.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/array.h"
#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

namespace remat::testing_support {

// Starts `remat ARGS...` in `dir`, its output into `log` (else discarded); returns its pid.
inline pid_t start_remat(const std::filesystem::path& dir, std::vector<std::string> args,
                         const std::filesystem::path& log = "/dev/null") {
  const pid_t pid = fork();
  if (pid == 0) {
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(out, 2);
    std::vector<char*> argv{const_cast<char*>(REMAT_BINARY)};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(REMAT_BINARY, argv.data());
    _exit(127);
  }
  return pid;
}

// Whether the process is still running; one that ended stays unreaped (WNOWAIT) for finish to read its status.
inline bool running(pid_t pid) {
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
}

// Its exit status; -1 when a signal ended it.
inline int finish(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The step a run's output says it resumed from ("resumed from <file> (step N)"); 0 when it started afresh.
inline int64_t resumed_step(const std::filesystem::path& log) {
  std::ifstream in(log);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  // Found by hand, not by std::regex (whose matcher recurses per character: a stack overflow under ASan).
  const size_t line = text.find("\nresumed from ");
  if (line == std::string::npos) return 0;
  const size_t step = text.find(" (step ", line);
  return step == std::string::npos ? 0 : std::stoll(text.substr(step + 7));
}

// (step, loss, grad_norm) of every row of a run's metrics.jsonl, exactly as written.
inline std::vector<std::tuple<int64_t, double, double>> metrics(const std::filesystem::path& run) {
  std::vector<std::tuple<int64_t, double, double>> rows;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    rows.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>(), j.at("grad_norm").get<double>());
  }
  return rows;
}

// Whether the checkpoint file `file` holds the same bytes in every tensor as `want` (`name`: the run, for messages).
inline void expect_same_tensors(const train::SafeTensors& want, const std::filesystem::path& file, const std::string& name) {
  const train::SafeTensors got = train::read_safetensors(file);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [tensor, a] : want.tensors) {
    const exec::Array& b = got.tensors.at(tensor);
    ASSERT_EQ(a.type(), b.type());
    EXPECT_EQ(std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())), 0) << name << ": " << tensor;
  }
}

}  // namespace remat::testing_support
