// Public header of the IR stage (docs/design.md, "The stages"): graph data structures, the op table, tracing and
// instantiation, text form, verification, dead code elimination and the graph passes (inlining remat regions,
// sinking converts into scans, folding widening converts into the optimizer's reads, finite checks, fusion).
// Everything downstream includes only this.
#pragma once

#include "base/check.h"
#include "ir/builder.h"
#include "ir/cost.h"
#include "ir/dce.h"
#include "ir/finite_checks.h"
#include "ir/fold_widening.h"
#include "ir/fuse.h"
#include "ir/graph.h"
#include "ir/inline.h"
#include "ir/instantiate.h"
#include "ir/ops.h"
#include "ir/shape_rules.h"
#include "ir/signature.h"
#include "ir/sink_converts.h"
#include "ir/text.h"
#include "ir/verify.h"
