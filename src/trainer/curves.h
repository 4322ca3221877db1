// A run's curves: training and validation loss, learning rate and tokens/s against the step, read from the
// metrics.jsonl the trainer writes (a row per update; validation_loss on evaluation rows, tokens_per_s on progress
// rows), drawn as one SVG of three panels over a shared step axis. Several runs overlay in one picture, a colour
// each; training loss is a solid line, validation loss dashed with a dot per evaluation.
//
//   trainer::Curves c = trainer::read_curves("runs/tiny");            // runs/tiny/metrics.jsonl
//   std::string svg = trainer::curves_svg({c, trainer::read_curves("runs/other")});
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace remat::trainer {

struct Point {
  double step, value;
};

struct Curves {
  std::string name;  // the run's folder name
  std::vector<Point> loss, validation_loss, lr, tokens_per_s;
};

// The curves in run_dir/metrics.jsonl; a missing file or a row that is not remat's is an error naming the file
// (and the line).
Curves read_curves(const std::filesystem::path& run_dir);

// The picture of `runs` (at least one). Series of more than kMaxPoints points are drawn from every k-th point
// (and the last), so that a long run's picture stays small.
inline constexpr size_t kMaxPoints = 2000;
std::string curves_svg(const std::vector<Curves>& runs);

// Writes run_dir/curves.svg from run_dir/metrics.jsonl (the trainer calls it at each evaluation).
void write_curves(const std::filesystem::path& run_dir);

}  // namespace remat::trainer
