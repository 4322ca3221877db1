// Public header of the compile stage (docs/design.md, "The stages, in pipeline order"): the one call that
// turns a model, a batch shape and an optimizer into a program ready to run. It traces the model, lints the
// remat policy against it, differentiates (the policy's decider splitting every remat region), records the
// residual explanation, runs the IR passes (compile/passes.h: remat regions inlined, finite checks, fusion)
// and plans the memory of every buffer, kernel workspace included. `remat train`, `remat plan`, `remat
// explain` and every later caller (policy search, distributed runner, checkpoints) go through it; nothing
// else assembles step graphs.
//
//   compile::Compiled step = compile::compile({.model = m, .shape = s, .optimizer = o});
//   exec::Executable run(step.program, step.plan);
//   fmt::print("{}", step.explanation.text());
#pragma once

#include "compile/passes.h"
#include "exec/exec.h"
#include "plan/plan.h"
#include "remat/remat.h"
#include "train/step.h"

#include <string>
#include <vector>

namespace remat::compile {

enum class Kind {
  train_step,  // train::step_program: loss, gradients, clipping, AdamW; parameters and moments updated in place
  grads,       // train::grads_program: loss and gradients (what `remat explain` shows)
  loss,        // train::loss_program: the evaluation loss of one microbatch (forward only)
  logits,      // train::logits_program: logits for sampling (forward only)
  prefill,     // train::prefill_program: a prompt of shape.seq tokens into KV caches of max_length positions
  decode,      // train::decode_program: one token against the KV caches of max_length positions
};

struct Request {
  nn::ModelConfig model = {};            // with its remat policy and precision
  train::StepShape shape = {};           // batch x seq (x accumulation for train_step and grads)
  train::OptimizerConfig optimizer = {}; // train_step only
  int64_t max_length = 0;                // prefill and decode: the KV caches' positions
  Kind kind = Kind::train_step;
  bool allow_unmatched = false;          // lint: a policy name that matches no checkpoint name only warns
  const exec::Backend* backend = &exec::cpu();  // whose kernels' workspace is planned
  // Decides every residual of every remat region while differentiating, and records each decision for the
  // explanation (hand a fresh one, handed the model's remat_policy). Null: a decider of this call's own.
  rematerialize::Decider* decider = nullptr;
  // The debugging form: a finite check after every floating-point op (ir::insert_finite_checks), so a run
  // fails at the first op whose output is a NaN or an infinity, naming it. It updates nothing in place.
  bool check_finite = false;
  // Pipeline parallelism: the program of rank `stage` of this schedule (train::pipeline_step_program;
  // pipeline_forward_program for loss and logits); null: the whole model on every rank.
  const parallel::Schedule* pipeline = nullptr;
  int64_t stage = 0;
  // false: trace and differentiate only, for the explanation (a policy search's recompute cost); the
  // program is then not passed through the IR passes nor planned.
  bool plan = true;
  // Fuse elementwise chains and the broadcasts they read (ir::fuse) before planning; false: every op its own
  // kernel and buffer (the `fusion` config key; the same bits either way).
  bool fuse = true;
  // ir::verify after every pass (run_passes; on by default in debug and sanitizer builds).
  bool verify_passes = kVerifyPasses;
  // A pass's name (compile::passes()): the program is printed to stdout after it (`--dump-ir`).
  std::string dump_ir_after = {};
};

struct Compiled {
  ir::Graph program;                         // what runs: remat regions inlined, passes done
  ir::Signature signature;                   // every argument and result named, with its role
  plan::Plan plan;                           // schedule, buffers, arenas (kernel workspace included)
  rematerialize::Explanation explanation;    // every residual's decision (train_step and grads; else empty)
  std::vector<std::string> warnings;         // from linting the policy (train_step and grads)
  std::vector<train::ActionSpan> actions;    // a pipeline step's actions (train::Program::actions)
};

Compiled compile(const Request& request);

}  // namespace remat::compile
