// Planning time from shapes alone: trace, differentiate under the remat policy, and plan the training
// step of Llama 2 7B and 70B (batch 1 x 4096), as `remat plan` does. Run: make bench (from the repository
// root, where configs/ is).
#include "cli/commands.h"
#include "cli/config.h"

#include <benchmark/benchmark.h>

namespace remat {
namespace {

void PlanFromShapes(benchmark::State& state) {
  const std::string model = state.range(0) == 7 ? "llama2-7b" : "llama2-70b";
  cli::Config c = cli::load_config("configs/base.yml", {"model=" + model, "per_device_batch_size=1", "max_target_length=4096"});
  for (auto _ : state) benchmark::DoNotOptimize(cli::plan_report(c, false, "", nullptr));
  state.SetLabel(model);
}

BENCHMARK(PlanFromShapes)->Arg(7)->Arg(70)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace remat
