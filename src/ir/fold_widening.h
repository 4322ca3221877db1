// Folds exact widening converts into the readers that widen on load: a convert_element_type from bf16 or f16 to
// f32 (any exact widening: base/dtype.h's widens_exactly) whose every reader is sum_of_squares' x or adamw's
// gradient is dropped, and those readers read its narrow operand (sum_of_squares then with `dtype`, the wide
// type). Where the wide value is a scan's stacked output whose body widens its y as its result, the body gives
// the narrow y and the stack is narrow. The step's bf16 weight gradients are then never stored in f32: the
// values read are the same (a widening is exact), so every result keeps its bits, and the gradients' memory
// halves. Runs on this graph (the optimizer reads the gradients at its top level); a value read by anything
// else (a collective, an accumulation, a result) is left alone. When it changed something it ends with dce.
#pragma once

#include "ir/graph.h"

namespace remat::ir {

// Whether it changed the graph.
bool fold_widening_converts(Graph& g);

}  // namespace remat::ir
