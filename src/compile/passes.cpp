#include "compile/passes.h"

#include "base/check.h"
#include "ir/finite_checks.h"
#include "ir/fuse.h"
#include "ir/inline.h"
#include "ir/text.h"
#include "ir/verify.h"

#include <fmt/format.h>

namespace remat::compile {
namespace {

constexpr Pass kPasses[] = {
    {"inline_remat_regions", ir::inline_remat_regions},
    {"insert_finite_checks", ir::insert_finite_checks},
    {"fuse", ir::fuse},
};

void verify_after(const ir::Graph& g, std::string_view what) {
  try {
    ir::verify(g);
  } catch (const Error& e) {
    throw InternalError(fmt::format("internal error (a bug in remat): ir::verify failed after {}: {}", what, e.what()));
  }
}

}  // namespace

std::span<const Pass> passes() { return kPasses; }

void check_pass_name(const std::string& name) {
  std::string names;
  bool found = name.empty();
  for (const Pass& p : kPasses) {
    names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
    found = found || name == p.name;
  }
  CHECK(found, "--dump-ir={}: no such pass; the passes are {}", name, names);
}

void run_passes(ir::Graph& g, std::span<const Pass> list, const PassOptions& o) {
  if (o.verify) verify_after(g, "the program builder (before the first pass)");
  for (const Pass& p : list) {
    const bool changed = p.run(g);
    if (o.verify && changed) verify_after(g, fmt::format("pass '{}'", p.name));
    if (o.dump_after != p.name) continue;
    const std::string text = fmt::format("// @{} after pass '{}'{}\n{}", g.name, p.name, changed ? "" : " (unchanged)", ir::print(g));
    if (o.dump) o.dump(text);
    else fmt::print("{}", text);
  }
}

}  // namespace remat::compile
