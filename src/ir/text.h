// Text form of the IR (an example in docs/design.md, "The IR text"). Deterministic; parse(print(g)) prints identically.
#pragma once

#include "ir/graph.h"

#include <string>
#include <string_view>

namespace remat::ir {

std::string print(const Graph& g);
// An attribute value as the text form writes it (a string quoted).
std::string print_attr(const AttrValue& v);
// Parses and verifies one graph. Errors are CHECKs naming `file` and the line.
Graph parse(std::string_view text, std::string_view file = "<ir>");

}  // namespace remat::ir
