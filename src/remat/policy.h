// Remat policies (docs/policies.md): the vocabulary of jax.checkpoint_policies with JAX's exact semantics,
// AXLearn's regex policy and checked combinator, and MaxText's presets by name.
//
// Policy text (the `policy` attribute of a remat region and the `remat_policy` config key):
//   none                                 no remat region at all: the model traces its layers without
//                                        jax.checkpoint and the backward keeps every residual
//   everything_saveable | nothing_saveable | dots_saveable | dots_with_no_batch_dims_saveable
//   offload_dot_with_no_batch_dims
//   save_only_these_names(query_proj, key_proj)         save_any_names_but_these(mlpwo)
//   save_and_offload_only_these_names(save=[query_proj], offload=[mlpwo])      (the two lists disjoint)
//   save_and_offload_only_these_names_regex(save=".*_proj", offload="mlpwi_.*") (re.fullmatch)
//   ... and JAX's / AXLearn's keyword spellings of both, pasted from Python: names_which_can_be_saved=,
//   names_which_can_be_offloaded=, offload_src="device", offload_dst="pinned_host" (keyword-only, any order),
//   None for no pattern or names, '...' / "..." / r"..." literals with adjacent ones concatenated, `#`
//   comments, and AXLearn's deprecated alias _save_and_offload_only_these_names_regex
//   save_from_both_policies(P, Q)        logical OR; neither may offload (as in JAX)
//   combine(P, Q) | combine(P, Q, prefer=save|offload)   AXLearn's: the non-recompute answer wins; two
//                                        different non-recompute answers are an error unless preferred
//   custom(query_proj=offload, mlpwo=device, ...)  MaxText's per-name remat|device|offload map; names not
//                                        listed are remat, except decoder_layer_input (device)
//   MaxText presets: full, minimal, minimal_with_context, save_dot_except_mlp, save_dot_except_mlpwi,
//                    save_dot_with_context_except_mlp, save_qkv_proj, save_out_proj, qkv_proj_offloaded,
//                    minimal_offloaded (explicit name lists; `minimal` is never a dot-shape rule)
//
//   Policy p = parse_policy("minimal");
//   Verdict v = evaluate(p, graph, producer_node, output);   // {Residency::save, "save_only_these_names: ..."}
#pragma once

#include "autodiff/autodiff.h"
#include "nn/checkpoint_names.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace remat::rematerialize {

using autodiff::Residency;

struct Policy {
  enum class Kind {
    none,
    everything_saveable,
    nothing_saveable,
    dots_saveable,
    dots_with_no_batch_dims_saveable,
    offload_dot_with_no_batch_dims,
    save_only_these_names,
    save_any_names_but_these,
    save_and_offload_only_these_names,
    save_and_offload_regex,
    save_from_both_policies,
    combine,
  };
  Kind kind = Kind::nothing_saveable;
  std::string text;                                // canonical text, also naming the rule in verdicts
  std::vector<std::string> save_names, offload_names;
  std::string save_regex, offload_regex;
  struct Regexes;                                  // the two compiled by parse_policy, once (policy.cpp)
  std::shared_ptr<const Regexes> regexes;          // set for save_and_offload_regex
  std::shared_ptr<const Policy> first, second;     // the combinators' operands
  std::optional<Residency> prefer;                 // combine's tie-break
  std::string preset;                              // the MaxText preset it came from, if any

  bool can_offload() const;
};

// Parses policy text; errors show the grammar and name what was wrong. MaxText presets (MaxText names) are
// spelled as a layer with `names` spells them (its naming and fusions, nn/checkpoint_names.h), `custom` keys
// in its naming; names written out are taken as written.
Policy parse_policy(const std::string& text, const nn::names::Vocabulary& names = {});

// MaxText's preset names (for errors and docs).
std::vector<std::string> preset_names();

struct Verdict {
  Residency residency;
  std::string rule;  // what decided, e.g. "save_only_these_names: 'query_proj' is listed"
};

// The policy's answer for output `output` of `producer` (a node of `graph`).
Verdict evaluate(const Policy& p, const ir::Graph& graph, const ir::Node& producer, size_t output);

}  // namespace remat::rematerialize
