// How the harnesses read their input bytes, shared with the test that every seed of fuzz/corpus/ is
// accepted (tests/fuzz/seed_corpus_test.cpp), so that the CI smoke run starts from inputs that go deep.
#pragma once

#include "nn/model.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remat::fuzz {

// config: the YAML file's text, then optionally a line `%%` and one key=value override per line.
struct ConfigInput {
  std::string_view yaml;
  std::vector<std::string> overrides;
};
inline ConfigInput config_input(std::string_view input) {
  const size_t split = input.find("\n%%\n");
  ConfigInput out{input.substr(0, split), {}};
  if (split == std::string_view::npos) return out;
  for (std::string_view rest = input.substr(split + 4); !rest.empty();) {
    const size_t eol = std::min(rest.find('\n'), rest.size());
    out.overrides.emplace_back(rest.substr(0, eol));
    rest.remove_prefix(std::min(eol + 1, rest.size()));
  }
  return out;
}

// policy: the first byte picks the layer's names (bit 0 AXLearn naming, bit 1 fused qkv, bit 2 fused mlp),
// the rest is the policy text. Seeds start with '0' (MaxText, unfused), '1' (AXLearn) or '6' (both fused).
struct PolicyInput {
  rematerialize::Spelling names;  // as that layer spells checkpoint names
  std::string_view text;
};
inline PolicyInput policy_input(std::string_view input) {
  if (input.empty()) return {};
  const auto first = static_cast<unsigned char>(input[0]);
  nn::ModelConfig layer;
  layer.checkpoint_naming = first & 1 ? nn::names::Naming::axlearn : nn::names::Naming::maxtext;
  layer.fused_qkv = first & 2;
  layer.fused_mlp = first & 4;
  return {nn::policy_spelling(layer), input.substr(1)};
}

}  // namespace remat::fuzz
