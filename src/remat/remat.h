// Public header of the remat stage (docs/policies.md): policies (policy.h), the decider that applies them while
// autodiff splits remat regions, lint of policies against a traced model, and `remat explain`.
//
//   rematerialize::Decider decider;   // each remat region carries its policy (policy_attr)
//   ir::Graph step = autodiff::grad_graph(forward, wrt, &decider);
//   for (auto& w : rematerialize::lint(forward, policy, {})) fmt::print("warning: {}\n", w);   // errors throw
//   fmt::print("{}", rematerialize::explain(decider.records(), step).text());
#pragma once

#include "remat/policy.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace remat::rematerialize {

// One residual of one remat region, as decided.
struct ResidualRecord {
  std::string policy;           // the region's policy, as Policy::described() prints it
  std::string what;             // checkpoint name, or "op @ scope", or "input %name"
  std::string scope;
  ir::Type type;
  Residency residency = Residency::save;
  std::string rule;             // what decided it
  bool region_input = false;    // a region input (always available)
  bool parameter_derived = false;  // computed from weights and constants only: no activation memory
  bool alias = false;              // a checkpoint name on a region input: no memory of its own
  int64_t trip_count = 1;       // executions per step of the region (scan lengths)
  uint64_t origin = 0;          // the producer's origin (0 for region inputs)
  uint64_t region = 0;          // the remat region's origin
  int position = 0;             // report order within the region: inputs (negative) first, then forward order
};

// Applies each remat region's policy, the value the region carries (region_policy), to its residuals; keeps a
// record of every decision.
class Decider : public autodiff::RematDecider {
 public:
  Residency decide(const autodiff::ResidualQuery& q) override;
  void note_input(const ir::AttrValue& policy, uint64_t region, int index, const std::string& param_name,
                  const ir::Type& type, bool parameter_derived, int64_t trip_count) override;
  void rerun(uint64_t region, int position) override;
  const std::vector<ResidualRecord>& records() const { return records_; }

 private:
  std::vector<ResidualRecord> records_;
};

struct LintOptions {
  bool allow_unmatched = false;  // a name or regex that matches no checkpoint name is then only a warning
};

// Checks `policy`, the policy of the remat regions of `forward`, against the checkpoint names they hold: a
// name or regex matching none is an error listing the names that exist; dots_with_no_batch_dims_saveable
// where every dot has batch dims is a warning. Returns the warnings. No remat region: nothing to check.
std::vector<std::string> lint(const ir::Graph& forward, const Policy& policy, const LintOptions& options);

struct Explanation {
  std::vector<ResidualRecord> residuals;
  std::map<uint64_t, int64_t> runs;  // executions per step by origin, in the differentiated graph
  double forward_flops = 0, step_flops = 0, recompute_flops = 0;
  double recompute_gemm_flops = 0;  // the part of recompute_flops in contractions (dot_general, attention)
  double step_gemm_flops = 0;       // the part of step_flops in contractions
  // The double scan (layers_per_group): the group regions (each holds a scan of layer regions), and the part of
  // recompute_flops that reruns a group's forward in its backward (the rest is the layers' own recompute).
  std::vector<uint64_t> group_regions;
  double group_recompute_flops = 0;

  // Activation bytes per step kept on device / on host by the policies (region inputs included,
  // weight-derived inputs excluded; stacked residuals count once per layer). Under groups a layer's are kept
  // only while its group's backward runs; text() shows the two levels apart.
  double saved_bytes() const;
  double offloaded_bytes() const;
  std::string text() const;
  // The whole step in one line: bytes saved and offloaded, GFLOP forward, backward, recompute (text()'s last line).
  std::string step_summary() const;
  nlohmann::json json() const;
};

// Kernel runs per step by origin (Explanation::runs) of a step program, also after the IR passes (fusion).
std::map<uint64_t, int64_t> runs_per_step(const ir::Graph& step);

// Explains the decisions recorded while differentiating into `step`.
Explanation explain(const std::vector<ResidualRecord>& records, const ir::Graph& forward, const ir::Graph& step);

}  // namespace remat::rematerialize
