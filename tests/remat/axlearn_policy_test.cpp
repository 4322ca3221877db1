// Seed 001's policy, pasted as written in AXLearn: JAX/AXLearn keyword spellings and Python string literals
// parse to the same policy as the short spelling; under checkpoint_naming=axlearn the seed's regex saves
// exactly the tensors whose AXLearn names it matches, with gradients bit-identical to everything_saveable;
// MaxText presets keep their meaning under AXLearn names; AXLearn's dot-count check holds.
#include "remat/remat.h"
#include "support/models.h"
#include "train/step.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <regex>
#include <set>

namespace remat {
namespace {

using nn::names::Naming;
using rematerialize::parse_policy;
using rematerialize::Residency;

// The seed's text (axlearn/experiments/text/gpt/fuji.py in the PR), Python literals and all.
const char* kSeedPolicy =
    "_save_and_offload_only_these_names_regex(\n"
    "    names_which_can_be_saved=r\"(TransformerAttentionLayer\\.residual_add\"  # pylint: disable=C0301\n"
    "                             r\"|.*\\.?(k|q|v)_proj\"\n"
    "                             r\"|.*\\.?linear1_[01]\"\n"
    "                             r\"|TransformerFeedForwardLayer\\.mlp_residual)\",\n"
    "    names_which_can_be_offloaded=None, offload_src=\"device\", offload_dst=\"pinned_host\")";
const char* kSeedRegex =
    "(TransformerAttentionLayer\\.residual_add|.*\\.?(k|q|v)_proj|.*\\.?linear1_[01]|TransformerFeedForwardLayer\\.mlp_residual)";

TEST(AxlearnSpellings, ParseToTheShortSpelling) {
  const std::vector<std::pair<std::string, std::string>> same = {
      {"save_and_offload_only_these_names_regex(names_which_can_be_saved=\".*_proj\", names_which_can_be_offloaded=\"mlpwi_.\")",
       "save_and_offload_only_these_names_regex(save=\".*_proj\", offload=\"mlpwi_.\")"},
      {"save_and_offload_only_these_names_regex(offload_dst=\"pinned_host\", names_which_can_be_offloaded='mlpwi_.', "
       "offload_src=\"device\", names_which_can_be_saved=r'.*_proj')",
       "save_and_offload_only_these_names_regex(save=\".*_proj\", offload=\"mlpwi_.\")"},
      {"save_and_offload_only_these_names_regex(names_which_can_be_saved=\".*_proj\", names_which_can_be_offloaded=None)",
       "save_and_offload_only_these_names_regex(save=\".*_proj\", offload=\"\")"},
      {"save_and_offload_only_these_names_regex(names_which_can_be_saved=r\"(a\" r\"|b)\", names_which_can_be_offloaded=None)",
       "save_and_offload_only_these_names_regex(save=\"(a|b)\", offload=\"\")"},
      {"save_and_offload_only_these_names_regex(names_which_can_be_saved=r\"a\\.b\" \"|c\\\\.d\", names_which_can_be_offloaded=None)",
       "save_and_offload_only_these_names_regex(save=\"a\\.b|c\\.d\", offload=\"\")"},  // a raw literal keeps its backslash; in "...", a doubled one is one
      {kSeedPolicy, fmt::format("save_and_offload_only_these_names_regex(save=\"{}\", offload=\"\")", kSeedRegex)},
      {"save_and_offload_only_these_names(names_which_can_be_saved=[\"query_proj\"], names_which_can_be_offloaded=(\"mlpwo\",), "
       "offload_src=\"device\", offload_dst=\"pinned_host\")",
       "save_and_offload_only_these_names(save=[query_proj], offload=[mlpwo])"},
      {"save_and_offload_only_these_names(names_which_can_be_offloaded=None, names_which_can_be_saved=[key_proj, 'value_proj'])",
       "save_and_offload_only_these_names(save=[key_proj, value_proj], offload=[])"},
      {"save_only_these_names(\"query_proj\", 'key_proj')", "save_only_these_names(query_proj, key_proj)"},
      {"save_and_offload_only_these_names_regex(\n    names_which_can_be_saved=\".*_proj\",\n    names_which_can_be_offloaded=None,\n)",
       "save_and_offload_only_these_names_regex(save=\".*_proj\", offload=\"\")"},  // black's trailing comma
  };
  for (const auto& [jax, short_form] : same) {
    rematerialize::Policy a = parse_policy(jax), b = parse_policy(short_form);
    EXPECT_EQ(a.kind, b.kind) << jax;
    EXPECT_EQ(a.text, b.text) << jax;
    EXPECT_EQ(a.save_names, b.save_names) << jax;
    EXPECT_EQ(a.offload_names, b.offload_names) << jax;
    EXPECT_EQ(a.save_regex, b.save_regex) << jax;
    EXPECT_EQ(a.offload_regex, b.offload_regex) << jax;
  }
}

std::string error_of(const std::string& text) {
  try {
    parse_policy(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AxlearnSpellings, MalformedOnesAreOneLineErrors) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"save_and_offload_only_these_names_regex(names_which_can_be_kept=\"a\")", "has no keyword 'names_which_can_be_kept'"},
      {"save_and_offload_only_these_names_regex(save=\"a\", offload_dst=\"device\")",
       "offload_dst=\"device\" is not supported; the only value is \"pinned_host\""},
      {"save_and_offload_only_these_names_regex(save=\"a\", offload_src=\"pinned_host\")",
       "offload_src=\"pinned_host\" is not supported; the only value is \"device\""},
      {"save_and_offload_only_these_names_regex(names_which_can_be_saved=r\"(a\" r\"|b)", "unterminated string"},
      {"save_and_offload_only_these_names_regex(\"a\", \"b\")", "takes keyword arguments only"},
      {"save_and_offload_only_these_names(save=[a], names_which_can_be_saved=[b])", "save is given twice"},
  };
  for (const auto& [text, why] : bad) {
    std::string e = error_of(text);
    EXPECT_NE(e.find(why), std::string::npos) << text << "\n -> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
  }
}

// Found by fuzz/policy_fuzz: canonical text is policy text again, whatever the names and regexes hold.
TEST(AxlearnSpellings, CanonicalTextParsesBackToItself) {
  for (const char* text : {
           R"p(save_and_offload_only_these_names_regex(save="a\"b", offload=r"c\\"))p",
           R"p(save_and_offload_only_these_names_regex(save=r"x\\", offload="\\\\d\."))p",
           R"p(save_only_these_names("two words", "a,b", 'q"', "None", query_proj))p",
           R"p(save_and_offload_only_these_names(save=["(x)"], offload=["]"]))p",
       }) {
    const rematerialize::Policy p = parse_policy(text);
    EXPECT_EQ(parse_policy(p.text).text, p.text) << text;
    const rematerialize::Policy q = parse_policy(p.text);
    EXPECT_EQ(q.save_regex, p.save_regex) << text;
    EXPECT_EQ(q.offload_regex, p.offload_regex) << text;
    EXPECT_EQ(q.save_names, p.save_names) << text;
    EXPECT_EQ(q.offload_names, p.offload_names) << text;
  }
  EXPECT_EQ(parse_policy(R"p(save_and_offload_only_these_names_regex(save=r"x\\", offload=None))p").save_regex, "x\\\\");
}

