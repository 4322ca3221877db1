// `remat plot RUN_DIR... [output_path=FILE.svg]`: the loss, learning-rate and tokens/s curves of several runs
// overlaid in one SVG (trainer/curves.h), from each run folder's metrics.jsonl.
#include "cli/commands.h"

#include "train/checkpoint.h"
#include "trainer/curves.h"

#include <fmt/format.h>

namespace remat::cli {

int run_plot(const std::vector<std::string>& args) {
  std::string output = "plot.svg";
  std::vector<trainer::Curves> runs;
  for (const std::string& a : args) {
    if (a.starts_with("output_path=")) output = a.substr(12);
    else runs.push_back(trainer::read_curves(a));
  }
  CHECK(!runs.empty(), "remat plot needs run folders (base_output_directory/run_name), e.g. remat plot runs/tiny");
  train::write_text(output, trainer::curves_svg(runs));
  std::vector<std::string> names;
  for (const trainer::Curves& c : runs) names.push_back(c.name);
  fmt::print("wrote {}: {}\n", output, fmt::join(names, ", "));
  return 0;
}

}  // namespace remat::cli
