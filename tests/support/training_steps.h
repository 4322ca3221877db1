// Runs a config's training step program in this process, from a fixed initial state and batch, and keeps
// what it returned: how tests compare the bits of whole steps across settings that must not change them
// (fusion, thread count, instruction set).
//   StepRun r = testing_support::train_steps({"remat_policy=full", "dtype=bfloat16"}, 2);
#pragma once

#include "cli/config.h"
#include "compile/compile.h"
#include "exec/executable.h"
#include "support/step_args.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace remat::testing_support {

inline bool same_bits(const exec::Array& a, const exec::Array& b) {
  return a.type() == b.type() && std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())) == 0;
}

inline int count_ops(const ir::Graph& g, ir::Op op) {
  int k = 0;
  for (const ir::Node& n : g.nodes) k += (n.op == op) + (n.body ? count_ops(*n.body, op) : 0);
  return k;
}

struct StepRun {
  std::vector<exec::Array> results;  // the last step's results (loss, gradient norm, parameters, moments, ...)
  int64_t peak = 0;                  // the planned device arena
  int fusions = 0;
};

// `steps` training steps of the config's program (built-in base + overrides) from step_args' state and batch;
// each step's measured peak must equal its plan's.
inline StepRun train_steps(const std::vector<std::string>& overrides, int steps) {
  cli::Config c = cli::load_config("", overrides);
  compile::Compiled s = compile::compile(
      {.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer, .fuse = c.run.fusion});
  std::vector<exec::Array> args = step_args(s, c.run.model);
  StepRun run{.results = {}, .peak = s.plan.arena[0], .fusions = count_ops(s.program, ir::Op::fusion)};
  exec::Executable step(s.program, s.plan, {.poison = true});
  for (int k = 0; k < steps; ++k) {
    const std::vector<exec::Array>& out = step.run(args);
    EXPECT_EQ(step.measured_peak(plan::Space::device), s.plan.lower_bound[0]) << "planned = measured";
    args[static_cast<size_t>(s.signature.arg("step"))] = exec::Array::from<int32_t>({}, {k + 1});
    run.results.clear();
    for (const exec::Array& a : out) run.results.push_back(a.clone());
  }
  return run;
}

}  // namespace remat::testing_support
