#include "remat/remat.h"

#include "base/check.h"

#include <regex>
#include <set>

namespace remat::rematerialize {
namespace {

struct Found {
  std::set<std::string> names;   // checkpoint names inside remat regions
  bool regions = false;
  int dots = 0, batched_dots = 0;
};

void collect(const ir::Graph& g, bool in_region, Found& f) {
  for (const ir::Node& n : g.nodes) {
    f.regions = f.regions || n.op == ir::Op::remat;
    if (in_region && n.op == ir::Op::name) f.names.insert(n.attrs.str("name"));
    if (in_region && n.op == ir::Op::dot_general) {
      ++f.dots;
      if (!n.attrs.int_lists("batch")[0].empty()) ++f.batched_dots;
    }
    if (n.body) collect(*n.body, in_region || n.op == ir::Op::remat, f);
  }
}

void check_policy(const Policy& p, const Found& f, const LintOptions& o, std::vector<std::string>& warnings) {
  std::string existing = fmt::format("{}", fmt::join(f.names, ", "));
  auto unmatched = [&](const std::string& what) {
    std::string msg = fmt::format("remat policy '{}': {} matches no checkpoint name in the model; the names are: {}",
                                  p.preset.empty() ? p.text : p.preset, what, existing);
    if (o.allow_unmatched) {
      warnings.push_back(msg);
    } else {
      CHECK(false, "{} (set remat_allow_unmatched=true to accept)", msg);
    }
  };
  for (const auto* list : {&p.save_names, &p.offload_names})
    for (const std::string& n : *list)
      if (!f.names.count(n)) unmatched(fmt::format("name '{}'", n));
  for (const std::string* re : {&p.save_regex, &p.offload_regex}) {
    if (re->empty()) continue;
    std::regex r(*re);
    bool any = false;
    for (const std::string& n : f.names) any = any || std::regex_match(n, r);
    if (!any) unmatched(fmt::format("regex \"{}\"", *re));
  }
  if (p.kind == Policy::Kind::dots_with_no_batch_dims_saveable && f.dots > 0 && f.batched_dots == f.dots)
    warnings.push_back(fmt::format(
        "remat policy '{}': every one of the {} dot_generals in remat regions has batch dimensions, so it saves "
        "nothing (the trap of vmapped pipeline stages); name the tensors to save instead",
        p.text, f.dots));
  if (p.first) check_policy(*p.first, f, o, warnings);
  if (p.second) check_policy(*p.second, f, o, warnings);
}

}  // namespace

std::vector<std::string> lint(const ir::Graph& forward, const Policy& policy, const LintOptions& options) {
  Found f;
  collect(forward, false, f);
  std::vector<std::string> warnings;
  if (f.regions) check_policy(policy, f, options, warnings);
  return warnings;
}

}  // namespace remat::rematerialize
