// Pipeline schedules as data (docs/parallelism.md, "Pipeline parallelism"): for each rank of the `stage` mesh
// axis, the list of actions it runs in one training step — forward or backward of one microbatch through one of
// its chunks (virtual stages), and the sends and receives that move activations forward and their gradients
// back. Generators for GPipe, 1F1B (PipeDream-Flush), interleaved 1F1B (Megatron's order) and ZB-H1 (Qi et al.,
// "Zero Bubble Pipeline Parallelism": each backward split into B, the input's gradient, and W, the weights'; W
// deferred); a validator; a simulator that runs every rank's list against per-chunk costs and reports the
// timeline, the stashed microbatches in flight and the bubble;
// a text grid (ranks x time slots) and an SVG.
//
// Virtual stage k of K = p·v runs on rank k mod p as its chunk k / p (MaxText's circular placement: rank r
// owns layer blocks r, r + p, ...). Sends never wait (MPI_Isend); a receive waits for its matching send, the
// messages between two ranks of one kind matched in order (one MPI tag per kind).
//
//   parallel::Schedule s = parallel::make_schedule(parallel::ScheduleKind::one_f_one_b, {.stages = 4, .microbatches = 8});
//   parallel::Simulation t = parallel::simulate(s, {1, 2});        // CHECKs that it is valid and progresses
//   fmt::print("{}", parallel::grid(s, t));
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace remat::parallel {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved_1f1b, zb_h1 };

// "gpipe", "1f1b", "interleaved_1f1b", "zb_h1"; errors name `key` and list the choices.
ScheduleKind parse_schedule(const std::string& text, const std::string& key = "pipeline_schedule");
const char* schedule_name(ScheduleKind kind);
// Whether `kind` runs each backward as two actions: backward (B: the input's gradient, which the previous stage
// waits for) and weight (W: the parameters' gradients, which only the update waits for).
bool splits_backward(ScheduleKind kind);

struct PipelineShape {
  int64_t stages = 1;        // p: ranks along the `stage` axis
  int64_t microbatches = 1;  // m: per step
  int64_t chunks = 1;        // v: virtual stages per rank (num_pipeline_repeats)
  int64_t virtual_stages() const { return stages * chunks; }
};

// CHECKs that `kind` can run `shape` over `layers` decoder layers of `layers_per_stage` each per chunk: errors
// name the config keys and say what would work.
void check_pipeline(ScheduleKind kind, const PipelineShape& shape, int64_t layers, int64_t layers_per_stage);

enum class Step { forward, backward, weight, send_activation, recv_activation, send_gradient, recv_gradient };
const char* step_name(Step s);

struct Action {
  Step step;
  int64_t microbatch;
  int64_t chunk;      // of the rank running it (for a send or receive: the chunk it serves on that rank)
  int64_t peer = -1;  // the other rank of a send or receive
  bool operator==(const Action&) const = default;
};

struct Schedule {
  ScheduleKind kind;
  PipelineShape shape;
  std::vector<std::vector<Action>> ranks;  // each rank's actions, in order
};

// The schedule of `kind` for `shape` (valid shapes: check_pipeline).
Schedule make_schedule(ScheduleKind kind, const PipelineShape& shape);

// Costs of one chunk's forward and backward of one microbatch (the simulator's time unit is arbitrary).
// `weight` is the part of `backward` that computes the parameters' gradients: a schedule that splits the
// backward runs backward - weight as B and weight as W.
struct Costs {
  double forward = 1;
  double backward = 2;
  double weight = 0;
};

struct Slot {
  double start, end;
  Action action;
};

struct RankTimeline {
  std::vector<Slot> compute;          // its forwards and backwards, in order, with times
  double busy = 0;                    // the sum of their durations
  int64_t peak_in_flight = 0;         // the most chunk-microbatches forwarded but not yet backwarded (stashed)
  std::vector<int64_t> in_flight;     // after each compute action
};

struct Simulation {
  std::vector<RankTimeline> ranks;
  // Per rank and action: for a send, the index of the rank's action after which the rank knows the message was
  // received (a message from the receiver, or through others, sent after that receive reached it), so that
  // waiting for the send then returns at once; the list's size where it only knows at the end. -1 for others.
  std::vector<std::vector<int64_t>> send_known_received;
  double makespan = 0;
  double bubble(size_t rank) const { return 1 - ranks[rank].busy / makespan; }  // idle / wall time
};

// Validates `s` — on each virtual stage every microbatch runs forward once and backward once, on the rank that
// owns it, backward after forward, microbatches in order on each chunk; every receive is matched by a send
// of the same microbatch and chunk — and runs it: CHECKs that every rank finishes (no deadlock), naming the
// waiting ranks and showing the grid so far. Compute takes `costs`; communication takes no time.
Simulation simulate(const Schedule& s, const Costs& costs);
// The same with each virtual stage's own costs (one entry: every stage's), e.g. under a policy per stage.
Simulation simulate(const Schedule& s, std::span<const Costs> stage_costs);

// The schedule as text: a row per rank, a column per time slot of the simulation (forward "F<mb>", backward
// "B<mb>", with ".<chunk>" when ranks run several chunks; "." idle), then each rank's peak in flight and bubble.
std::string grid(const Schedule& s, const Simulation& t);
// The same as an SVG picture: a track per rank, forwards and backwards as boxes labelled with the microbatch.
std::string svg(const Schedule& s, const Simulation& t);

}  // namespace remat::parallel
