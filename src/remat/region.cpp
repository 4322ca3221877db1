// A remat region carries its policy as a value (ir::ObjectAttr): nothing looks a policy up by its text.
#include "remat/policy.h"

#include "base/check.h"

namespace remat::rematerialize {
namespace {

struct PolicyObject final : ir::AttrObject {
  explicit PolicyObject(Policy p) : policy(std::make_shared<const Policy>(std::move(p))) {}
  std::string text() const override { return policy->written; }
  bool equals(const ir::AttrObject& other) const override {
    const auto* o = dynamic_cast<const PolicyObject*>(&other);
    return o != nullptr && same_policy(*o->policy, *policy);
  }
  std::shared_ptr<const Policy> policy;
};

}  // namespace

bool same_policy(const Policy& a, const Policy& b) {
  return a.written == b.written && a.text == b.text && a.preset == b.preset;
}

ir::AttrValue policy_attr(const Policy& p) { return ir::ObjectAttr{std::make_shared<const PolicyObject>(p)}; }

std::shared_ptr<const Policy> region_policy(const ir::AttrValue& attr) {
  if (const auto* o = std::get_if<ir::ObjectAttr>(&attr)) {
    const auto* p = dynamic_cast<const PolicyObject*>(o->object.get());
    ASSERT(p != nullptr);
    return p->policy;
  }
  const auto* text = std::get_if<std::string>(&attr);
  CHECK(text != nullptr, "a remat region's policy attribute is neither a policy nor its text");
  return std::make_shared<const Policy>(parse_policy(*text));
}

}  // namespace remat::rematerialize
