#include "remat/policy.h"

#include "base/check.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <set>

namespace remat::rematerialize {

struct Policy::Regexes {
  std::regex save, offload;  // matching nothing when their pattern is empty (evaluate skips those)
};

namespace {

using Kind = Policy::Kind;

const char* kGrammar =
    "a policy is one of: everything_saveable, nothing_saveable, dots_saveable, dots_with_no_batch_dims_saveable, "
    "offload_dot_with_no_batch_dims, save_only_these_names(a, b), save_any_names_but_these(a, b), "
    "save_and_offload_only_these_names(save=[a], offload=[b]), "
    "save_and_offload_only_these_names_regex(save=\"re\", offload=\"re\") (JAX/AXLearn keywords too: "
    "names_which_can_be_saved=, names_which_can_be_offloaded=, offload_src=\"device\", "
    "offload_dst=\"pinned_host\"; None; r\"...\" and adjacent literals), save_from_both_policies(P, Q), "
    "combine(P, Q[, prefer=save|offload]), custom(name=remat|device|offload, ...), none, auto, or a MaxText preset";

// MaxText's presets (src/maxtext/layers/decoders.py) as policy text. Names our decoder does not have
// (kv_proj, qkv_proj, mlpwi) are left out: lint would reject them as matching nothing.
const std::map<std::string, std::string>& presets() {
  static const std::map<std::string, std::string> p = {
      {"full", "nothing_saveable"},
      {"minimal", "save_only_these_names(query_proj, key_proj, value_proj, out_proj, mlpwi_0, mlpwi_1, mlpwo)"},
      {"minimal_with_context",
       "save_only_these_names(query_proj, key_proj, value_proj, context, out_proj, mlpwi_0, mlpwi_1, mlpwo)"},
      {"save_dot_with_context_except_mlp", "save_only_these_names(query_proj, key_proj, value_proj, context, out_proj)"},
      {"save_dot_except_mlpwi", "save_only_these_names(query_proj, key_proj, value_proj, out_proj, mlpwo)"},
      {"save_dot_except_mlp", "save_only_these_names(query_proj, key_proj, value_proj, out_proj)"},
      {"save_qkv_proj", "save_only_these_names(query_proj, key_proj, value_proj)"},
      {"save_out_proj", "save_only_these_names(out_proj)"},
      {"qkv_proj_offloaded", "save_and_offload_only_these_names(save=[], offload=[query_proj, key_proj, value_proj])"},
      {"minimal_offloaded",
       "save_and_offload_only_these_names(save=[], offload=[query_proj, key_proj, value_proj, out_proj, mlpwi_0, "
       "mlpwi_1, mlpwo])"},
  };
  return p;
}

bool listed(const std::vector<std::string>& names, const std::string& n);

// `name` as `names` spells it: as written when the map does not have it.
std::string spelled(const std::map<std::string, std::string>& names, const std::string& name) {
  auto it = names.find(name);
  return it == names.end() ? name : it->second;
}

// The residency a custom(...) placement word names, if it is one.
std::optional<Residency> custom_residency(const std::string& word) {
  for (Residency r : {Residency::recompute, Residency::save, Residency::offload})
    if (word == custom_word(r)) return r;
  return std::nullopt;
}

// A string literal that string_literal() reads back as `s`: `"` escaped, and `\\` escaped where it would
// otherwise form an escape the reader removes (before `\\`, a quote or the closing quote).
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const bool next_unescapes = i + 1 == s.size() || s[i + 1] == '\\' || s[i + 1] == '"' || s[i + 1] == '\'';
    if (s[i] == '"' || (s[i] == '\\' && next_unescapes)) out += '\\';
    out += s[i];
  }
  return out + "\"";
}
// A name as written in a list: bare when it lexes as one identifier, else quoted.
std::string name_text(const std::string& n) {
  const bool bare = !n.empty() && n != "None" && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
  return bare ? n : quoted(n);
}
std::string names_text(const std::vector<std::string>& v) {
  std::vector<std::string> out;
  for (const std::string& n : v) out.push_back(name_text(n));
  return fmt::format("{}", fmt::join(out, ", "));
}
std::string canonical(const Policy& p) {
  auto list = [](const std::vector<std::string>& v) { return fmt::format("[{}]", names_text(v)); };
  switch (p.kind) {
    case Kind::none: return "none";
    case Kind::automatic: return "auto";
    case Kind::everything_saveable: return "everything_saveable";
    case Kind::nothing_saveable: return "nothing_saveable";
    case Kind::dots_saveable: return "dots_saveable";
    case Kind::dots_with_no_batch_dims_saveable: return "dots_with_no_batch_dims_saveable";
    case Kind::offload_dot_with_no_batch_dims: return "offload_dot_with_no_batch_dims";
    case Kind::save_only_these_names: return fmt::format("save_only_these_names({})", names_text(p.save_names));
    case Kind::save_any_names_but_these: return fmt::format("save_any_names_but_these({})", names_text(p.save_names));
    case Kind::custom:  // as the JAX policy it is: explain prints "custom = save_and_offload_only_these_names(...)"
    case Kind::save_and_offload_only_these_names:
      return fmt::format("save_and_offload_only_these_names(save={}, offload={})", list(p.save_names),
                         list(p.offload_names));
    case Kind::save_and_offload_regex:
      return fmt::format("save_and_offload_only_these_names_regex(save={}, offload={})", quoted(p.save_regex),
                         quoted(p.offload_regex));
    case Kind::save_from_both_policies:
      return fmt::format("save_from_both_policies({}, {})", p.first->text, p.second->text);
    case Kind::combine:
      return fmt::format("combine({}, {}{})", p.first->text, p.second->text,
                         p.prefer ? (*p.prefer == Residency::save ? ", prefer=save" : ", prefer=offload") : "");
  }
  return "?";
}


