// Planning time from shapes alone: trace, differentiate under the remat policy, and plan the training
// step of Llama 2 7B and 70B (batch 1 x 4096), as `remat plan` does. Run: make bench (from the repository
// root, where configs/ is).
#include "cli/commands.h"
#include "cli/config.h"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

namespace remat {
namespace {

void PlanFromShapes(benchmark::State& state) {
  const std::string model = state.range(0) == 7 ? "llama2-7b" : "llama2-70b";
  cli::Config c = cli::load_config("configs/base.yml", {"model=" + model, "per_device_batch_size=1", "max_target_length=4096"});
  for (auto _ : state) benchmark::DoNotOptimize(cli::plan_report(c, false, "", nullptr));
  state.SetLabel(model);
}

BENCHMARK(PlanFromShapes)->Arg(7)->Arg(70)->Unit(benchmark::kMillisecond)->UseRealTime();

// Every rank of llama2-70b on 8 stages x 2 chunks (interleaved 1F1B, 8-way FSDP) for m microbatches of 8 x 4096
// tokens: the time grows linearly in m (each chunk traced and differentiated once, instantiated per action).
void PlanPipelineRanks(benchmark::State& state) {
  const int64_t m = state.range(0);
  cli::Config c = cli::load_config(
      "configs/base.yml", {"model=llama2-70b", fmt::format("per_device_batch_size={}", m / 8), "max_target_length=4096",
                           "dtype=bfloat16", "ici_pipeline_parallelism=8", "ici_fsdp_parallelism=8",
                           "pipeline_schedule=interleaved_1f1b", "num_pipeline_repeats=2",
                           fmt::format("num_pipeline_microbatches={}", m)});
  for (auto _ : state) benchmark::DoNotOptimize(cli::plan_report(c, false, "", nullptr));
  state.SetLabel(fmt::format("m = {}", m));
}

BENCHMARK(PlanPipelineRanks)->Arg(16)->Arg(32)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace remat
