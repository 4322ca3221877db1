// The compile stage's typed signature: every argument and result of the tiny training step has a name
// and a role, checked against the model's parameter list (an independent route: nn::param_specs), the
// updates pair each new value with its argument and all of them are donated by the plan; loss scaling adds
// its state and the `finite` metric; evaluation and sampling programs have their own signatures.
#include "cli/config.h"
#include "compile/compile.h"

#include <gtest/gtest.h>

#include <set>

namespace remat {
namespace {

compile::Compiled compile_tiny(const std::vector<std::string>& overrides, compile::Kind kind) {
  cli::Config c = cli::load_config("", overrides);
  return compile::compile({.model = c.run.model, .shape = c.run.shape, .optimizer = c.run.optimizer, .kind = kind});
}

TEST(Compile, SignatureListsEveryRoleOfTheTinyStep) {
  for (bool f16 : {false, true}) {
    const std::vector<std::string> overrides = f16 ? std::vector<std::string>{"dtype=float16"} : std::vector<std::string>{};
    compile::Compiled s = compile_tiny(overrides, compile::Kind::train_step);
    const cli::Config c = cli::load_config("", overrides);
    const std::vector<nn::ParamSpec> specs = nn::param_specs(c.run.model);
    const size_t np = specs.size();
    std::vector<std::pair<std::string, ir::Role>> args;
    for (const char* prefix : {"", "opt_m/", "opt_v/"})
      for (const nn::ParamSpec& p : specs)
        args.emplace_back(prefix + p.path, *prefix ? ir::Role::optimizer_state : ir::Role::parameter);
    args.emplace_back("step", ir::Role::step);
    if (f16) args.emplace_back("loss_scale", ir::Role::loss_scale), args.emplace_back("loss_scale_count", ir::Role::loss_scale);
    args.emplace_back("inputs", ir::Role::batch);
    args.emplace_back("targets", ir::Role::batch);
    ASSERT_EQ(s.signature.args.size(), args.size()) << s.signature.text();
    ASSERT_EQ(s.program.params.size(), args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      EXPECT_EQ(s.signature.args[i].name, args[i].first);
      EXPECT_EQ(s.signature.args[i].role, args[i].second) << args[i].first;
      EXPECT_EQ(s.program.param_names[i], args[i].first) << "the graph's params, in the same order";
    }
    // Results: three metrics, then the new parameters and moments (updating arguments 0 .. 3np-1), then
    // the loss-scale state and `finite`.
    std::vector<std::pair<std::string, int>> results{{"loss", -1}, {"grad_norm", -1}, {"lr", -1}};
    for (size_t i = 0; i < 3 * np; ++i) results.emplace_back(args[i].first, static_cast<int>(i));
    if (f16) results.insert(results.end(), {{"loss_scale", static_cast<int>(3 * np + 1)}, {"loss_scale_count", static_cast<int>(3 * np + 2)}, {"finite", -1}});
    ASSERT_EQ(s.signature.results.size(), results.size()) << s.signature.text();
    std::set<ir::Role> roles;
    for (size_t r = 0; r < results.size(); ++r) {
      const ir::Slot& slot = s.signature.results[r];
      EXPECT_EQ(slot.name, results[r].first);
      EXPECT_EQ(slot.updates, results[r].second) << slot.name;
      if (slot.updates < 0) {
        EXPECT_EQ(slot.role, ir::Role::metric) << slot.name;
      } else {
        EXPECT_EQ(slot.role, s.signature.args[static_cast<size_t>(slot.updates)].role) << slot.name;
        EXPECT_EQ(s.program.type(s.program.results[r]), s.program.type(s.program.params[static_cast<size_t>(slot.updates)]));
        EXPECT_EQ(s.plan.donated_param[r], slot.updates) << slot.name << " is written in place";
      }
      roles.insert(slot.role);
    }
    for (const ir::Slot& a : s.signature.args) roles.insert(a.role);
    std::set<ir::Role> want{ir::Role::parameter, ir::Role::optimizer_state, ir::Role::step, ir::Role::batch, ir::Role::metric};
    if (f16) want.insert(ir::Role::loss_scale);
    EXPECT_EQ(roles, want);
  }
}

TEST(Compile, EvaluationAndSamplingProgramsHaveTheirOwnSignatures) {
  compile::Compiled loss = compile_tiny({}, compile::Kind::loss);
  compile::Compiled logits = compile_tiny({}, compile::Kind::logits);
  const size_t np = nn::param_specs(cli::load_config("", {}).run.model).size();
  ASSERT_EQ(loss.signature.args.size(), np + 2);
  ASSERT_EQ(logits.signature.args.size(), np + 1);
  for (size_t i = 0; i < np; ++i) {
    EXPECT_EQ(loss.signature.args[i].role, ir::Role::parameter);
    EXPECT_EQ(logits.signature.args[i].name, loss.signature.args[i].name);
  }
  EXPECT_EQ(loss.signature.args[loss.signature.arg("targets")].role, ir::Role::batch);
  EXPECT_EQ(loss.signature.results[loss.signature.result("loss")].role, ir::Role::metric);
  EXPECT_EQ(logits.signature.results[logits.signature.result("logits")].role, ir::Role::output);
  EXPECT_TRUE(loss.signature.updates().empty());
}

// The decider is handed to compile: the one given records every decision, and they are the explanation.
TEST(Compile, UsesTheDeciderItIsHanded) {
  cli::Config c = cli::load_config("", {"remat_policy=minimal"});
  rematerialize::Decider decider;
  compile::Compiled s = compile::compile({.model = c.run.model, .shape = c.run.shape, .kind = compile::Kind::grads,
                                          .decider = &decider});
  ASSERT_FALSE(decider.records().empty());
  EXPECT_EQ(s.explanation.residuals.size(), decider.records().size());
  EXPECT_EQ(s.explanation.residuals.front().policy, decider.records().front().policy);
}

}  // namespace
}  // namespace remat