struct Tok {
  enum Kind { ident, string, punct, end } kind;
  std::string text;
};

class Parser {
 public:
  Parser(const std::string& src, const Spelling& spelling, const CustomKeys& keys)
      : src_(src), spelling_(spelling), keys_(keys) {
    lex();
  }

  Policy policy() {
    Tok t = next();
    expect(t.kind == Tok::ident, t, "a policy name");
    auto preset = presets().find(t.text);
    if (preset != presets().end()) {  // written in MaxText names: spelled as the model's layer spells them
      Policy p = parse_policy(preset->second);
      for (std::vector<std::string>* list : {&p.save_names, &p.offload_names}) {
        std::vector<std::string> as_layer;
        for (const std::string& n : *list)
          if (std::string s = spelled(spelling_.preset, n); !listed(as_layer, s)) as_layer.push_back(s);
        *list = as_layer;
      }
      p.text = canonical(p);
      p.preset = t.text;
      return p;
    }
    static const std::map<std::string, Kind> plain = {
        {"none", Kind::none},
        {"auto", Kind::automatic},
        {"everything_saveable", Kind::everything_saveable},
        {"nothing_saveable", Kind::nothing_saveable},
        {"dots_saveable", Kind::dots_saveable},
        {"dots_with_no_batch_dims_saveable", Kind::dots_with_no_batch_dims_saveable},
        {"offload_dot_with_no_batch_dims", Kind::offload_dot_with_no_batch_dims},
    };
    Policy p;
    if (auto it = plain.find(t.text); it != plain.end()) {
      p.kind = it->second;
    } else if (t.text == "save_only_these_names" || t.text == "save_any_names_but_these") {
      p.kind = t.text == "save_only_these_names" ? Kind::save_only_these_names : Kind::save_any_names_but_these;
      p.save_names = name_list(")");
    } else if (t.text == "save_and_offload_only_these_names") {
      p.kind = Kind::save_and_offload_only_these_names;
      keyword_arguments(t.text, false, p);
      for (const std::string& n : p.save_names)
        CHECK(std::find(p.offload_names.begin(), p.offload_names.end(), n) == p.offload_names.end(),
              "remat policy '{}': '{}' is both saved and offloaded; the two name lists must be disjoint", src_, n);
    } else if (t.text == "save_and_offload_only_these_names_regex" || t.text == "_save_and_offload_only_these_names_regex") {
      p.kind = Kind::save_and_offload_regex;  // the underscored spelling: AXLearn's deprecated alias
      keyword_arguments(t.text, true, p);
      auto compiled = std::make_shared<Policy::Regexes>();
      for (auto [re, into] : {std::pair{&p.save_regex, &compiled->save}, std::pair{&p.offload_regex, &compiled->offload}}) {
        check_regex_size(*re);
        try {
          *into = std::regex(*re);
        } catch (const std::regex_error& e) {
          CHECK(false, "remat policy '{}': bad regular expression \"{}\": {}", src_, *re, e.what());
        }
      }
      p.regexes = std::move(compiled);
    } else if (t.text == "save_from_both_policies" || t.text == "combine") {
      p.kind = t.text == "combine" ? Kind::combine : Kind::save_from_both_policies;
      open();
      p.first = std::make_shared<Policy>(policy());
      comma();
      p.second = std::make_shared<Policy>(policy());
      if (p.kind == Kind::combine && peek(",")) {
        comma();
        keyword("prefer");
        Tok v = next();
        expect(v.kind == Tok::ident && (v.text == "save" || v.text == "offload"), v, "prefer=save or prefer=offload");
        p.prefer = v.text == "save" ? Residency::save : Residency::offload;
      }
      close();
      CHECK(p.kind != Kind::save_from_both_policies || (!p.first->can_offload() && !p.second->can_offload()),
            "remat policy '{}': save_from_both_policies cannot combine offloading policies (as in JAX); use "
            "combine(P, Q, prefer=...)",
            src_);
    } else if (t.text == "custom") {
      return peek("(") ? custom_placement() : configured_placement();
    } else {
      std::vector<std::string> all = preset_names();
      CHECK(false, "unknown remat policy '{}' in '{}'; {} ({})", t.text, src_, kGrammar, fmt::join(all, ", "));
    }
    p.text = canonical(p);
    return p;
  }

