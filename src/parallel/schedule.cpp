// The schedule generators: each rank's order of forwards and backwards over (microbatch, chunk), then the sends
// and receives each needs around it.
#include "parallel/parallel.h"

#include "base/check.h"

#include <fmt/format.h>

namespace remat::parallel {

ScheduleKind parse_schedule(const std::string& text, const std::string& key) {
  if (text == "gpipe") return ScheduleKind::gpipe;
  if (text == "1f1b") return ScheduleKind::one_f_one_b;
  if (text == "interleaved_1f1b") return ScheduleKind::interleaved_1f1b;
  if (text == "zb_h1") return ScheduleKind::zb_h1;
  CHECK(false, "config key '{}': unknown schedule '{}'; choose gpipe, 1f1b, interleaved_1f1b or zb_h1", key, text);
  __builtin_unreachable();
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved_1f1b: return "interleaved_1f1b";
    case ScheduleKind::zb_h1: return "zb_h1";
  }
  return "";
}

bool splits_backward(ScheduleKind kind) { return kind == ScheduleKind::zb_h1; }

const char* step_name(Step s) {
  switch (s) {
    case Step::forward: return "forward";
    case Step::backward: return "backward";
    case Step::weight: return "weight";
    case Step::send_activation: return "send_activation";
    case Step::recv_activation: return "recv_activation";
    case Step::send_gradient: return "send_gradient";
    case Step::recv_gradient: return "recv_gradient";
  }
  return "";
}

void check_pipeline(ScheduleKind kind, const PipelineShape& s, int64_t layers, int64_t layers_per_stage) {
  const int64_t p = s.stages, m = s.microbatches, v = s.chunks;
  CHECK(p >= 1 && m >= 1 && v >= 1 && layers_per_stage >= 1,
        "ici_pipeline_parallelism ({}), num_pipeline_microbatches ({}), num_pipeline_repeats ({}) and "
        "num_layers_per_pipeline_stage ({}) must be positive",
        p, m, v, layers_per_stage);
  CHECK(p * v * layers_per_stage == layers,
        "base_num_decoder_layers ({}) must equal ici_pipeline_parallelism ({}) x num_pipeline_repeats ({}) x "
        "num_layers_per_pipeline_stage ({}) = {}; with {} stages of {} layer(s) per repeat, num_pipeline_repeats={} "
        "would{}",
        layers, p, v, layers_per_stage, p * v * layers_per_stage, p, layers_per_stage, layers / (p * layers_per_stage),
        layers % (p * layers_per_stage) == 0 ? " fit" : " not fit either: choose a stage count and layers per stage "
                                                         "whose product divides the layers");
  if (kind == ScheduleKind::one_f_one_b || kind == ScheduleKind::zb_h1) {
    CHECK(v == 1, "pipeline_schedule={} runs one chunk per rank, but num_pipeline_repeats is {}: use "
                  "pipeline_schedule=interleaved_1f1b for {} chunks per rank", schedule_name(kind), v, v);
    CHECK(m >= p, "pipeline_schedule={} needs num_pipeline_microbatches ({}) >= ici_pipeline_parallelism ({}): "
                  "set it to {} or more, or use gpipe", schedule_name(kind), m, p, p);
  }
  if (kind == ScheduleKind::interleaved_1f1b)
    CHECK(v >= 2, "pipeline_schedule=interleaved_1f1b needs num_pipeline_repeats >= 2 chunks per rank, got {}: "
                  "halve num_layers_per_pipeline_stage, or use pipeline_schedule=1f1b", v);
  const int64_t below = m / p * p, above = below + p;
  CHECK(v == 1 || m % p == 0,
        "{} chunks per rank need num_pipeline_microbatches ({}) to be a multiple of ici_pipeline_parallelism ({}): "
        "{} would do", v, m, p, below == 0 ? fmt::format("{}", above) : fmt::format("{} or {}", below, above));
}

