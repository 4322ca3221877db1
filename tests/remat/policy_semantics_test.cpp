// JAX's definitions (../shared/reference/remat-semantics.md, b.2) checked residual by residual on one
// decoder layer (region inputs, aliases of them and weight-derived values have fixed answers and are
// skipped): what dots_saveable, save_any_names_but_these and offload_dot_with_no_batch_dims save,
// offload and recompute. The expected answer is derived here from the residual's producer, not from the
// policy code.
#include "remat/remat.h"
#include "support/models.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>

namespace remat {
namespace {

using rematerialize::Residency;
using rematerialize::ResidualRecord;

bool is_dot(const ResidualRecord& r) { return r.what.rfind("dot_general @ ", 0) == 0; }
// Checkpoint names are recorded bare; other producers as "op @ scope".
bool is_named(const ResidualRecord& r) { return r.what.find(" @ ") == std::string::npos; }
// The layer's dots with batch dimensions are the two attention dots (scores, probs . v: batch b, h).
bool has_batch_dims(const ResidualRecord& r) { return is_dot(r) && r.scope == "decoder/layers/self_attention/attention"; }

// Checks every free residual's decision against `expected`; returns how many of each residency were seen.
std::map<Residency, int> check(const std::string& policy, const std::function<Residency(const ResidualRecord&)>& expected) {
  const nn::ModelConfig c = testing_support::micro_model(1, false, policy);
  rematerialize::Decider d;
  train::grads_program(c, {1, 4, 1}, &d);
  std::map<Residency, int> seen;
  for (const ResidualRecord& r : d.records()) {
    if (r.region_input || r.alias || r.parameter_derived) continue;
    EXPECT_EQ(r.residency, expected(r)) << policy << ": " << r.what << " (" << r.rule << ")";
    ++seen[r.residency];
  }
  return seen;
}

// `none` is a policy of the grammar like any other (no remat region: the model traces no jax.checkpoint),
// not a string the config and the model special-case.
TEST(PolicySemantics, NoneIsPartOfTheGrammar) {
  const rematerialize::Policy p = rematerialize::parse_policy(" none ");
  EXPECT_EQ(p.kind, rematerialize::Policy::Kind::none);
  EXPECT_EQ(p.text, "none");
  EXPECT_FALSE(p.can_offload());
  EXPECT_THROW(rematerialize::parse_policy("none(query_proj)"), Error);
}

TEST(PolicySemantics, DotsSaveableSavesEveryDotAndNothingElse) {
  auto seen = check("dots_saveable", [](const ResidualRecord& r) { return is_dot(r) ? Residency::save : Residency::recompute; });
  EXPECT_GE(seen[Residency::save], 2) << "the attention dots, batch dims and all";
  EXPECT_GT(seen[Residency::recompute], 0);
}

TEST(PolicySemantics, SaveAnyNamesButTheseSavesOtherNamesOnly) {
  const std::set<std::string> excluded{"mlpwo", "context"};
  auto seen = check("save_any_names_but_these(mlpwo, context)", [&](const ResidualRecord& r) {
    return is_named(r) && !excluded.count(r.what) ? Residency::save : Residency::recompute;
  });
  EXPECT_GE(seen[Residency::save], 5) << "q, k, v, out_proj, mlpwi_0, mlpwi_1 are read by the backward";
  EXPECT_GT(seen[Residency::recompute], 0);
}

TEST(PolicySemantics, OffloadDotWithNoBatchDimsOffloadsProjectionsAndSavesNothing) {
  auto seen = check("offload_dot_with_no_batch_dims", [](const ResidualRecord& r) {
    return is_dot(r) && !has_batch_dims(r) ? Residency::offload : Residency::recompute;
  });
  EXPECT_EQ(seen[Residency::save], 0);
  EXPECT_GT(seen[Residency::offload], 0);
}

}  // namespace
}  // namespace remat
