// A graph compiled against its memory plan: one device arena and one host arena allocated by the backend
// at construction (faulted in: 2 MiB-aligned, MADV_HUGEPAGE), every kernel reading and writing at planned
// offsets with its planned workspace, scan bodies in their sub-arenas. Donated results (updated parameters
// and moments) are written into their argument buffers in place. Other results are views into the arena,
// valid until the next run(). The arguments either come with each run, or live in buffers the executable
// owns (own_arguments), some of which may be views of another executable's (evaluation reading the
// training step's parameters).
//
//   exec::Executable step(graph, plan::build(graph, {.donate = pairs, .workspace = exec::workspace_of(exec::cpu())}));
//   const std::vector<exec::Array>& out = step.run(args);   // args[p] is overwritten for each donated p
#pragma once

#include "exec/exec.h"
#include "plan/plan.h"

#include <map>
#include <memory>

namespace remat::exec {

class Executable {
 public:
  // With `arenas_of`, runs in that executable's arenas wherever its own plan fits in them (evaluation and
  // sampling in the training step's): the two must never run at the same time, and each run overwrites
  // the other's arena results.
  Executable(ir::Graph graph, plan::Plan plan, Options options = {}, const Executable* arenas_of = nullptr);
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  // The results stay valid until the next run (their vector is reused: a steady-state run allocates nothing).
  const std::vector<Array>& run(std::span<const Array> args);
  // Allocates the arguments, one zeroed, faulted-in block for all of them, except those in `shared` (by
  // argument index), which are used as given; once. Fill them, then run() without arguments.
  std::vector<Array>& own_arguments(const std::map<int, Array>& shared = {});
  const std::vector<Array>& run() { return run(arguments_); }
  // Bytes this executable allocated: the arguments it owns and the arenas (or separate buffers) it does
  // not share.
  int64_t owned_bytes() const { return owned_bytes_; }
  // Whether both its arenas are another executable's (arenas_of, where the plan fit).
  bool shares_arenas() const { return shared_arenas_ == 2; }

  const ir::Graph& graph() const { return graph_; }
  const plan::Plan& plan() const { return plan_; }
  const Options& options() const { return options_; }
  // Times the kernel calls of the runs that follow into `profile` (null: stops).
  void set_profile(Profile* profile) { options_.profile = profile; }
  // Peak of the live arena bytes observed while running (a buffer is live from the step that first writes
  // it to the step that last reads it; results to the end), per memory space. Meant to equal the plan's
  // lower_bound: the check that liveness was planned right.
  int64_t measured_peak(plan::Space space) const { return measured_[static_cast<int>(space)]; }
  // The instrumented record: live arena bytes at each schedule step of the last run, per memory space.
  const std::vector<int64_t>& measured_live(plan::Space space) const { return live_[static_cast<int>(space)]; }

 private:
  struct Frame;  // per-graph execution state, reused every run (no steady-state allocation)
  // `slices`: per result of a scan body, its slice of the stacked output (used where plan::Plan::in_slice).
  void run_graph(const ir::Graph& g, const plan::Plan& p, int64_t device_base, int64_t host_base, Frame& f,
                 std::span<const Array> args, std::span<const Array> slices, bool top);
  Frame& frame_for(const ir::Graph& g);
  void check_workspace(const ir::Graph& g, const plan::Plan& p) const;
  void call_kernel(const ir::Graph& g, const ir::Node& n, std::span<const Array> in, std::span<Array> out,
                   std::span<std::byte> workspace);
  // Where buffer `b` of plan `p` is: its own allocation (separate_buffers) or its arena slot.
  std::byte* buffer_bytes(const plan::Plan& p, size_t b, int64_t device_base, int64_t host_base) const;
  void allocate_separately(const ir::Graph& g, const plan::Plan& p);
  void poison(const plan::Plan& p, size_t b, int64_t device_base, int64_t host_base);  // options_.poison

  ir::Graph graph_;
  plan::Plan plan_;
  Options options_;
  const Backend& backend_;
  Array device_, host_;
  Array arguments_block_;
  int64_t owned_bytes_ = 0;
  int shared_arenas_ = 0;  // how many of device_, host_ are arenas_of's
  std::vector<Array> arguments_;
  std::map<const plan::Plan*, std::vector<Array>> separate_;  // options_.separate_buffers: per plan, by buffer
  std::map<const plan::Plan*, std::vector<std::vector<int>>> ends_at_;  // options_.poison: buffers by last step
  std::map<const ir::Graph*, std::unique_ptr<Frame>> frames_;
  int64_t measured_[2] = {0, 0};
  std::vector<int64_t> live_[2];
  std::vector<Array> results_;
  std::vector<std::shared_ptr<const ir::Type>> result_types_;  // owned by the results: they outlive the graph
};

}  // namespace remat::exec
