// Golden tests of grad, the XLA way: each tests/autodiff/golden/*.ir file holds an input graph, a RUN line
// (`grad wrt=%a,%b`) and CHECK lines against the printed result. Set REMAT_PRINT_GOLDEN=1 to print outputs.
#include "autodiff/autodiff.h"
#include "support/filecheck.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

namespace remat {
namespace {

namespace fs = std::filesystem;
using testing_support::filecheck;

std::vector<std::string> golden_files() { return testing_support::golden_files("autodiff/golden", ".ir"); }

std::vector<int> wrt_indices(const ir::Graph& g, const std::string& run, const std::string& file) {
  const std::string prefix = "grad wrt=";
  EXPECT_EQ(run.rfind(prefix, 0), 0u) << file << ": RUN line must be 'grad wrt=%a,%b', got '" << run << "'";
  std::vector<int> wrt;
  std::string list = run.substr(prefix.size());
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find(',', start);
    std::string name = list.substr(start + 1, (end == std::string::npos ? list.size() : end) - start - 1);
    auto it = std::find(g.param_names.begin(), g.param_names.end(), name);
    EXPECT_NE(it, g.param_names.end()) << file << ": no param %" << name;
    wrt.push_back(static_cast<int>(it - g.param_names.begin()));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return wrt;
}

class GradGolden : public testing::TestWithParam<std::string> {};

TEST_P(GradGolden, MatchesCheckLines) {
  std::string text = testing_support::read_file(GetParam());
  ir::Graph f = ir::parse(text, GetParam());
  ir::Graph g = autodiff::grad_graph(f, wrt_indices(f, testing_support::run_line(text), GetParam()));
  ir::verify(g);
  std::string out = ir::print(g);
  if (std::getenv("REMAT_PRINT_GOLDEN")) std::cout << out;
  EXPECT_EQ(filecheck(text, out), "") << GetParam();
  EXPECT_EQ(ir::print(ir::parse(out)), out) << "the result does not round-trip";
}

INSTANTIATE_TEST_SUITE_P(Files, GradGolden, testing::ValuesIn(golden_files()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return fs::path(info.param).stem().string();
                         });

TEST(GradGolden, CoversTheRequiredGraphs) {
  std::vector<std::string> stems;
  for (const std::string& f : golden_files()) stems.push_back(fs::path(f).stem().string());
  for (const char* need : {"mlp", "dot_batch_dims", "scan_3_layers", "gather_scatter"})
    EXPECT_NE(std::find(stems.begin(), stems.end(), need), stems.end()) << "missing golden file " << need << ".ir";
}

}  // namespace
}  // namespace remat
