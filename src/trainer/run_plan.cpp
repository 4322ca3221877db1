#include "trainer/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>

namespace remat::trainer {

RunPlan plan_run(const RunConfig& c, int64_t ranks) {
  RunPlan plan{.replicas = {}, .pipeline = std::nullopt, .shape = c.shape};
  // A pipeline's stages are the outer mesh axis; the data and fsdp axes (the replicas) fill the ranks left.
  const int64_t stages = c.ici_pipeline_parallelism;
  if (stages > 1) {
    plan.pipeline = pipeline_schedule(c);
    const size_t policies = c.model.stage_remat_policies.size();
    const int64_t K = plan.pipeline->shape.virtual_stages();
    CHECK(policies == 0 || policies == static_cast<size_t>(stages) || policies == static_cast<size_t>(K),
          "config key 'pipeline_stage_remat_policies' has {} entries: give one per rank ({}) or one per virtual stage "
          "({} = {} ranks x {} chunks)", policies, stages, K, stages, plan.pipeline->shape.chunks);
    CHECK(ranks % stages == 0,
          "ici_pipeline_parallelism={} needs a multiple of {} ranks, but {} {} launched: start `mpirun -np {} remat "
          "train ...`", stages, stages, ranks, ranks == 1 ? "process was" : "processes were", stages);
  }
  plan.replicas = mesh_of(c, ranks / stages);
  plan.sequence_parallel = c.ici_tensor_sequence_parallelism * c.dcn_tensor_sequence_parallelism > 1;
  if (plan.pipeline) plan.shape = pipeline_step_shape(c, *plan.pipeline);
  return plan;
}

nn::Mesh mesh_of(const RunConfig& c, int64_t ranks) {
  struct Key {
    const char* name;
    int64_t value;
  };
  std::array<Key, 4> keys = {{{"ici_data_parallelism", c.ici_data_parallelism},
                              {"dcn_data_parallelism", c.dcn_data_parallelism},
                              {"ici_fsdp_parallelism", c.ici_fsdp_parallelism},
                              {"dcn_fsdp_parallelism", c.dcn_fsdp_parallelism}}};
  // The tensor axis: MaxText's tensor and tensor_sequence keys, which split the same weights (the latter the
  // sequence too); one of the two kinds at a time, never filled.
  const std::array<Key, 4> tensor_keys = {{{"ici_tensor_parallelism", c.ici_tensor_parallelism},
                                           {"dcn_tensor_parallelism", c.dcn_tensor_parallelism},
                                           {"ici_tensor_sequence_parallelism", c.ici_tensor_sequence_parallelism},
                                           {"dcn_tensor_sequence_parallelism", c.dcn_tensor_sequence_parallelism}}};
  int64_t tensor = 1;
  for (const Key& k : tensor_keys) {
    CHECK(k.value >= 1, "config key '{}' must be >= 1 (the tensor axis is never filled with the ranks left), got {}",
          k.name, k.value);
    tensor *= k.value;
  }
  CHECK(tensor_keys[0].value * tensor_keys[1].value == 1 || tensor_keys[2].value * tensor_keys[3].value == 1,
        "ici/dcn_tensor_parallelism and ici/dcn_tensor_sequence_parallelism are both > 1: they split the same weights "
        "(the latter the sequence as well); use one of them");
  CHECK(ranks == 0 || ranks % tensor == 0, "tensor parallelism of {} needs a multiple of {} ranks, but {} {} launched",
        tensor, tensor, ranks, ranks == 1 ? "process was" : "processes were");
  if (ranks > 0) ranks /= tensor;
  int64_t given = 1;
  Key* fill = nullptr;
  for (Key& k : keys) {
    CHECK(k.value == -1 || k.value >= 1, "config key '{}' must be >= 1 or -1 (fill with the ranks left), got {}", k.name,
          k.value);
    if (k.value >= 1) {
      given *= k.value;
      continue;
    }
    CHECK(fill == nullptr, "config keys '{}' and '{}' are both -1: at most one parallelism key may fill with the ranks left",
          fill ? fill->name : "", k.name);
    fill = &k;
  }
  const auto shown = [&] {
    std::vector<std::string> s;
    for (const Key& k : keys)
      if (k.value > 1) s.push_back(fmt::format("{}={}", k.name, k.value));
    return s.empty() ? std::string("one device") : fmt::format("{}", fmt::join(s, " "));
  };
  if (fill != nullptr) {
    CHECK(ranks == 0 || ranks % given == 0,
          "{} needs a multiple of {} ranks, but {} {} launched: start `mpirun -np {} remat train ...`", shown(), given,
          ranks, ranks == 1 ? "process was" : "processes were", given);
    fill->value = ranks == 0 ? 1 : ranks / given;
  }
  return {{{"data", keys[0].value * keys[1].value}, {"fsdp", keys[2].value * keys[3].value}, {"tensor", tensor}}};
}

nn::ModelConfig device_model(const RunConfig& c, const RunPlan& plan) {
  nn::ModelConfig m = c.model;
  m.mesh = plan.replicas;
  m.sequence_parallel = plan.sequence_parallel;
  return m;
}

std::string mesh_text(const RunPlan& plan) {
  std::vector<std::string> parts;
  for (const auto& [axis, n] : plan.replicas.axes) {
    if (n == 1) continue;
    const char* kind = axis == "data" ? "data-parallel" : axis == "fsdp" ? "FSDP" : "tensor-parallel";
    parts.push_back(fmt::format("{} {}", n, kind));
  }
  if (parts.empty()) return "one device";
  return fmt::format("{}{}", fmt::join(parts, " x "), plan.sequence_parallel ? " (sequence-parallel)" : "");
}

parallel::Schedule pipeline_schedule(const RunConfig& c) {
  const parallel::ScheduleKind kind = parallel::parse_schedule(c.pipeline_schedule);
  const int64_t p = c.ici_pipeline_parallelism, L = c.model.num_decoder_layers, repeats = c.num_pipeline_repeats;
  // Derived (-1): a stage's share of the layers over its repeats where they are given, else all of them in one
  // chunk (gpipe, 1f1b) or MaxText's one layer per repeat (interleaved_1f1b).
  const int64_t per = c.num_layers_per_pipeline_stage != -1              ? c.num_layers_per_pipeline_stage
                      : repeats != -1                                    ? L / (p * repeats)
                      : kind == parallel::ScheduleKind::interleaved_1f1b ? 1
                                                                         : L / p;
  CHECK(p >= 1 && per >= 1,
        "ici_pipeline_parallelism ({}) and num_layers_per_pipeline_stage ({}) must be >= 1: {} layers do not fill {} "
        "stages{}", p, per, L, p, repeats != -1 ? fmt::format(" of num_pipeline_repeats={} chunks", repeats) : "");
  const parallel::PipelineShape shape{
      p, c.num_pipeline_microbatches == -1 ? p : c.num_pipeline_microbatches,
      repeats == -1 ? std::max<int64_t>(1, L / (p * per)) : repeats};
  parallel::check_pipeline(kind, shape, L, per);
  const int64_t group = c.model.layers_per_group;
  CHECK(group == 0 || per % group == 0,
        "layers_per_group={} does not divide num_layers_per_pipeline_stage={}: a stage's layers run as whole groups; "
        "make the groups divide a stage's layers", group, per);
  return parallel::make_schedule(kind, shape);
}

train::StepShape pipeline_step_shape(const RunConfig& c, const parallel::Schedule& schedule) {
  const int64_t stages = schedule.shape.stages, m = schedule.shape.microbatches, replica_batch = c.shape.batch * stages;
  CHECK(c.shape.accumulation == 1,
        "gradient_accumulation_steps={} with a pipeline: the pipeline's microbatches accumulate the gradients; set "
        "num_pipeline_microbatches instead (now {}) and gradient_accumulation_steps=1",
        c.shape.accumulation, m);
  CHECK(replica_batch % m == 0,
        "per_device_batch_size={} x ici_pipeline_parallelism={} = {} sequences per pipeline do not split into "
        "num_pipeline_microbatches={} equal microbatches: make the product a multiple of {}",
        c.shape.batch, stages, replica_batch, m, m);
  return {replica_batch / m, c.shape.seq, m};
}

}  // namespace remat::trainer
