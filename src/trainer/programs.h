// The programs of a run as it runs them: each compiled program with its executable and buffers (the training
// step's, evaluation's and sampling's, the latter two reading the step's parameters), evaluation over fixed
// validation batches, and sampling text. Arguments and results are found by name in each signature.
#pragma once

#include "exec/executable.h"
#include "train/checkpoint_manager.h"
#include "trainer/trainer.h"

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace remat::trainer {

// The argument of that name, or null where the program has none (under a pipeline only the first stage's
// rank takes inputs and only the last's takes targets).
exec::Array* arg_if(const ir::Signature& sig, std::vector<exec::Array>& args, std::string_view name);

// A compiled program with its executable. Its arguments are its own buffers, except the parameters when
// `step` is given: those are the step's (evaluation and sampling read its weights), and so are its arenas
// where they fit (the programs run one at a time).
struct Runner {
  ir::Signature signature;
  exec::Executable executable;
  std::vector<exec::Array>& args;

  // The step's runner takes the mesh; the others run on the step's.
  explicit Runner(compile::Compiled c, const Runner* step = nullptr, const exec::Mesh* mesh = nullptr)
      : signature(std::move(c.signature)),
        executable(std::move(c.program), std::move(c.plan), {.mesh = step ? step->executable.options().mesh : mesh},
                   step ? &step->executable : nullptr),
        args(executable.own_arguments(shared(signature, step))) {}
  exec::Array& arg(std::string_view name) { return args[static_cast<size_t>(signature.arg(name))]; }
  // Every argument as a view of its buffer, with its name and role (the checkpoints pick the state).
  std::vector<train::StateTensor> state() const {
    std::vector<train::StateTensor> out;
    for (size_t i = 0; i < signature.args.size(); ++i) out.push_back({signature.args[i].name, signature.args[i].role, args[i]});
    return out;
  }
  // What it allocated: its own arguments and the arenas it does not share.
  int64_t bytes() const { return executable.owned_bytes(); }

 private:
  static std::map<int, exec::Array> shared(const ir::Signature& s, const Runner* from) {
    std::map<int, exec::Array> out;
    for (size_t i = 0; from != nullptr && i < s.args.size(); ++i)
      if (s.args[i].role == ir::Role::parameter) out.emplace(static_cast<int>(i), from->args[static_cast<size_t>(from->signature.arg(s.args[i].name))]);
    return out;
  }
};

// Mean loss over a fixed set of validation batches (same batches every evaluation).
class Evaluator {
 public:
  // `loss` is the loss program of `batch` sequences.
  Evaluator(const RunConfig& c, const train::Dataset& d, const Runner& step, compile::Compiled loss, int64_t batch);
  double loss();
  const Runner& program() const { return program_; }

 private:
  Runner program_;
  size_t tokens_;
  std::vector<std::vector<int32_t>> batches_;  // inputs then targets, per batch
};

// Text for the terminal: newlines, tabs and printable ASCII as they are, a backslash doubled, any other
// byte as \xNN (a byte-level model samples control bytes too).
std::string printable(const std::string& s);

// Generates sample_length tokens after sample_prompt (encoded by `tokenizer`, after its BOS where it has one):
// one forward pass over the last `seq` tokens per new token (generate.h's RunSample where no KV cache fits).
// Returns the text, decoded by `tokenizer`.
std::string sample(const RunConfig& c, const train::Tokenizer& tokenizer, Runner& logits_program);

}  // namespace remat::trainer
