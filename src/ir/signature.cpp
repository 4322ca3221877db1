#include "ir/signature.h"

#include "base/check.h"

#include <algorithm>

namespace remat::ir {

std::string_view role_name(Role r) {
  switch (r) {
    case Role::parameter: return "parameter";
    case Role::optimizer_state: return "optimizer_state";
    case Role::step: return "step";
    case Role::loss_scale: return "loss_scale";
    case Role::batch: return "batch";
    case Role::metric: return "metric";
    case Role::output: return "output";
  }
  return "?";
}

namespace {
int find(const std::vector<Slot>& slots, std::string_view name) {
  auto it = std::find_if(slots.begin(), slots.end(), [&](const Slot& s) { return s.name == name; });
  ASSERT(it != slots.end());
  return static_cast<int>(it - slots.begin());
}
}  // namespace

int Signature::arg(std::string_view name) const { return find(args, name); }
int Signature::result(std::string_view name) const { return find(results, name); }

std::vector<std::pair<int, int>> Signature::updates() const {
  std::vector<std::pair<int, int>> pairs;
  for (size_t r = 0; r < results.size(); ++r)
    if (results[r].updates >= 0) pairs.emplace_back(static_cast<int>(r), results[r].updates);
  return pairs;
}

std::string Signature::text() const {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) out += fmt::format("arg {} {} {}\n", i, args[i].name, role_name(args[i].role));
  for (size_t i = 0; i < results.size(); ++i)
    out += fmt::format("result {} {} {}{}\n", i, results[i].name, role_name(results[i].role),
                       results[i].updates >= 0 ? fmt::format(" (updates arg {})", results[i].updates) : "");
  return out;
}

}  // namespace remat::ir
