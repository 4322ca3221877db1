// Public header of the policy search (`remat_policy: auto`, docs/policies.md): the cheapest placement of the model's
// checkpoint names — each one recomputed, saved on device or offloaded to host, the space of MaxText's
// `custom(...)` — whose per-device plan fits the memory limits, proved optimal.
// Under groups (layers_per_group > 0) the group policy G is searched with it (the two levels of issue 32). G is
// asked about the stacked values of a group's layers: each layer's input and what P keeps; if the group's backward
// needs one G does not keep, the group's whole forward is rerun, which makes every one of them again. So a G that
// keeps only some of them plans as nothing_saveable does (a test checks it), and G has two meaningful choices:
//  - nothing_saveable: only the groups' inputs cross groups; each group's forward is rerun in its backward;
//  - save_only_these_names(decoder_layer_input, the names P saves), with a P that offloads nothing: no group
//    recompute. (A name P offloads is stacked as its host copy, which G cannot name: the group's forward is then
//    rerun and the plan is nothing_saveable's, so those pairs are left out; a test checks it.)
// The space is P's placements with nothing_saveable, and those that offload nothing with the keeping G; the brute
// force of the tests enumerates the same.
//
// Objective: estimated seconds per step spent on the policy: recompute FLOPs at the measured GEMM rate
// (contractions: dot_general, flash attention) and elementwise rate (everything else), plus offload traffic (each offloaded byte goes to
// host and back) at the host bandwidth, plus the bytes a device sends again in the collectives recomputation
// reruns (tensor parallelism's sums, FSDP's gathers) at the interconnect bandwidth; the CPU backend copies
// synchronously, so no transfer is hidden.
// Ties go to the lower peak.
//
// Method: branch and bound over the names (largest first), best bound first.
//  - Cost bound of a partial placement: the rest saved on device. Exact and valid: saving a value never adds
//    recompute or recomputed communication (a recompute chain stops at saved values), and device adds no traffic.
//  - Memory bound (the model): peak(a) >= B + saved(a), where saved(a) is the device bytes of a's saved
//    residuals (additive over names) and B = peak - saved of the placement with every name on device (one B per
//    group policy: G keeping P's names across groups changes what a saved name costs).
//    That is the lemma "keeping a residual on device costs exactly its bytes; recomputing or offloading it
//    can only add temporaries elsewhere in the peak". Host: the host arena holds at least every offloaded
//    residual (all are live when the loss is computed).
//  - A complete placement within both bounds is planned by the real planner (the oracle); the first that
//    fits is optimal, since every cheaper placement was planned and did not fit, or is over a bound.
// The lemma is checked on every placement planned (a plan below its bound turns the memory bound off and the
// search runs again planning every candidate) and exhaustively against brute force in the tests; it is a
// property of the planner observed, not proved for every graph, so a violation on a placement the bound pruned
// would go unseen.
//
//   search::Result r = search::search(request, {.device = limit}, search::measure(DType::bf16));
//   fmt::print("{}", r.text());   // remat_policy: custom(query_proj=device, ...), peak, recompute, ...
#pragma once

#include "compile/compile.h"

#include <optional>
#include <string>
#include <vector>

namespace remat::search {

using autodiff::Residency;

// Rates of this machine for the objective.
struct Rates {
  double gemm_flops = 1e11;      // FLOP/s of dot_general (and attention) in the compute dtype
  double other_flops = 1e9;      // FLOP/s of elementwise ops and reductions
  double host_bandwidth = 1e10;  // bytes/s of an offload or reload copy
  double ici_bandwidth = 1e10;   // bytes/s one device sends to the others of its mesh
};

// Times a 512^3 GEMM in `compute`, an f32 add over 2M elements and an offload + reload of 16 MiB with the CPU
// kernels (the best of 5 runs each after a warm-up run; well under a second). A bandwidth > 0 is taken as given; else both are the copy
// rate measured (ranks on one host exchange through shared memory, at about the rate of a copy).
Rates measure(DType compute, double host_bandwidth = 0, double ici_bandwidth = 0);

struct Limits {
  int64_t device = 0;  // hbm_limit: bytes of the per-device plan's total; 0: unlimited
  int64_t host = 0;    // host_limit: bytes of the host arena (offloaded residuals); 0: unlimited
};

// One placement, planned.
struct Candidate {
  std::vector<Residency> placement;  // per searched name (Result::names)
  bool group_keeps = false;          // under groups: G keeps what the group's backward reads (see above)
  std::string policy;                // its custom(...) text, paste-able as remat_policy
  std::string group_policy;          // under groups: G's text, paste-able as group_remat_policy; else empty
  int64_t peak = 0, host = 0;        // the plan's device total and host arena
  double recompute_flops = 0, recompute_gemm_flops = 0, step_flops = 0;
  double offloaded_bytes = 0;        // per step (stacked residuals count once per layer)
  double recomputed_sent = 0;        // bytes per step a device sends again in recomputed collectives
  double seconds = 0;                // the objective
  bool fits = false;                 // within both limits
};

struct Result {
  std::vector<std::string> names;     // the searched names (MaxText spelling, as custom(...) takes them)
  std::vector<double> name_bytes;     // per name: its residuals' bytes per step (every layer; under a pipeline,
                                      // every microbatch of the rank's)
  std::optional<Candidate> best;      // the cheapest that fits; none when nothing fits
  Candidate smallest;                 // when nothing fits: the smallest peak (within host_limit)
  std::vector<Candidate> cheaper;     // each one-name change of `best` (or of G) that would cost less, planned
  Limits limits;
  Rates rates;
  int planned = 0, differentiated = 0;  // oracle calls: full plans, and differentiations for recompute costs
  std::optional<int64_t> layers_per_group;  // set by search_group_sizes: the size answered (0: no groups)
  bool lemma_held = true;             // false: a plan fell below the memory bound (the search then planned all)
  bool memory_bound = true;           // false under a pipeline: the search plans every cheaper candidate

