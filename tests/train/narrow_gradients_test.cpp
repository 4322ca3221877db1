// The step's bf16 and f16 weight gradients reach the optimizer narrow (ir::fold_widening_converts: the norm's sums
// of squares and AdamW widen them on load). Checked against the same compiled step with each such value widened by
// a convert where it is made, as before the fold: every result the same bits, and a lower planned peak. (Which
// converts the fold may drop is tests/ir/fold_widening_test.cpp's.)
#include "cli/config.h"
#include "compile/compile.h"
#include "exec/exec.h"
#include "plan/plan.h"
#include "support/step_args.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

namespace remat {
namespace {

using namespace ir;

// The program the fold replaced: each value read narrow by sum_of_squares (with a dtype) or adamw (a gradient
// narrower than its parameter) widened by a convert right after it is made, the readers reading the wide copy, which
// lives from there to AdamW as the f32 gradients did; `reads`: how many reads it widened, `stacks`: how many of the
// narrow values are a scan's outputs (the backward scan's weight gradients).
Graph widened_first(const Graph& folded, int& reads, int& stacks) {
  Graph g = folded.clone();
  std::map<ValueId, ValueId> wide;  // a narrow value -> its widened copy
  for (Node& n : g.nodes) {
    const bool squares = n.op == Op::sum_of_squares && n.attrs.has("dtype");
    const bool update = n.op == Op::adamw && g.type(n.inputs[3]).dtype != g.type(n.inputs[0]).dtype;
    if (!squares && !update) continue;
    const size_t q = squares ? 0 : 3;
    const ValueId v = n.inputs[q];
    if (!wide.contains(v))
      wide[v] = g.new_value(Type{squares ? n.attrs.dtype("dtype") : g.type(n.inputs[0]).dtype, g.type(v).shape});
    n.inputs[q] = wide[v];
    if (squares) n.attrs = Attrs().set("axes", n.attrs.ints("axes"));
    ++reads;
  }
  std::vector<Node> nodes;
  auto widen = [&](ValueId v) {
    Node convert;
    convert.op = Op::convert_element_type;
    convert.inputs = {v};
    convert.outputs = {wide.at(v)};
    convert.attrs.set("dtype", g.type(wide.at(v)).dtype);
    nodes.push_back(std::move(convert));
  };
  for (ValueId p : g.params)
    if (wide.contains(p)) widen(p);
  for (Node& n : g.nodes) {
    const std::vector<ValueId> made = n.outputs;
    const bool scan = n.op == Op::scan;
    nodes.push_back(std::move(n));
    for (ValueId v : made)
      if (wide.contains(v)) {
        stacks += scan;
        widen(v);
      }
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
    int reads = 0, stacks = 0;
    const Graph wide = widened_first(s.program, reads, stacks);
    // Every layer weight (stacked by the backward scan) and the output layer: two reads each
    // (the norm's sum of squares and AdamW).
    EXPECT_GE(reads, 2 * 8) << label;
    EXPECT_GE(stacks, 7) << label;
    std::vector<exec::Array> args = testing_support::step_args(s, c.run.model);
    for (size_t i = 0; i < args.size(); ++i)
      if (s.signature.args[i].name == "loss_scale") args[i].set(0, 1024);  // a step taken (zero: every gradient inf)
    const std::vector<exec::Array> narrow_out = exec::run(s.program, args);
    const std::vector<exec::Array> wide_out = exec::run(wide, args);
    ASSERT_EQ(narrow_out.size(), wide_out.size());
    for (size_t i = 0; i < narrow_out.size(); ++i)
      EXPECT_TRUE(same_bits(narrow_out[i], wide_out[i])) << label << ": result " << s.signature.results[i].name;
    // Planned as compile() plans (updates written over their arguments), the f32 copies raise the peak.
    const plan::Options options{.donate = s.signature.updates(), .workspace = exec::workspace_of(exec::cpu())};
    EXPECT_LT(plan::build(s.program, options).lower_bound[0], plan::build(wide, options).lower_bound[0]) << label;
  }
}

}  // namespace
}  // namespace remat
