// The loss curves (trainer/curves.h) read back from the picture: each polyline's points, mapped to values through
// the axis the picture's own tick labels define (their text and position), are the rows of metrics.jsonl. A run
// keeps runs/NAME/curves.svg, and `remat plot` overlays runs, a polyline per run and series.
#include "support/command.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "trainer/curves.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

namespace remat {
namespace {

namespace fs = std::filesystem;

std::string text_of(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A linear axis from tick labels: (pixel, value) pairs, the first and the last define it.
struct Axis {
  std::vector<std::pair<double, double>> ticks;
  double value(double pixel) const {
    const auto& [p0, v0] = ticks.front();
    const auto& [p1, v1] = ticks.back();
    return v0 + (pixel - p0) * (v1 - v0) / (p1 - p0);
  }
  double per_pixel() const { return std::abs((ticks.back().second - ticks.front().second) / (ticks.back().first - ticks.front().first)); }
};

Axis ticks_of(const std::string& svg, const std::string& cls, const char* coordinate) {
  Axis a;
  const std::regex tick(fmt::format("<text class=\"{}\"[^>]* {}=\"([-0-9.]+)\"[^>]*>([^<]+)</text>", cls, coordinate));
  for (std::sregex_iterator it(svg.begin(), svg.end(), tick), end; it != end; ++it)
    a.ticks.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]));
  return a;
}

// The group of the picture that draws `panel`.
std::string group_of(const std::string& svg, const std::string& panel) {
  const size_t begin = svg.find(fmt::format("<g class=\"panel\" data-panel=\"{}\">", panel));
  EXPECT_NE(begin, std::string::npos) << panel;
  return begin == std::string::npos ? "" : svg.substr(begin, svg.find("</g>", begin) - begin);
}

// The values a panel's polyline of `series` for `run` draws, read back through the picture's axes.
std::vector<std::pair<double, double>> drawn(const std::string& svg, const std::string& panel, const std::string& series,
                                             const std::string& run) {
  const std::string group = group_of(svg, panel);
  const Axis x = ticks_of(svg, "xtick", "x"), y = ticks_of(group, "ytick", "y");
  EXPECT_GE(x.ticks.size(), 2u);
  EXPECT_GE(y.ticks.size(), 2u) << panel;
  // Found by hand, not by std::regex: its matcher recurses once per character of a long points list, which
  // overflows the stack under AddressSanitizer.
  const std::string opening = fmt::format("<polyline class=\"{}\" data-run=\"{}\" points=\"", series, run);
  const size_t at = group.find(opening);
  EXPECT_NE(at, std::string::npos) << series << " of " << run << " in " << panel;
  const size_t from = at == std::string::npos ? group.size() : at + opening.size();
  std::vector<std::pair<double, double>> out;
  std::istringstream points(group.substr(from, group.find('"', from) - from));
  for (std::string p; points >> p;) {
    const size_t comma = p.find(',');
    out.emplace_back(x.value(std::stod(p.substr(0, comma))), y.value(std::stod(p.substr(comma + 1))));
  }
  return out;
}

// metrics.jsonl's rows with `key`, as (step, value).
std::vector<std::pair<double, double>> rows(const fs::path& run, const std::string& key) {
  std::vector<std::pair<double, double>> out;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains(key)) out.emplace_back(row["step"].get<double>(), row[key].get<double>());
  }
  return out;
}

// Each drawn point is its row, within what the picture's pixel coordinates (0.1 px) can tell.
void expect_drawn_as_rows(const std::string& svg, const fs::path& run, const std::string& panel, const std::string& key) {
  const std::vector<std::pair<double, double>> want = rows(run, key), got = drawn(svg, panel, key, run.filename().string());
  ASSERT_EQ(got.size(), want.size()) << key;
  ASSERT_FALSE(want.empty()) << key;
  const Axis x = ticks_of(svg, "xtick", "x"), y = ticks_of(group_of(svg, panel), "ytick", "y");
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i].first, want[i].first, 0.1 * x.per_pixel()) << key << " point " << i;
    EXPECT_NEAR(got[i].second, want[i].second, 0.1 * y.per_pixel()) << key << " point " << i;
  }
}

