// The IR text parser on arbitrary bytes. Property: a graph that parses prints to text that parses back to
// the same printed text (print is a fixed point of parse ∘ print).
#include "fuzz.h"
#include "ir/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  remat::fuzz::refused_or_accepted([&] {
    const std::string printed = remat::ir::print(remat::ir::parse(remat::fuzz::text(data, size), "fuzz.ir"));
    const std::string again = remat::ir::print(remat::ir::parse(printed, "printed.ir"));
    if (again != printed) remat::fuzz::broken("print(parse(print(g))) == print(g)", printed, again);
  });
  return 0;
}
