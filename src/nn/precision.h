// Mixed precision (docs/performance.md, "Mixed precision"): a policy of three dtypes parsed from jmp's grammar; and
// the device mesh and the logical-to-mesh axis mapping. All three reach the model through its ModelConfig only.
//   "params=float32,compute=bfloat16,output=float32"   keys params|p, compute|c, output|o
//   "bf16"                                              a bare dtype sets all three
// Unspecified params are f32, compute follows params, output follows compute ("c=bf16" is p=f32, c=bf16,
// o=bf16). Names: float32|f32|full|single, bfloat16|bf16, float16|f16, half (= bf16 here: these CPUs
// compute bf16 natively; jmp picks bf16 on TPU, f16 elsewhere), float64|f64|double.
#pragma once

#include "base/dtype.h"

#include <map>
#include <string>
#include <string_view>
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

// Named mesh axes (data, fsdp, tensor) with their sizes, in order (the last varies fastest over the ranks):
// the devices one step runs on, as the model sees them (exec::Mesh holds the processes). The ranks of
// `tensor` share their sequences (they split the weights); every other axis splits the batch.
struct Mesh {
  std::vector<std::pair<std::string, int64_t>> axes;
  int64_t size(std::string_view axis) const;  // 1 for an axis the mesh does not have
  int64_t ranks() const;                      // the product of the sizes
  int64_t batch_ranks() const;                // the product of the sizes of the axes that split the batch
  // Those axes of more than one rank joined by commas ("data,fsdp"; "" for none): the group a collective
  // over the batch's ranks names (exec::Mesh), one per tensor coordinate.
  std::string batch_group() const;
  bool operator==(const Mesh&) const = default;
};

// Logical axis name (embed, mlp, heads, ...) -> the mesh axis it is sharded over (MaxText's
// logical_axis_rules, one mesh axis per logical one).
using AxisMapping = std::map<std::string, std::string>;

}  // namespace remat::nn
