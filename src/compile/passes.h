// The IR passes of compile(), as one ordered table (XLA's pass pipeline): each is `bool run(Graph&)`, true
// when it changed the graph. run_passes runs a list of them, checks the graph with ir::verify after each one
// that changed it (by default in debug and sanitizer builds; a failure names the pass), and prints the graph
// after a named pass (`remat plan|train|explain --dump-ir=PASS`).
//
// Clean-ups run before these, at the end of each train:: program builder: sink_converts_into_scans and dce, and
// first, in the builders of a step with an optimizer, fold_widening_converts. They stay there because a
// builder's program is read directly (the explanation of the decider's records, the planner's and the goldens'
// tests), and it must already be the finished, dead-code-free program; run_passes verifies the program it is
// handed before the first pass, so their output is checked too.
#pragma once

#include "ir/graph.h"

#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace remat::compile {

struct Pass {
  const char* name;
  bool (*run)(ir::Graph&);  // whether it changed the graph
};

// compile()'s passes, in the order it runs them: remat regions inlined (they only matter to
// differentiation), finite checks (Request::check_finite; after inlining, so regions' nodes are checked
// too), fusion (Request::fuse; last, so it fuses what the checks leave apart).
std::span<const Pass> passes();
// Fails, listing passes(), unless `name` is empty or one of them (`--dump-ir`).
void check_pass_name(const std::string& name);

#if !defined(NDEBUG) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kVerifyPasses = true;
#else
inline constexpr bool kVerifyPasses = false;
#endif

struct PassOptions {
  bool verify = kVerifyPasses;  // ir::verify the graph handed in, and after each pass that changed it
  std::string dump_after = {};  // a pass's name: the graph after it goes to `dump` (ir::print's text)
  std::function<void(std::string_view)> dump = {};  // empty: stdout
};

// Runs `list` on `g` in order. A verification failure is an internal error naming the pass ("ir::verify
// failed after pass 'fuse': ..."). A `dump_after` that names no pass of `list` prints nothing.
void run_passes(ir::Graph& g, std::span<const Pass> list, const PassOptions& options = {});

}  // namespace remat::compile
