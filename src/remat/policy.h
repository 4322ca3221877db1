// Remat policies (docs/policies.md): the vocabulary of jax.checkpoint_policies with JAX's exact semantics,
// AXLearn's regex policy and checked combinator, and MaxText's presets by name.
//
// Policy text (the `policy` attribute of a remat region and the `remat_policy` config key):
//   none                                 no remat region at all: the model traces its layers without
//                                        jax.checkpoint and the backward keeps every residual
//   auto                                 the policy search picks a custom(...) placement (search/), which
//                                        replaces this value before anything is traced
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
//                                        listed are remat, except decoder_layer_input (device); a bare
//                                        `custom` places the names as the config's per-name keys say
//   MaxText presets: full, minimal, minimal_with_context, save_dot_except_mlp, save_dot_except_mlpwi,
//                    save_dot_with_context_except_mlp, save_qkv_proj, save_out_proj, qkv_proj_offloaded,
//                    minimal_offloaded (explicit name lists; `minimal` is never a dot-shape rule)
//
// Text exists to parse what a user writes and to print: everything else holds a Policy value (nn::ModelConfig,
// the decider, the search). The layer's checkpoint names reach the parser from above (nn::policy_spelling).
//
//   Policy p = parse_policy("minimal");
//   Verdict v = evaluate(p, graph, producer_node, output);   // {Residency::save, "save_only_these_names: ..."}
#pragma once

#include "autodiff/autodiff.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace remat::rematerialize {

using autodiff::Residency;

struct Policy {
  enum class Kind {
    none,
    automatic,  // remat_policy=auto: resolved by the policy search into a custom one
    everything_saveable,
    nothing_saveable,
    dots_saveable,
    dots_with_no_batch_dims_saveable,
    offload_dot_with_no_batch_dims,
    save_only_these_names,
    save_any_names_but_these,
    save_and_offload_only_these_names,
    save_and_offload_regex,
    custom,  // MaxText's per-name map: save_and_offload_only_these_names under another name
    save_from_both_policies,
    combine,
  };
  Kind kind = Kind::nothing_saveable;
  std::string written;                             // the text as the user wrote it: what titles, logs and the
                                                   // remat region's `policy` attribute print
  std::string text;                                // canonical text, also naming the rule in verdicts
  std::vector<std::string> save_names, offload_names;
  std::string save_regex, offload_regex;
  struct Regexes;                                  // the two compiled by parse_policy, once (policy.cpp)
  std::shared_ptr<const Regexes> regexes;          // set for save_and_offload_regex
  std::shared_ptr<const Policy> first, second;     // the combinators' operands
  std::optional<Residency> prefer;                 // combine's tie-break
  std::string preset;                              // the MaxText preset it came from ("custom" for custom), if any

  bool can_offload() const;
  // How reports name it: the canonical text, after the preset it came from ("minimal = save_only_these_names(...)").
  std::string described() const { return preset.empty() ? text : preset + " = " + text; }
};

// How the model's layer spells the checkpoint names that MaxText presets and `custom` keys write in MaxText's
// names (its naming and fusions: nn::policy_spelling builds it from nn/checkpoint_names.h). A name missing from
// a map is taken as written.
struct Spelling {
  std::map<std::string, std::string> preset;  // a name a preset lists -> the layer's (under a fusion, the fused one)
  std::map<std::string, std::string> custom;  // a `custom` key -> the layer's name (its naming)
};

// remat_policy=custom's per-name keys (MaxText's): checkpoint name -> remat | device | offload, in print order.
using CustomKeys = std::vector<std::pair<std::string, std::string>>;

// Parses policy text; errors show the grammar and name what was wrong. MaxText presets and `custom` keys are
// spelled as `spelling` says; names written out are taken as written. A bare `custom` places `keys`.
Policy parse_policy(const std::string& text, const Spelling& spelling = {}, const CustomKeys& keys = {});

// MaxText's custom policy placing each name (MaxText's) as `placement` says (save: device), others recomputed
// but decoder_layer_input (kept); `written` is its custom(name=remat|device|offload, ...) text, in this order.
Policy custom_policy(const std::vector<std::pair<std::string, Residency>>& placement, const Spelling& spelling = {});

// A policy of a kind that takes at most name lists (not the regex kind, the combinators, custom, none or auto),
// built as a value: `written` is its canonical text. The search's and --compare's candidates.
Policy policy_of(Policy::Kind kind, std::vector<std::string> save = {}, std::vector<std::string> offload = {});

// The word a custom(...) placement uses for `r`: remat, device or offload.
const char* custom_word(Residency r);

// MaxText's preset names (for errors and docs).
std::vector<std::string> preset_names();

// The same policy: as written (what logs and the IR print) and as parsed (its rule and the preset it came from).
bool same_policy(const Policy& a, const Policy& b);

// A remat region's `policy` attribute holding `p` itself (ir::checkpoint's argument): the IR prints it as
// p.written; two are equal when they are the same policy, as the parser made it.
ir::AttrValue policy_attr(const Policy& p);

// The policy of a remat region's attribute: the value it was traced with or, in IR parsed from text, its text
// parsed (with the default spelling).
std::shared_ptr<const Policy> region_policy(const ir::AttrValue& attr);

struct Verdict {
  Residency residency;
  std::string rule;  // what decided, e.g. "save_only_these_names: 'query_proj' is listed"
};

// The policy's answer for output `output` of `producer` (a node of `graph`).
Verdict evaluate(const Policy& p, const ir::Graph& graph, const ir::Node& producer, size_t output);

}  // namespace remat::rematerialize
