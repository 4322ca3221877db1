// Instantiation: copying a range of one graph's nodes (a template traced and differentiated once) into the
// graph a Builder traces, as if traced there again. A pipeline rank runs each chunk's forward and backward
// for every microbatch; tracing and differentiating the chunk once and instantiating it per action keeps a
// long schedule's compile time linear in its actions.
#pragma once

#include "ir/builder.h"

#include <unordered_map>

namespace remat::ir {

// One instance of a template: where its values and op identities (Node::origin) went.
struct Instance {
  std::unordered_map<ValueId, Tensor> values;     // template value -> the instance's; the caller maps the params
  std::unordered_map<uint64_t, uint64_t> origins;  // template origin -> the instance's
  bool keep_origins = false;  // the instance traced in the template's place: its ops keep their origins
};

// Copies nodes [first, last) of `from` (and, deeply, their bodies) into b's graph: inputs through
// `instance.values`, to which the copies' outputs are added; scopes under b's current scope; origins through
// `instance.origins`, a new one for each not seen yet (its own unless keep_origins), so that a recompute copy
// shares the origin of the op it recomputes, as in the template. With `only`, the nodes i of the range with
// (*only)[i] == `taken` (a part of a split backward: autodiff::split_backward).
void instantiate(Builder& b, const Graph& from, size_t first, size_t last, Instance& instance,
                 const std::vector<bool>* only = nullptr, bool taken = true);

}  // namespace remat::ir