  // Whether the policy took its placement from the per-name keys (a bare `custom`): it then prints as placed.
  bool placed_keys() const { return placed_keys_; }

  void done() {
    Tok t = next();
    expect(t.kind == Tok::end, t, "the end of the policy");
  }

 private:
  // std::regex compiles recursively and unrolls counted repeats: bound what it is given. Checkpoint names are
  // short identifiers, so a pattern for them is short and its counts small.
  void check_regex_size(const std::string& re) const {
    constexpr size_t kMaxLength = 1000;
    constexpr int kMaxCount = 100;  // in {m,n} and \k back-references
    CHECK(re.size() <= kMaxLength, "remat policy '{}': regular expression longer than {} characters", src_, kMaxLength);
    for (size_t i = 0; i < re.size(); ++i) {
      if (re[i] != '{' && re[i] != '\\') continue;
      for (size_t j = i + 1, n = 0; j < re.size() && (std::isdigit(static_cast<unsigned char>(re[j])) || re[j] == ','); ++j) {
        n = re[j] == ',' ? 0 : n * 10 + static_cast<size_t>(re[j] - '0');
        CHECK(n <= kMaxCount, "remat policy '{}': regular expression \"{}\": a count or back-reference above {}", src_,
              re, kMaxCount);
      }
    }
  }
  // Python's literal syntax where policies come from Python configs: '...' or "...", r"..." (raw: backslashes
  // kept), adjacent literals concatenated into one ("(a" "|b)" is "(a|b)"), `#` comments to the end of the
  // line, and the identifier None.
  void lex() {
    size_t i = 0;
    while (i < src_.size()) {
      char c = src_[i];
      const bool raw = (c == 'r' || c == 'R') && i + 1 < src_.size() && (src_[i + 1] == '"' || src_[i + 1] == '\'');
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i;
      } else if (c == '#') {
        while (i < src_.size() && src_[i] != '\n') ++i;
      } else if (raw || c == '"' || c == '\'') {
        std::string text = string_literal(i, raw);
        if (!toks_.empty() && toks_.back().kind == Tok::string) {  // adjacent literals: one string
          toks_.back().text += text;
        } else {
          toks_.push_back({Tok::string, text});
        }
      } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-') {
        size_t s = i;
        while (i < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[i])) || src_[i] == '_' ||
                                   src_[i] == '.' || src_[i] == '-'))
          ++i;
        toks_.push_back({Tok::ident, src_.substr(s, i - s)});
      } else if (std::string_view("()[],=").find(c) != std::string_view::npos) {
        toks_.push_back({Tok::punct, std::string(1, c)});
        ++i;
      } else {
        CHECK(false, "remat policy '{}': unexpected character '{}'; {}", src_, c, kGrammar);
      }
    }
    toks_.push_back({Tok::end, "<end>"});
  }
  // The literal starting at i (after an r prefix when raw); moves i past it. Outside raw literals \\, \"
  // and \' are unescaped and other escapes kept as written (Python keeps unknown ones, e.g. \. in a regex).
  std::string string_literal(size_t& i, bool raw) {
    if (raw) ++i;
    const char quote = src_[i++];
    std::string text;
    while (i < src_.size() && src_[i] != quote) {
      if (src_[i] == '\\' && i + 1 < src_.size()) {
        const char e = src_[i + 1];
        if (raw || (e != '\\' && e != '"' && e != '\'')) text += '\\';
        text += e;
        i += 2;
      } else {
        text += src_[i++];
      }
    }
    CHECK(i < src_.size(), "remat policy '{}': unterminated string (a {} opened but never closed)", src_, quote);
    ++i;
    return text;
  }
  // custom(name=remat|device|offload, ...), names in MaxText's spelling.
  Policy custom_placement() {
    std::vector<std::pair<std::string, Residency>> placement;
    open();
    for (bool first = true; !peek(")"); first = false) {
      if (!first) comma();
      if (peek(")")) break;  // a trailing comma, as Python allows
      Tok key = next();
      expect(key.kind == Tok::ident, key, "a checkpoint name");
      expect(next().text == "=", key, "name=remat|device|offload");
      Tok v = next();
      const std::optional<Residency> r = v.kind == Tok::ident ? custom_residency(v.text) : std::nullopt;
      expect(r.has_value(), v, "remat, device or offload");
      placement.emplace_back(key.text, *r);
    }
    close();
    return custom_policy(placement, spelling_);
  }
  // A bare `custom`: the placement of the per-name config keys.
  Policy configured_placement() {
    CHECK(!keys_.empty(), "remat policy '{}': a bare custom places the names as the per-name config keys say "
          "(query_proj=offload, ...), and none were given; write custom(name=remat|device|offload, ...)", src_);
    std::vector<std::pair<std::string, Residency>> placement;
    for (const auto& [name, word] : keys_) {
      const std::optional<Residency> r = custom_residency(word);
      CHECK(r.has_value(), "remat policy 'custom': key '{}' is '{}'; expected remat, device or offload", name, word);
      placement.emplace_back(name, *r);
    }
    placed_keys_ = true;
    return custom_policy(placement, spelling_);
  }

  Tok next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }
  bool peek(const char* p) const { return toks_[pos_].kind == Tok::punct && toks_[pos_].text == p; }
  void expect(bool ok, const Tok& t, const std::string& wanted) const {
    CHECK(ok, "remat policy '{}': expected {}, got '{}'; {}", src_, wanted, t.text, kGrammar);
  }
  void punct(const char* p) { expect(peek(p), toks_[pos_], fmt::format("'{}'", p)), ++pos_; }
  void open() { punct("("); }
  void close() { punct(")"); }
  void comma() { punct(","); }
  void keyword(const char* k) {
    Tok t = next();
    expect(t.kind == Tok::ident && t.text == k, t, fmt::format("{}=", k));
    punct("=");
  }
  std::string string() {
    Tok t = next();
    expect(t.kind == Tok::string, t, "a quoted regular expression");
    return t.text;
  }
  // A regex argument: a string, or None (no pattern).
  std::string pattern() {
    if (toks_[pos_].kind == Tok::ident && toks_[pos_].text == "None") return ++pos_, "";
    return string();
  }
  // A name list argument: [a, "b"] or (a, "b"), or None (no names).
  std::vector<std::string> names() {
    if (toks_[pos_].kind == Tok::ident && toks_[pos_].text == "None") return ++pos_, std::vector<std::string>{};
    if (peek("(")) return name_list(")");
    return bracketed();
  }
  // The arguments of save_and_offload_only_these_names[_regex], keyword-only as in JAX and AXLearn: our short
  // save= and offload=, or JAX's names_which_can_be_saved=, names_which_can_be_offloaded=, offload_src=,
  // offload_dst= (the only memory kinds: "device" to "pinned_host"), each at most once, in any order.
  void keyword_arguments(const std::string& function, bool regex, Policy& p) {
    static const std::map<std::string, std::string> canonical_keyword = {
        {"save", "save"}, {"names_which_can_be_saved", "save"},
        {"offload", "offload"}, {"names_which_can_be_offloaded", "offload"},
        {"offload_src", "offload_src"}, {"offload_dst", "offload_dst"}};
    std::set<std::string> seen;
    open();
    for (bool first = true; !peek(")"); first = false) {
      if (!first) comma();
      if (peek(")")) break;  // a trailing comma, as Python (and black) writes it
      Tok key = next();
      const bool keyword = key.kind == Tok::ident && toks_[pos_].kind == Tok::punct && toks_[pos_].text == "=";
      CHECK(keyword, "remat policy '{}': {} takes keyword arguments only (as in JAX): save= (or "
            "names_which_can_be_saved=), offload= (or names_which_can_be_offloaded=), offload_src=, offload_dst=; "
            "got '{}'", src_, function, key.text);
      auto it = canonical_keyword.find(key.text);
      CHECK(it != canonical_keyword.end(), "remat policy '{}': {} has no keyword '{}'; it takes save= (or "
            "names_which_can_be_saved=), offload= (or names_which_can_be_offloaded=), offload_src=, offload_dst=",
            src_, function, key.text);
      CHECK(seen.insert(it->second).second, "remat policy '{}': {} is given twice ('{}')", src_, it->second, key.text);
      punct("=");
      if (it->second == "offload_src" || it->second == "offload_dst") {
        const char* allowed = it->second == "offload_src" ? "device" : "pinned_host";
        Tok v = next();
        CHECK(v.kind == Tok::string && v.text == allowed, "remat policy '{}': {}=\"{}\" is not supported; the only "
              "value is \"{}\" (offloading moves device memory to host memory)", src_, it->second, v.text, allowed);
      } else if (regex) {
        (it->second == "save" ? p.save_regex : p.offload_regex) = pattern();
      } else {
        (it->second == "save" ? p.save_names : p.offload_names) = names();
      }
    }
    close();
  }
  std::vector<std::string> name_list(const char* closer) {
    std::vector<std::string> names;
    if (std::string(closer) == ")") open();
    while (!peek(closer)) {
      if (!names.empty()) {
        comma();
        if (peek(closer)) break;  // a trailing comma, as in Python's ("a",)
      }
      Tok t = next();
      expect(t.kind == Tok::ident || t.kind == Tok::string, t, "a checkpoint name");
      names.push_back(t.text);
    }
    punct(closer);
    return names;
  }
  std::vector<std::string> bracketed() {
    punct("[");
    return name_list("]");
  }

  std::string src_;
  Spelling spelling_;
  CustomKeys keys_;
  bool placed_keys_ = false;
  std::vector<Tok> toks_;
  size_t pos_ = 0;
};

