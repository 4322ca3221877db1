// Mixed precision (DESIGN §6): a policy of three dtypes parsed from jmp's grammar, and ComputeContext, the
// scoped, thread-local bundle of the policy with the device mesh and the logical-to-mesh axis mapping.
//   "params=float32,compute=bfloat16,output=float32"   keys params|p, compute|c, output|o
//   "bf16"                                              a bare dtype sets all three
// Unspecified params are f32, compute follows params, output follows compute ("c=bf16" is p=f32, c=bf16,
// o=bf16). Names: float32|f32|full|single, bfloat16|bf16, float16|f16, half (= bf16 here: these CPUs
// compute bf16 natively; jmp picks bf16 on TPU, f16 elsewhere), float64|f64|double.
//
//   nn::ComputeContext scope(nn::ComputeSettings{nn::parse_precision("p=f32,c=bf16"), {}, {}});
//   DType c = nn::ComputeContext::current().precision.compute;   // bf16 inside the scope
#pragma once

#include "base/dtype.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace remat::nn {

struct PrecisionPolicy {
  DType param = DType::f32;    // master weights and optimizer state
  DType compute = DType::f32;  // activations, matmuls
  DType output = DType::f32;   // what a module returns (the loss is always f32)
  std::string str() const;     // "p=f32,c=bf16,o=f32"
  bool operator==(const PrecisionPolicy&) const = default;
};

// Parses jmp's grammar; errors name `key` and show the grammar.
PrecisionPolicy parse_precision(const std::string& text, const std::string& key = "mp_policy");

// Named mesh axes (data, fsdp, stage) with their sizes; used by the distributed stage.
struct Mesh {
  std::vector<std::pair<std::string, int64_t>> axes;
};

// Logical axis name (batch, embed, mlp, heads, ...) -> mesh axis name.
using AxisMapping = std::map<std::string, std::string>;

struct ComputeSettings {
  PrecisionPolicy precision;
  Mesh mesh;
  AxisMapping axes;
};

// RAII: makes `settings` current for this thread until destroyed (scopes nest).
class ComputeContext {
 public:
  explicit ComputeContext(ComputeSettings settings);
  ~ComputeContext();
  ComputeContext(const ComputeContext&) = delete;
  ComputeContext& operator=(const ComputeContext&) = delete;

  // The innermost settings of this thread, or the defaults (all f32, no mesh) outside any scope.
  static const ComputeSettings& current();
};

}  // namespace remat::nn
