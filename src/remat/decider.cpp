#include "remat/remat.h"

#include "base/check.h"

#include <algorithm>

namespace remat::rematerialize {

Residency Decider::decide(const autodiff::ResidualQuery& q) {
  const std::shared_ptr<const Policy> policy = region_policy(q.policy);
  const Policy& p = *policy;
  Verdict v = q.parameter_derived ? Verdict{Residency::recompute, "parameter-derived: always recomputed"}
                                  : evaluate(p, q.graph, q.producer, q.output);
  ResidualRecord r;
  r.policy = p.described();
  r.what = q.producer.op == ir::Op::name ? q.producer.attrs.str("name")
                                         : fmt::format("{} @ {}", ir::op_name(q.producer.op), q.producer.scope);
  r.scope = q.producer.scope;
  r.type = q.graph.type(q.producer.outputs[q.output]);
  r.residency = q.alias_of_input ? Residency::save : v.residency;
  r.rule = q.alias_of_input ? v.rule + "; an alias of the region input, kept with it" : v.rule;
  r.parameter_derived = q.parameter_derived;
  r.alias = q.alias_of_input;
  r.trip_count = q.trip_count;
  r.origin = q.producer.origin;
  r.position = q.position;
  r.region = q.region;
  records_.push_back(std::move(r));
  return v.residency;
}

void Decider::note_input(const ir::AttrValue& policy, uint64_t region, int index, const std::string& param_name,
                         const ir::Type& type, bool parameter_derived, int64_t trip_count) {
  const std::shared_ptr<const Policy> held = region_policy(policy);
  const Policy& p = *held;
  ResidualRecord r;
  r.policy = p.described();
  r.what = "input %" + param_name;
  r.type = type;
  r.residency = Residency::save;
  r.rule = parameter_derived ? "region input, weight-derived: no activation memory" : "region input: always saved";
  r.region_input = true;
  r.parameter_derived = parameter_derived;
  r.trip_count = trip_count;
  r.region = region;
  r.position = index - (1 << 20);  // before every produced value
  records_.push_back(std::move(r));
}

void Decider::rerun(uint64_t region, int position) {
  for (ResidualRecord& r : records_) {
    if (r.region != region || r.position != position || r.region_input || r.residency == Residency::recompute) continue;
    r.residency = Residency::recompute;
    r.rule += "; its producer reruns in the backward anyway (for values not kept), so this comes from that rerun";
  }
}

}  // namespace remat::rematerialize
