// compile/passes.h: ir::verify runs after every pass that changed the graph and names the pass that broke it
// (whatever the build: the tests turn verification on); --dump-ir's text is the graph right after the named
// pass; compile() runs its passes verified on the tiny model's programs (pipeline, finite checks, fusion).
#include "cli/config.h"
#include "compile/compile.h"
#include "ir/ir.h"
#include "trainer/trainer.h"

#include <gtest/gtest.h>

namespace remat::compile {
namespace {

// A remat region around exp, then a chain of elementwise ops: inlining and fusion each change it.
ir::Graph region_then_chain() {
  return ir::parse(
      "graph @g(%x: f32[4]) -> (f32[4]) {\n"
      "  %0: f32[4] = remat(%x) {policy=\"nothing_saveable\"}\n"
      "    graph @region(%a: f32[4]) -> (f32[4]) {\n"
      "      %0: f32[4] = exp(%a)\n"
      "      return %0\n"
      "    }\n"
      "  %1: f32[4] = mul(%0, %x)\n"
      "  %2: f32[4] = add(%1, %x)\n"
      "  return %2\n"
      "}\n");
}

// Declares its result i32 while the op still yields f32: a graph ir::verify rejects.
bool break_result_type(ir::Graph& g) {
  g.types[static_cast<size_t>(g.results[0])].dtype = DType::i32;
  return true;
}

TEST(Passes, VerifyNamesThePassThatBrokeTheGraph) {
  const Pass broken{"break_result_type", break_result_type};
  const std::vector<Pass> list{passes()[0], broken, passes()[2]};
  ir::Graph g = region_then_chain();
  try {
    run_passes(g, list, {.verify = true});
    FAIL() << "the broken graph passed verification";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ir::verify failed after pass 'break_result_type': "), std::string::npos) << what;
    EXPECT_NE(what.find("is declared i32[4] but the op yields f32[4]"), std::string::npos) << what;
  }
  ir::Graph unchecked = region_then_chain();
  EXPECT_NO_THROW(run_passes(unchecked, {&broken, 1}, {.verify = false})) << "verification is what caught it";
}

TEST(Passes, DumpPrintsTheGraphAfterTheNamedPass) {
  for (const Pass& p : passes()) {
    ir::Graph g = region_then_chain();
    std::string dumped;
    run_passes(g, passes(), {.verify = true, .dump_after = p.name, .dump = [&](std::string_view t) { dumped += t; }});
    ir::Graph want = region_then_chain();
    bool changed = false;
    for (const Pass& q : passes()) {  // the same passes up to the named one
      changed = q.run(want);
      if (std::string(q.name) == p.name) break;
    }
    EXPECT_EQ(dumped, fmt::format("// @g after pass '{}'{}\n{}", p.name, changed ? "" : " (unchanged)", ir::print(want)));
  }
  ir::Graph g = region_then_chain();
  std::string dumped;
  const std::vector<Pass> without_checks{passes()[0], passes()[2]};  // checks would keep every op apart
  ASSERT_STREQ(without_checks[1].name, "fuse");
  run_passes(g, without_checks, {.dump_after = "fuse", .dump = [&](std::string_view t) { dumped += t; }});
  EXPECT_EQ(dumped.find("remat("), std::string::npos) << "inlined before fusion:\n" << dumped;
  EXPECT_NE(dumped.find("fusion("), std::string::npos) << dumped;
}

TEST(Passes, UnknownDumpNameListsThePasses) {
  try {
    check_pass_name("fusion");
    FAIL() << "an unknown pass name was taken";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--dump-ir=fusion: no such pass; the passes are inline_remat_regions, insert_finite_checks, fuse");
  }
  EXPECT_NO_THROW(check_pass_name(""));
  EXPECT_NO_THROW(check_pass_name("fuse"));
}

// Every pass compile() runs leaves a graph ir::verify accepts, on each kind of program of the tiny model:
// bf16 with its converts, f16 with loss scaling, offloaded residuals, FSDP's collectives, a pipeline's messages.
TEST(Passes, CompileVerifiesEveryPassOfTheTinyModel) {
  for (const char* keys : {"dtype=bfloat16", "dtype=float16", "remat_policy=minimal_offloaded", "ici_fsdp_parallelism=2"}) {
    const cli::Config c = cli::load_config("", {"base_num_decoder_layers=2", keys});
    nn::ModelConfig model = c.run.model;  // one rank's, as `remat plan` compiles it
    model.mesh = trainer::mesh_of(c.run, 0);
    for (Kind kind : {Kind::train_step, Kind::grads, Kind::loss, Kind::logits})
      for (bool check_finite : {false, true})
        EXPECT_NO_THROW(compile({.model = model, .shape = c.run.shape, .optimizer = c.run.optimizer, .kind = kind,
                                 .check_finite = check_finite, .verify_passes = true}))
            << keys;
  }
  const cli::Config p = cli::load_config("", {"base_num_decoder_layers=2", "ici_pipeline_parallelism=2"});
  const parallel::Schedule s = trainer::pipeline_schedule(p.run);
  nn::ModelConfig model = p.run.model;  // one rank's, as `remat plan` compiles it
  model.mesh = trainer::mesh_of(p.run, 0);
  for (int64_t stage : {0, 1})
    EXPECT_NO_THROW(compile({.model = model, .shape = trainer::pipeline_step_shape(p.run, s),
                             .optimizer = p.run.optimizer, .pipeline = &s, .stage = stage, .verify_passes = true}));
}

}  // namespace
}  // namespace remat::compile