  // What a user acts on: the policy to paste, its peak, recompute share and offload bytes, and why each
  // cheaper one-name change does not fit; or, when nothing fits, the smallest peak any placement reaches.
  std::string text() const;
};

// `request`: the per-device training step to place (its model's remat_policy is replaced); under a pipeline,
// the program of rank `request.stage`, whose chunks all take the placement. There a saved name costs its
// microbatch's bytes once per microbatch the rank stashes at its peak (the schedule's): the host bound counts
// one microbatch's, the offload cost every microbatch's; the memory bound is off (Result::memory_bound).
Result search(const compile::Request& request, const Limits& limits, const Rates& rates);

// remat_policy=auto under a pipeline (request.pipeline): search() for each rank, in parallel, one Result per rank
// (paste-able together as pipeline_stage_remat_policies, one entry per rank). Each is exact as search() is (the
// tests: brute force over each rank's placements).
std::vector<Result> search_ranks(const compile::Request& request, const Limits& limits, const Rates& rates);

// The group size searched too: search() under every layers_per_group that divides the layers (0: no groups, if
// scan_layers), the cheapest answer that fits, equal cost to the lower peak, then the smaller size; when nothing
// fits under any size, the smallest peak of all. Exact as each search is (the tests: brute force over every size).
Result search_group_sizes(const compile::Request& request, const Limits& limits, const Rates& rates);

// The names a search over `request` decides (a checkpoint name on a region input is kept with it whatever
// the answer, so it is not searched), with each one's residual bytes per step.
std::vector<std::string> searched_names(const compile::Request& request, std::vector<double>* bytes = nullptr);

// Plans one placement of `names` (the oracle; the tests' brute force uses it too); under groups with G as
// group_placed() gives it for `group_keeps`.
Candidate evaluate(const compile::Request& request, const std::vector<std::string>& names,
                   const std::vector<Residency>& placement, const Limits& limits, const Rates& rates,
                   bool group_keeps = false);

// Plans any policy as evaluate() plans a placement (presets beside the search's answers).
Candidate evaluate_policy(const compile::Request& request, const rematerialize::Policy& policy, const Limits& limits,
                          const Rates& rates);

// The Pareto frontier of the space, peak against cost, from exact solves at falling budgets (under
// limits.host; limits.device is ignored), and MaxText's presets planned beside it.
struct Frontier {
  std::vector<Candidate> points;   // cheapest first: rising cost, falling peak
  std::vector<Candidate> presets;  // policy = the preset's name
  bool dominated(const Candidate& c) const;  // some point is no worse in both and better in one
  std::string svg(const std::string& title) const;
};
Frontier frontier(const compile::Request& request, const Limits& limits, const Rates& rates);

// The custom policy placing `names` (MaxText's) as `placement` says, spelled as the layer of `model` spells them;
// it prints as custom(name=remat|device|offload, ...).
rematerialize::Policy placed(const nn::ModelConfig& model, const std::vector<std::string>& names,
                             const std::vector<Residency>& placement);

// The group policy G of the searched space (above): nothing_saveable, or with `keeps`
// save_only_these_names(decoder_layer_input, the names `placement` keeps), spelled as `model`'s layer spells them.
rematerialize::Policy group_placed(const nn::ModelConfig& model, const std::vector<std::string>& names,
                                   const std::vector<Residency>& placement, bool keeps);

// The group policy choices a search over `request` decides: {false, true} under groups, else {false}.
std::vector<bool> group_choices(const compile::Request& request);

}  // namespace remat::search
