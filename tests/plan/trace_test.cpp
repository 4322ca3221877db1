// Golden tests of the planner's alloc/free event trace: each tests/plan/golden/*.ir file holds a graph,
// a RUN line (`plan grad wrt=%a,%b`: differentiate, then plan) and CHECK lines against plan::trace.
// Set REMAT_PRINT_GOLDEN=1 to print the trace.
#include "autodiff/autodiff.h"
#include "plan/plan.h"
#include "support/filecheck.h"

#include <gtest/gtest.h>

#include <iostream>

namespace remat {
namespace {


TEST(PlanTrace, MatchesGoldenFiles) {
  int files = 0;
  for (const std::string& path : testing_support::golden_files("plan/golden", ".ir")) {
    ++files;
    std::string text = testing_support::read_file(path);
    std::string run = testing_support::run_line(text);
    ASSERT_EQ(run.rfind("plan grad wrt=", 0), 0u) << path << ": RUN line must be 'plan grad wrt=%a,...'";
    ir::Graph f = ir::parse(text, path);
    std::vector<int> wrt;
    for (size_t i = 0; i < f.param_names.size(); ++i)
      if (run.find("%" + f.param_names[i] + ",") != std::string::npos || run.ends_with("%" + f.param_names[i]))
        wrt.push_back(static_cast<int>(i));
    ir::Graph g = autodiff::grad_graph(f, wrt);
    std::string out = plan::trace(plan::build(g), g);
    if (std::getenv("REMAT_PRINT_GOLDEN")) std::cout << ir::print(g) << out;
    EXPECT_EQ(testing_support::filecheck(text, out), "") << path;
  }
  EXPECT_GE(files, 1);
}

}  // namespace
}  // namespace remat