bool listed(const std::vector<std::string>& names, const std::string& n) {
  return std::find(names.begin(), names.end(), n) != names.end();
}

Verdict recompute(std::string rule) { return {Residency::recompute, std::move(rule)}; }

}  // namespace

bool Policy::can_offload() const {
  switch (kind) {
    case Kind::offload_dot_with_no_batch_dims: return true;
    case Kind::custom:
    case Kind::save_and_offload_only_these_names: return !offload_names.empty();
    case Kind::save_and_offload_regex: return !offload_regex.empty();
    case Kind::save_from_both_policies:
    case Kind::combine: return first->can_offload() || second->can_offload();
    default: return false;
  }
}

Policy parse_policy(const std::string& text, const Spelling& spelling, const CustomKeys& keys) {
  Parser p(text, spelling, keys);
  Policy policy = p.policy();
  p.done();
  if (!p.placed_keys()) policy.written = text;
  return policy;
}

Policy custom_policy(const std::vector<std::pair<std::string, Residency>>& placement, const Spelling& spelling) {
  std::map<std::string, Residency> where = {{spelled(spelling.custom, "decoder_layer_input"), Residency::save}};
  std::vector<std::string> items;
  for (const auto& [name, r] : placement) {
    where[spelled(spelling.custom, name)] = r;
    items.push_back(fmt::format("{}={}", name, custom_word(r)));
  }
  Policy p;
  p.kind = Kind::custom;
  p.preset = "custom";
  for (const auto& [name, r] : where) {
    if (r == Residency::save) p.save_names.push_back(name);
    if (r == Residency::offload) p.offload_names.push_back(name);
  }
  p.text = canonical(p);
  p.written = fmt::format("custom({})", fmt::join(items, ", "));
  return p;
}

