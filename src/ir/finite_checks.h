// The debugging form of a program (JAX's jax_debug_nans, as a pass): after every op that computes a
// floating-point value (in scan bodies too), a check_finite of it, and every later use reads the checked
// value, so the check runs before anything consumes the value: the first check that fails names the first
// op whose output went non-finite. Each check's `of` attribute says which op it checks: op, scope and the
// checkpoint name the value carries, if any. Run after remat regions are inlined.
#pragma once

#include "ir/graph.h"

namespace remat::ir {

// Whether it inserted a check.
bool insert_finite_checks(Graph& g);

}  // namespace remat::ir