// std::regex compiles recursively and unrolls counts (a huge count overflowed inside libstdc++: UB).
TEST(AxlearnSpellings, RegexesBeyondCheckpointNameSizesAreRefused) {
  EXPECT_NE(error_of("save_and_offload_only_these_names_regex(save=\"a{101}\", offload=None)").find("above 100"),
            std::string::npos);
  EXPECT_NE(error_of("save_and_offload_only_these_names_regex(save=\"(a)\\\\2222222222222222222\", offload=None)")
                .find("above 100"),
            std::string::npos);
  EXPECT_NE(error_of(fmt::format("save_and_offload_only_these_names_regex(save=\"{}\", offload=None)",
                                 std::string(1001, 'a')))
                .find("longer than 1000"),
            std::string::npos);
  EXPECT_EQ(error_of("save_and_offload_only_these_names_regex(save=\"a{2,100}_\\\\d\", offload=None)"), "");
}

nn::ModelConfig model(const std::string& policy, Naming naming) {
  nn::ModelConfig c = testing_support::small_model(2, true, "full");
  c.checkpoint_naming = naming;
  c.remat_policy = nn::parse_remat_policy(policy, c);
  return c;
}

std::vector<exec::Array> args_for(const nn::ModelConfig& c) {
  std::vector<exec::Array> args = nn::init_params(c, 2);
  std::vector<int32_t> in(32), tg(32);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int32_t>((i * 37) % 256), tg[i] = static_cast<int32_t>((i * 11 + 3) % 256);
  args.push_back(exec::Array::from<int32_t>({1, 2, 16}, in));
  args.push_back(exec::Array::from<int32_t>({1, 2, 16}, tg));
  return args;
}

