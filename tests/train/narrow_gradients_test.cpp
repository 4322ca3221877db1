// The step's bf16 and f16 weight gradients reach the optimizer narrow (ir::fold_widening_converts: the norm's sums
// of squares and AdamW widen them on load). Checked against the same compiled step with every such read widened
// first by a convert of its own, the program the fold replaced: every result the same bits, and less memory.
#include "cli/config.h"
#include "compile/compile.h"
#include "exec/exec.h"
#include "plan/plan.h"
#include "support/step_args.h"

#include <gtest/gtest.h>

#include <cstring>

namespace remat {
namespace {

using namespace ir;

// g with a convert before each read that widens on load (sum_of_squares with a dtype, adamw with a narrow
// gradient), the readers then reading the wide value; `reads`: how many it widened.
Graph widened_first(const Graph& folded, int& reads) {
  Graph g = folded.clone();
  std::vector<Node> nodes;
  for (Node n : folded.nodes) {
    const bool squares = n.op == Op::sum_of_squares && n.attrs.has("dtype");
    const bool update = n.op == Op::adamw && g.type(n.inputs[3]).dtype != g.type(n.inputs[0]).dtype;
    if (squares || update) {
      const size_t q = squares ? 0 : 3;
      const DType to = squares ? n.attrs.dtype("dtype") : g.type(n.inputs[0]).dtype;
      Node convert;
      convert.op = Op::convert_element_type;
      convert.inputs = {n.inputs[q]};
      convert.outputs = {g.new_value(Type{to, g.type(n.inputs[q]).shape})};
      convert.attrs.set("dtype", to);
      n.inputs[q] = convert.outputs[0];
      if (squares) n.attrs = Attrs().set("axes", n.attrs.ints("axes"));
      nodes.push_back(std::move(convert));
      ++reads;
    }
    nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  verify(g);
  return g;
}

bool same_bits(const exec::Array& a, const exec::Array& b) {
  return a.type() == b.type() && std::memcmp(a.bytes(), b.bytes(), static_cast<size_t>(a.type().bytes())) == 0;
}

TEST(NarrowGradients, TheStepGivesTheBitsOfWideningFirstInLessMemory) {
  for (const std::vector<std::string>& overrides :
       {std::vector<std::string>{"dtype=bf16"}, std::vector<std::string>{"dtype=bf16", "mp_cast=upfront"},
        std::vector<std::string>{"dtype=bf16", "attention=flash", "remat_policy=full"},
        std::vector<std::string>{"dtype=float16"}}) {  // f16: with dynamic loss scaling
    std::vector<std::string> small = overrides;
    small.insert(small.end(), {"per_device_batch_size=2", "max_target_length=64"});
    const std::string label = fmt::format("{}", fmt::join(small, " "));
    const cli::Config c = cli::load_config("", small);
    const compile::Compiled s = compile::compile(
        {.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer, .fuse = c.run.fusion});
    int reads = 0;
    const Graph wide = widened_first(s.program, reads);
    // Every layer weight and the output layer: two reads each (the norm's sum of squares and AdamW).
    EXPECT_GE(reads, 2 * 8) << label;
    std::vector<exec::Array> args = testing_support::step_args(s, c.run.model);
    for (size_t i = 0; i < args.size(); ++i)
      if (s.signature.args[i].name == "loss_scale") args[i].set(0, 1024);  // a step taken (zero: every gradient inf)
    const std::vector<exec::Array> narrow_out = exec::run(s.program, args);
    const std::vector<exec::Array> wide_out = exec::run(wide, args);
    ASSERT_EQ(narrow_out.size(), wide_out.size());
    for (size_t i = 0; i < narrow_out.size(); ++i)
      EXPECT_TRUE(same_bits(narrow_out[i], wide_out[i])) << label << ": result " << s.signature.results[i].name;
    const plan::Plan wide_plan = plan::build(wide, {.workspace = exec::workspace_of(exec::cpu())});
    EXPECT_LT(s.plan.lower_bound[0], wide_plan.lower_bound[0]) << label;
  }
}

}  // namespace
}  // namespace remat
