// Sinks converts of a scan's stacked outputs into its body: when a stacked output's only use is a
// convert_element_type, the body converts its y instead (as its last node) and the scan stacks the
// converted values. The stack then never exists in both dtypes at once: a backward scan's bf16 weight
// gradients, widened to f32 after the loop (mp_cast=upfront), would hold L layers in bf16 and in f32
// together; sunk, each layer's gradient is widened in the body, as with per-layer casts.
// Runs on this graph, then inside every body (scan and remat), so a sunk convert can sink again into a
// nested scan. Results and semantics are unchanged (convert is elementwise). A stack read by anything else,
// a final carry, and an offloaded (host) stack are left alone.
#pragma once

#include "ir/graph.h"

namespace remat::ir {

void sink_converts_into_scans(Graph& g);

}  // namespace remat::ir
