// One training step's timeline as a Chrome trace (chrome://tracing, Perfetto): a track per rank holding its
// kernel calls (op, scope) and, under a pipeline, the actions of its schedule — forward "F3" and backward
// "B3" of a microbatch (".1": chunk 1), sends and receives — each spanning the kernel calls of the ops it
// traced (train::ActionSpan; a recomputed op counts with its microbatch's backward). Internal to trainer/.
#pragma once

#include "exec/exec.h"
#include "train/step.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace remat::trainer {

struct RankTrace {
  nlohmann::json events = nlohmann::json::array();  // times in microseconds from `start`
  double start = 0;  // seconds of the steady clock (one clock for the processes of a host)
  double wall = 0;  // seconds, the step on this rank
  double busy = 0;  // seconds in forwards and backwards (without a pipeline: in kernels)
  double first = 0, last = 0;  // under a pipeline: when its first forward started and its last backward ended
};

// The idle fraction of each rank: under a pipeline, of the pipeline's span (the earliest forward's start to
// the latest backward's end over the ranks: the optimizer after it is not the schedule's), else of its step.
std::vector<double> bubbles(const std::vector<RankTrace>& ranks);

// The events of rank `rank`'s step from its profile's kernel calls (Profile::record), in microseconds from
// `start`; the step ran from `start` to `end` (seconds of the steady clock).
RankTrace rank_trace(const exec::Profile& profile, const std::vector<train::ActionSpan>& actions, int64_t rank,
                     double start, double end);

// The Chrome trace file of every rank's events, on one time axis from the earliest start: {"traceEvents": [...]},
// with a name per track ("rank 2 (idle 27.1%)").
nlohmann::json chrome_trace(const std::vector<RankTrace>& ranks);

// RankTrace to and from JSON (each rank writes its own; rank 0 merges them).
nlohmann::json to_json(const RankTrace& t);
RankTrace rank_trace_from(const nlohmann::json& j);

}  // namespace remat::trainer
