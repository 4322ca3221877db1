// A program's typed interface: a name and a role for every argument and result. Callers find a value by
// name, never by position; donation pairs, the plan report's categories and checkpoint files come from it.
// Invariants: args and results are parallel to Graph::params and Graph::results; an updating result has the
// role of the argument it replaces.
//
//   ir::Signature s = step.signature;
//   const exec::Array& loss = out[s.result("loss")];
//   for (auto [result, arg] : s.updates()) ...   // params', m', v', loss-scale state'
#pragma once

#include "ir/graph.h"

#include <string_view>

namespace remat::ir {

enum class Role : uint8_t {
  parameter,        // a model weight (trained)
  optimizer_state,  // an optimizer moment, one per parameter
  step,             // the update counter
  loss_scale,       // dynamic loss-scaling state
  batch,            // input tokens and targets
  metric,           // a scalar for the user: loss, gradient norm, learning rate, ...
  output,           // anything else a program returns (gradients, logits)
};
std::string_view role_name(Role r);

struct Slot {
  std::string name;
  Role role = Role::output;
  int updates = -1;  // (results) the argument whose new value this is, or -1
};

struct Signature {
  std::vector<Slot> args, results;
  // The loss as the forward makes it on this rank (before any sum over ranks, mean or loss scaling), where the
  // program has one (-1: none): where a plan report splits the step into forward and backward.
  ValueId loss = -1;

  // Index by name; a name that is not there is an internal error (names are fixed by the program's builder).
  int arg(std::string_view name) const;
  int result(std::string_view name) const;
  // (result, argument) for every result that is the new value of an argument.
  std::vector<std::pair<int, int>> updates() const;
  // "arg 0 token_embedding parameter\n...result 3 token_embedding parameter (updates arg 0)\n"
  std::string text() const;
};

}  // namespace remat::ir
