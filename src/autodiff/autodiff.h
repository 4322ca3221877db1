// Reverse-mode automatic differentiation over the IR (docs/design.md, "The stages").
// grad() appends the backward pass to the same graph: for each node in reverse order its VJP rule emits
// IR that maps output cotangents to input cotangents; cotangents of a value read twice are summed with
// `add`. Backward nodes carry their forward node's scope. Only floating-point values carry cotangents.
//  - scan: the forward scan also emits its per-iteration residuals (stacked [length, ...]) and a reverse
//    scan runs the body's VJP.
//  - remat (jax.checkpoint): each residual (a forward value the backward reads) is saved (an extra output
//    of the region), offloaded (copied to host inside the region, reloaded before the backward) or
//    recomputed (its producer chain is cloned into the backward, marked `recomputed`, back to saved values
//    and region inputs). Region inputs are always available; values that depend only on the weights (and
//    constants) are always recomputed. A region nested inside another (a group's layers) is split by its
//    own policy first, as JAX nests jax.checkpoint: the outer policy judges the nested forward's results,
//    and recomputing them reruns that forward with the inner policy applied, so an activation op runs at
//    most once per nesting level plus once (twice for one level, three times in a double scan).
//
//   ir::Graph step = autodiff::grad_graph(loss_graph, {0, 1}, &decider);
#pragma once

#include "ir/ir.h"

#include <span>
#include <string>
#include <vector>

namespace remat::autodiff {

enum class Residency { save, offload, recompute };

// One residual of a remat region, as the policy sees it.
struct ResidualQuery {
  const ir::AttrValue& policy;  // the region's policy attribute: the value it was traced with, or text
  const ir::Graph& graph;       // the graph holding `producer`
  const ir::Node& producer;     // the op whose output is the residual (inside a scan body for stacked ones)
  size_t output;                // which output of `producer`
  bool parameter_derived;       // depends only on the weights (see grad) and constants
  int64_t trip_count;           // executions per step of the producer's enclosing region (scan lengths)
  uint64_t region;              // the remat node's origin: identifies the region in reports
  int position;                 // the producer's index in the region's (flattened) body: report order
  bool alias_of_input;          // a checkpoint name on a region input: the same bytes, kept whatever the answer
};

// Decides each residual's residency. The remat stage implements the policy vocabulary (remat/).
class RematDecider {
 public:
  virtual ~RematDecider() = default;
  virtual Residency decide(const ResidualQuery& q) = 0;
  // A region input the backward reads: always available (saved by whoever produced it). For reports.
  virtual void note_input(const ir::AttrValue& policy, uint64_t region, int index, const std::string& param_name,
                          const ir::Type& type, bool parameter_derived, int64_t trip_count) = 0;
  // The producer at `position` of `region` runs again in the backward whatever was decided for its outputs
  // (a group's forward, rerun for the values the group's policy does not keep): all of them come from that
  // rerun, none is kept. For reports.
  virtual void rerun(uint64_t region, int position) = 0;
};

// Appends d(loss)/d(wrt[i]) for a scalar floating-point `loss` (the wrt values are params of g). A value that does not reach the loss gets
// a zero gradient. Returns one value id per entry of `wrt`. A graph with remat regions needs a decider.
// `weights` are the model parameters: values computed only from them and constants are never saved
// (always recomputed where the backward needs them), by scans and remat regions alike.
std::vector<ir::ValueId> grad(ir::Graph& g, ir::ValueId loss, std::span<const ir::ValueId> wrt,
                              RematDecider* decider = nullptr, std::span<const ir::ValueId> weights = {});

// The vector-Jacobian product: appends the cotangents of `wrt` (params of g or outputs of its nodes) given
// `seeds`, pairs (value, its cotangent) already in g, summed into the backward as a loss's seed is. The
// backward of one pipeline stage: seeded with the gradient its next stage sent, with respect to the
// activation its previous stage sent (a recv's output) and its weights. A wrt value the seeds do not reach
// gets a zero cotangent. `decider` and `weights` as for grad.
std::vector<ir::ValueId> vjp(ir::Graph& g, std::span<const std::pair<ir::ValueId, ir::ValueId>> seeds,
                             std::span<const ir::ValueId> wrt, RematDecider* decider = nullptr,
                             std::span<const ir::ValueId> weights = {});

// A backward split for zero-bubble pipelines (Qi et al.): of the nodes [first, end) of g (a backward appended
// by vjp), those the cotangent `input_gradient` needs (B: what the previous stage waits for), true per node of
// g; the others (W) compute what only the weights' gradients need, and read B's values and the forward's. A
// scan that computes both (a scanned stack's backward) is first split in two: a B scan carrying the input's
// cotangent, stacking per iteration what the W scan after it reads (ids of g's values are kept).
std::vector<bool> split_backward(ir::Graph& g, size_t first, ir::ValueId input_gradient);
// A new graph whose results are f's results followed by the gradient of f's first result (a scalar)
// with respect to f's params at `wrt_params` (indices into f.params). `weight_params` as grad's weights.
// Dead code is removed.
ir::Graph grad_graph(const ir::Graph& f, std::span<const int> wrt_params, RematDecider* decider = nullptr,
                     std::span<const int> weight_params = {});

}  // namespace remat::autodiff