namespace {

// The i-th forward (or backward) of a rank running m microbatches through v chunks: groups of p microbatches
// go through chunk 0, 1, ... v-1 in turn (Megatron's interleaved order; with v = 1, microbatch i); backwards
// take the chunks in reverse.
Action nth(const PipelineShape& s, int64_t i, bool backward) {
  const int64_t p = s.stages, v = s.chunks;
  if (v == 1) return {backward ? Step::backward : Step::forward, i, 0};
  const int64_t group = i / (p * v), within = i % (p * v);
  const int64_t chunk = backward ? v - 1 - within / p : within / p;
  return {backward ? Step::backward : Step::forward, group * p + within % p, chunk};
}

// The compute order of rank r: `warmup` forwards, then a forward and a backward in turn, then the backwards.
std::vector<Action> compute_order(const PipelineShape& s, int64_t warmup) {
  const int64_t n = s.microbatches * s.chunks;
  std::vector<Action> order;
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back(nth(s, f, false));
  for (; f < n; ++f, ++b) {
    order.push_back(nth(s, f, false));
    order.push_back(nth(s, b, true));
  }
  for (; b < n; ++b) order.push_back(nth(s, b, true));
  return order;
}

// ZB-H1's order on rank r: 1F1B's forwards and backwards (B), each B of microbatch k followed by the W of
// microbatch k - r, the W's left after the last B in order. Deferring r W's lets the later ranks run their B's
// sooner, so the gradients reach rank 0 without waiting for W's: each rank idles (p-1)(T_F + T_B - T_W) where
// 1F1B idles (p-1)(T_F + T_B + T_W), with 1F1B's forwards in flight (a pending W keeps only what W reads).
std::vector<Action> with_deferred_weights(const std::vector<Action>& compute, int64_t rank, int64_t m) {
  std::vector<Action> out;
  int64_t w = 0;
  for (const Action& a : compute) {
    out.push_back(a);
    if (a.step == Step::backward && a.microbatch - rank >= 0) out.push_back({Step::weight, w++, a.chunk});
  }
  for (; w < m; ++w) out.push_back({Step::weight, w, 0});
  return out;
}

// The compute actions with their communication: a forward on virtual stage k receives its input from stage
// k - 1 and sends its output to k + 1; a backward receives its output's gradient from k + 1 and sends its
// input's gradient to k - 1.
std::vector<Action> with_communication(const PipelineShape& s, int64_t rank, const std::vector<Action>& compute) {
  const int64_t p = s.stages, last = s.virtual_stages() - 1;
  std::vector<Action> out;
  for (const Action& a : compute) {
    if (a.step == Step::weight) {  // no messages: the previous stage waits only for B
      out.push_back(a);
      continue;
    }
    const int64_t k = a.chunk * p + rank;
    const bool forward = a.step == Step::forward;
    const int64_t from = forward ? k - 1 : k + 1, to = forward ? k + 1 : k - 1;
    if (from >= 0 && from <= last)
      out.push_back({forward ? Step::recv_activation : Step::recv_gradient, a.microbatch, a.chunk, from % p});
    out.push_back(a);
    if (to >= 0 && to <= last)
      out.push_back({forward ? Step::send_activation : Step::send_gradient, a.microbatch, a.chunk, to % p});
  }
  return out;
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, const PipelineShape& shape) {
  Schedule s{kind, shape, {}};
  const int64_t p = shape.stages, n = shape.microbatches * shape.chunks;
  for (int64_t r = 0; r < p; ++r) {
    // Forwards before the first backward: all of them (GPipe); enough to fill the pipeline behind this rank
    // (1F1B: p - r - 1, so rank r holds at most p - r microbatches); Megatron's interleaved warm-up.
    const int64_t warmup = kind == ScheduleKind::gpipe              ? n
                           : kind == ScheduleKind::interleaved_1f1b ? std::min((p - r - 1) * 2 + (shape.chunks - 1) * p, n)
                                                                    : std::min(p - r - 1, n);  // 1f1b, zb_h1
    std::vector<Action> compute = compute_order(shape, warmup);
    if (splits_backward(kind)) compute = with_deferred_weights(compute, r, shape.microbatches);
    s.ranks.push_back(with_communication(shape, r, compute));
  }
  return s;
}

}  // namespace remat::parallel