void write_metrics(const fs::path& run, int steps, double scale) {
  fs::create_directories(run);
  std::ofstream out(run / "metrics.jsonl");
  for (int s = 1; s <= steps; ++s) {
    nlohmann::json row = {{"step", s}, {"loss", scale * (2 + 3 * std::exp(-s / 10.0))}, {"lr", 1e-3 * std::min(1.0, s / 5.0)}};
    if (s % 5 == 0) row["tokens_per_s"] = 1000 + 37 * s;
    if (s % 10 == 0) row["validation_loss"] = scale * (2.2 + 3 * std::exp(-s / 10.0));
    out << row.dump() << "\n";
  }
}

TEST(Curves, EveryPolylineReadsBackAsItsMetricsRowsForEachOverlaidRun) {
  testing_support::TempDir temp;
  write_metrics(temp.path / "first", 50, 1);
  write_metrics(temp.path / "second", 30, 1.5);
  const std::string svg = trainer::curves_svg({trainer::read_curves(temp.path / "first"), trainer::read_curves(temp.path / "second/")});
  for (const char* run : {"first", "second"}) {
    expect_drawn_as_rows(svg, temp.path / run, "loss", "loss");
    expect_drawn_as_rows(svg, temp.path / run, "loss", "validation_loss");
    expect_drawn_as_rows(svg, temp.path / run, "lr", "lr");
    expect_drawn_as_rows(svg, temp.path / run, "tokens_per_s", "tokens_per_s");
  }
  for (const char* label : {">step</text>", ">loss (nats per token)</text>", ">learning rate</text>", ">tokens/s</text>",
                            ">first</text>", ">second</text>", ">validation loss</text>"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
}

TEST(Curves, ALongRunIsDrawnFromAtMostTheLimitOfPointsKeepingTheLast) {
  testing_support::TempDir temp;
  write_metrics(temp.path / "long", 5001, 1);
  const std::string svg = trainer::curves_svg({trainer::read_curves(temp.path / "long")});
  const std::vector<std::pair<double, double>> got = drawn(svg, "loss", "loss", "long");
  EXPECT_LE(got.size(), trainer::kMaxPoints + 1);
  EXPECT_GE(got.size(), trainer::kMaxPoints / 2);
  // The step axis spans 5001 steps over 680 px: 0.1 px is under a step, so the first and last step read back.
  EXPECT_NEAR(got.front().first, 1, 1);
  EXPECT_NEAR(got.back().first, 5001, 1);
}

TEST(Curves, AMissingFileOrAForeignRowIsNamed) {
  testing_support::TempDir temp;
  EXPECT_NE(testing_support::error_of([&] { trainer::read_curves(temp.path); }).find("metrics.jsonl"), std::string::npos);
  std::ofstream(temp.path / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\nnot json\n";
  EXPECT_NE(testing_support::error_of([&] { trainer::read_curves(temp.path); }).find("line 2 is not a row remat wrote"),
            std::string::npos);
}

// A training run keeps curves.svg beside metrics.jsonl; `remat plot` overlays two runs in one file.
TEST(Curves, ARunKeepsItsCurvesAndPlotOverlaysRuns) {
  testing_support::TempDir temp;
  const std::string train = fmt::format("cd '{}' && '{}' train steps=6 eval_interval=3 eval_steps=1 log_period=2 "
                                        "per_device_batch_size=2 max_target_length=16 sample_length=1 base_emb_dim=32 "
                                        "base_num_decoder_layers=1 base_mlp_dim=64 head_dim=8",
                                        temp.path.string(), REMAT_BINARY);
  ASSERT_EQ(testing_support::run_command(train + " run_name=a > /dev/null").status, 0);
  ASSERT_EQ(testing_support::run_command(train + " run_name=b learning_rate=1e-2 > /dev/null").status, 0);
  const fs::path a = temp.path / "runs" / "a";
  const std::string svg = text_of(a / "curves.svg");
  expect_drawn_as_rows(svg, a, "loss", "loss");
  expect_drawn_as_rows(svg, a, "loss", "validation_loss");
  const testing_support::Output plot = testing_support::run_command(
      fmt::format("cd '{}' && '{}' plot runs/a runs/b output_path=both.svg", temp.path.string(), REMAT_BINARY));
  ASSERT_EQ(plot.status, 0) << plot.text;
  const std::string both = text_of(temp.path / "both.svg");
  expect_drawn_as_rows(both, a, "lr", "lr");
  expect_drawn_as_rows(both, temp.path / "runs" / "b", "lr", "lr");
}

}  // namespace
}  // namespace remat