Policy policy_of(Kind kind, std::vector<std::string> save, std::vector<std::string> offload) {
  ASSERT(kind != Kind::none && kind != Kind::automatic && kind != Kind::custom && kind != Kind::save_and_offload_regex &&
         kind != Kind::save_from_both_policies && kind != Kind::combine);
  ASSERT(offload.empty() || kind == Kind::save_and_offload_only_these_names);
  Policy p;
  p.kind = kind;
  p.save_names = std::move(save);
  p.offload_names = std::move(offload);
  p.text = canonical(p);
  p.written = p.text;
  return p;
}

const char* custom_word(Residency r) {
  return r == Residency::save ? "device" : r == Residency::offload ? "offload" : "remat";
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

Verdict evaluate(const Policy& p, const ir::Graph& graph, const ir::Node& producer, size_t output) {
  const bool is_dot = producer.op == ir::Op::dot_general;
  const bool no_batch = is_dot && producer.attrs.int_lists("batch")[0].empty();
  const bool named = producer.op == ir::Op::name;
  const std::string name = named ? producer.attrs.str("name") : "";
  switch (p.kind) {
    case Kind::none: return {Residency::save, "none: no remat region, every residual is kept"};
    case Kind::automatic:
      CHECK(false, "remat policy 'auto' reached a remat region: the policy search (search::search, run by the "
            "remat command) replaces it with the placement it picks before the model is traced");
      break;
    case Kind::everything_saveable: return {Residency::save, "everything_saveable"};
    case Kind::nothing_saveable: return recompute("nothing_saveable");
    case Kind::dots_saveable:
      return is_dot ? Verdict{Residency::save, "dots_saveable: a dot_general"} : recompute("dots_saveable: not a dot");
    case Kind::dots_with_no_batch_dims_saveable:
      if (no_batch) return {Residency::save, "dots_with_no_batch_dims_saveable: dot_general without batch dims"};
      return recompute(is_dot ? "dots_with_no_batch_dims_saveable: dot_general with batch dims"
                              : "dots_with_no_batch_dims_saveable: not a dot");
    case Kind::offload_dot_with_no_batch_dims:
      if (no_batch) return {Residency::offload, "offload_dot_with_no_batch_dims: dot_general without batch dims"};
      return recompute("offload_dot_with_no_batch_dims: everything else");
    case Kind::save_only_these_names:
      if (named && listed(p.save_names, name)) return {Residency::save, fmt::format("save_only_these_names: '{}' listed", name)};
      return recompute(named ? fmt::format("save_only_these_names: '{}' not listed", name)
                             : "save_only_these_names: unnamed");
    case Kind::save_any_names_but_these:
      if (named && !listed(p.save_names, name))
        return {Residency::save, fmt::format("save_any_names_but_these: '{}' not excluded", name)};
      return recompute(named ? fmt::format("save_any_names_but_these: '{}' excluded", name)
                             : "save_any_names_but_these: unnamed");
    case Kind::custom:
    case Kind::save_and_offload_only_these_names: {
      std::string label = p.kind == Kind::custom ? "custom" : "save_and_offload_only_these_names";
      if (named && listed(p.save_names, name)) return {Residency::save, fmt::format("{}: '{}' saved", label, name)};
      if (named && listed(p.offload_names, name))
        return {Residency::offload, fmt::format("{}: '{}' offloaded", label, name)};
      return recompute(named ? fmt::format("{}: '{}' not listed", label, name) : label + ": unnamed");
    }
    case Kind::save_and_offload_regex: {
      ASSERT(p.regexes != nullptr);  // compiled by parse_policy, the one maker of this kind
      if (named && !p.save_regex.empty() && std::regex_match(name, p.regexes->save))
        return {Residency::save, fmt::format("regex save=\"{}\" matches '{}'", p.save_regex, name)};
      if (named && !p.offload_regex.empty() && std::regex_match(name, p.regexes->offload))
        return {Residency::offload, fmt::format("regex offload=\"{}\" matches '{}'", p.offload_regex, name)};
      return recompute(named ? fmt::format("regex: '{}' matches neither", name) : "regex: unnamed");
    }
    case Kind::save_from_both_policies: {
      Verdict a = evaluate(*p.first, graph, producer, output);
      if (a.residency == Residency::save) return a;
      Verdict b = evaluate(*p.second, graph, producer, output);
      return b.residency == Residency::save ? b : recompute("save_from_both_policies: neither saves");
    }
    case Kind::combine: {
      Verdict a = evaluate(*p.first, graph, producer, output);
      Verdict b = evaluate(*p.second, graph, producer, output);
      if (a.residency == Residency::recompute) return b;
      if (b.residency == Residency::recompute || a.residency == b.residency) return a;
      CHECK(p.prefer.has_value(),
            "remat policy '{}' gives two answers for {} (scope '{}'): '{}' and '{}'; add prefer=save or "
            "prefer=offload",
            p.text, named ? "'" + name + "'" : std::string(ir::op_name(producer.op)), producer.scope, a.rule, b.rule);
      return a.residency == *p.prefer ? a : b;
    }
  }
  return recompute("?");
}

}  // namespace remat::rematerialize