TEST(SeedPolicy, SavesExactlyWhatItsRegexMatchesAndTrainsExactly) {
  nn::ModelConfig c = model(kSeedPolicy, Naming::axlearn);
  EXPECT_TRUE(rematerialize::lint(nn::loss_graph(c, 2, 16), c.remat_policy, {}).empty());
  rematerialize::Decider d;
  ir::Graph g = train::grads_program(c, {2, 16, 1}, &d).graph;
  // Which residuals are saved, derived here with re.fullmatch semantics over the recorded names.
  const std::regex seed(kSeedRegex);
  std::set<std::string> saved, expected;
  for (const rematerialize::ResidualRecord& r : d.records()) {
    if (r.region_input || r.alias || r.parameter_derived) continue;
    const bool named = r.what.find(" @ ") == std::string::npos;
    if (named && std::regex_match(r.what, seed)) expected.insert(r.what);
    if (r.residency == Residency::save) saved.insert(r.what);
    EXPECT_NE(r.residency, Residency::offload) << r.what;
  }
  EXPECT_EQ(saved, expected);
  EXPECT_EQ(saved, (std::set<std::string>{"GroupedQueryAttention.q_proj", "GroupedQueryAttention.k_proj",
                                          "GroupedQueryAttention.v_proj", "TransformerAttentionLayer.residual_add",
                                          "TransformerFeedForwardLayer.linear1_0", "TransformerFeedForwardLayer.linear1_1"}));
  // Gradients bit-identical to everything_saveable under the same naming.
  std::vector<exec::Array> args = args_for(c);
  std::vector<exec::Array> got = exec::run(g, args);
  std::vector<exec::Array> want = exec::run(train::grads_program(model("everything_saveable", Naming::axlearn), {2, 16, 1}).graph, args);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(std::memcmp(got[i].bytes(), want[i].bytes(), static_cast<size_t>(got[i].type().bytes())), 0) << i;
}

TEST(SeedPolicy, UnderMaxTextNamesLintListsTheRealNames) {
  try {
    const nn::ModelConfig c = model(kSeedPolicy, Naming::maxtext);
    rematerialize::lint(nn::loss_graph(c, 2, 16), c.remat_policy, {});
    FAIL() << "lint accepted a regex that matches no MaxText name";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("matches no checkpoint name in the model; the names are: context, decoder_layer_input, key_proj"),
              std::string::npos)
        << m;
  }
}

// Each MaxText preset saves and offloads the same tensors (same bytes, same decisions in the same order)
// whichever naming the model uses: presets go through the name table.
TEST(SeedPolicy, MaxTextPresetsMeanTheSameUnderAxlearnNames) {
  for (const std::string& preset : rematerialize::preset_names()) {
    std::vector<std::pair<Residency, int64_t>> decisions[2];
    for (Naming naming : {Naming::maxtext, Naming::axlearn}) {
      nn::ModelConfig c = model(preset == "custom" ? "custom(query_proj=offload, mlpwo=device)" : preset, naming);
      rematerialize::Decider d;
      EXPECT_TRUE(rematerialize::lint(nn::loss_graph(c, 2, 16), c.remat_policy, {}).empty()) << preset;
      train::grads_program(c, {2, 16, 1}, &d);
      for (const rematerialize::ResidualRecord& r : d.records())
        if (!r.region_input && !r.alias && r.what.rfind("TransformerAttentionLayer.", 0) != 0)
          decisions[naming == Naming::axlearn].emplace_back(r.residency, r.type.bytes());
    }
    EXPECT_EQ(decisions[0], decisions[1]) << preset;
    EXPECT_FALSE(decisions[0].empty()) << preset;
  }
}

// AXLearn's attention_test.py check under AXLearn names: its NATIVE_ATTENTION pattern saves q/k/v, context
// and o_proj, removing 5 of the 8 dots nothing_saveable recomputes per layer.
TEST(SeedPolicy, AxlearnDotCountHoldsUnderAxlearnNames) {
  auto recomputed_dots = [](const std::string& policy) {
    nn::ModelConfig c = testing_support::micro_model(1, false, "full");
    c.checkpoint_naming = Naming::axlearn;
    c.remat_policy = nn::parse_remat_policy(policy, c);
    rematerialize::Decider d;
    int n = 0;
    for (const ir::Node& node : train::grads_program(c, {1, 4, 1}, &d).graph.nodes) n += node.recomputed && node.op == ir::Op::dot_general;
    return n;
  };
  const int nothing = recomputed_dots("nothing_saveable");
  const int native = recomputed_dots(
      "save_and_offload_only_these_names_regex(names_which_can_be_saved=r\".*([qkvo]_proj|context)\", "
      "names_which_can_be_offloaded=None)");
  EXPECT_EQ(nothing, 8);
  EXPECT_EQ(nothing - native, 5);
}

}  // namespace
}  // namespace remat
