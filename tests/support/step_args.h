// The arguments of a compiled training step for tests that run it: the parameters initialised from seed 0, the
// moments and counters zero, a fixed batch of tokens.
#pragma once

#include "compile/compile.h"
#include "exec/exec.h"
#include "nn/nn.h"

#include <vector>

namespace remat::testing_support {

inline std::vector<exec::Array> step_args(const compile::Compiled& s, const nn::ModelConfig& model) {
  std::vector<exec::Array> args;
  for (ir::ValueId p : s.program.params) args.push_back(exec::Array::zeros(s.program.type(p)));
  std::vector<exec::Array> params;
  for (size_t i = 0; i < args.size(); ++i)
    if (s.signature.args[i].role == ir::Role::parameter) params.push_back(args[i]);
  nn::init_params(model, 0, params);
  for (int k = 0; k < 2; ++k) {
    exec::Array& t = args[static_cast<size_t>(s.signature.arg(k == 0 ? "inputs" : "targets"))];
    for (int64_t i = 0; i < t.size(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 31 + k * 7) % 256);
  }
  return args;
}

}  // namespace remat::testing_support
