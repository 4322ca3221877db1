// Partial evaluation of a region body for its VJP, the skeleton that scan's and remat's rules share (JAX's
// partial_eval_jaxpr_custom is the model):
//  1. differentiate(): the joint graph J, a copy of the body (forward part F) followed by its VJP (backward
//     part K), seeded with one new param per differentiated result.
//  2. partial_eval(): every F value that K reads is a residual, and a rule (the caller's: scan stacks what
//     is not weight-derived, remat asks the policy) says what becomes of it: read as it is, saved as an extra
//     forward result, offloaded to host, or recomputed in the backward (its producer's inputs are then
//     decided in turn).
//  3. forward_body(): F returning the body's results, then the saved residuals, then host copies of the
//     offloaded ones. The backward is the recompute clones followed by the live nodes of K.
// The caller wires these into its own outer graph (scan: a reverse scan; remat: inline in the outer graph).
#pragma once

#include "autodiff/vjp.h"

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace remat::autodiff {

// What a differentiated body is, and how it sits in the outer sweep.
struct JointRequest {
  const ir::Graph& body;                       // the region's body (copied, not changed)
  std::span<const std::string> seed_names;     // per body result: its cotangent param's name, "" for none
  std::span<const std::string> accumulators;   // per leading body param: the name of a param of its type
                                               // added after the seeds, "" for none (scan's dc accumulators)
  const std::vector<bool>& parameter_derived;  // per body param (see Context)
  const std::vector<bool>& differentiable;     // per body param
  RematDecider* decider = nullptr;
  int64_t trip_count = 1;  // executions per step of the body
};

// The joint graph: nodes [0, num_forward) are the body's (value ids unchanged), the rest its VJP.
struct Joint {
  ir::Graph graph;
  size_t num_forward = 0;
  std::vector<ir::ValueId> params, results;  // the body's
  std::vector<ir::ValueId> seeds;            // per result: its cotangent param, or -1
  std::vector<ir::ValueId> accumulators;     // per JointRequest::accumulators entry, or -1
  std::vector<ir::ValueId> cots;             // per body param: its cotangent, or -1 (zero)
  std::vector<bool> parameter_derived;       // per value id of `graph` (forward values)
  std::vector<int> producer;                 // per value id: the F node making it, or -1
  std::vector<size_t> output_of;             // per value id made by F: which output of its producer
};

// Copies the body and appends its VJP seeded at request.seed_names' params. The caller may append more
// backward nodes (through a Builder on joint.graph) before partial_eval.
Joint differentiate(const JointRequest& request);

// What becomes of a forward value the backward reads.
enum class ResidualKind {
  available,  // read as it is (a region input or output the caller passes to the backward)
  save,       // an extra result of the forward body
  offload,    // an extra result of the forward body, copied to host there; the caller reloads it
  recompute,  // its producer runs again in the backward (a clone marked `recomputed`)
  alias,      // a checkpoint name of its producer's input: that input stands for it
};

struct Residual {
  ir::ValueId value;
  ResidualKind kind;
};

// A forward value the rule is asked about: a body param (`param` >= 0) or an output of an F node.
struct Candidate {
  ir::ValueId value;
  int param = -1;     // index into the body's params
  int producer = -1;  // F node index
  size_t output = 0;  // which output of the producer
};
// A parameter rather than a switch, so that a caller can apply any policy (nested regions, offload budgets).
using ResidualRule = std::function<ResidualKind(const Candidate&)>;

// The order residuals are decided in, which is the order of the saved results and of the rule's calls.
enum class Walk {
  first_use,     // depth first from the backward's reads, in the order it reads them (scan)
  latest_first,  // F values latest first, so that every consumer is decided before the value (remat)
};

struct Split {
  std::vector<Residual> residuals;  // in the order decided; each value once
  std::vector<ir::Node> backward;   // recompute clones (same value ids), then K's live nodes, in order
};

// Decides the residuals K needs to produce `needed` (values of joint.graph) and moves K's live nodes out of
// the joint graph. `known` values are available without asking the rule (remat: the region's outputs).
Split partial_eval(Joint& joint, std::span<const ir::ValueId> needed, std::span<const ir::ValueId> known,
                   const ResidualRule& rule, Walk walk);

// F as a body: the body's results, then the saved residuals, then an `offload` (in `scope`) of each offloaded
// one. Params, param names and name are the original body's.
std::shared_ptr<ir::Graph> forward_body(const Joint& joint, const Split& split, const ir::Graph& body,
                                        const std::string& scope);

// The residuals of `kind`, in the order decided.
std::vector<ir::ValueId> of_kind(const Split& split, ResidualKind kind);

// Makes `forward` the body of outer node `index` and gives that node one new output per type.
std::vector<ir::Tensor> add_outputs(ir::Builder& b, size_t index, std::shared_ptr<ir::Graph> forward,
                                    std::span<const ir::Type> types);

}  // namespace remat::autodiff
