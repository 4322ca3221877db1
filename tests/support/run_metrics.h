// A run's metrics.jsonl as the tests compare it: (step, loss, grad_norm, validation_loss or -1) of every row,
// exactly as written.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

namespace remat::testing_support {

using MetricsRow = std::tuple<int64_t, double, double, double>;

inline std::vector<MetricsRow> run_metrics(const std::filesystem::path& run) {
  std::vector<MetricsRow> rows;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    rows.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>(), j.at("grad_norm").get<double>(),
                      j.value("validation_loss", -1.0));
  }
  return rows;
}

}  // namespace remat::testing_support
