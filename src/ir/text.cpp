// The IR's text form: a deterministic printer and a parser that reads it back exactly.
// Values are renumbered on print (params by name, node outputs %0, %1, ... in order), so
// print(parse(print(g))) == print(g) for every graph. `//` comments are skipped by the parser.
#include "ir/text.h"

#include "base/check.h"
#include "ir/verify.h"

#include <cctype>
#include <charconv>
#include <map>
#include <unordered_map>

namespace remat::ir {
namespace {

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

std::string double_str(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // keep it distinguishable from an integer
  return s;
}

std::string attr_str(const AttrValue& v) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return fmt::format("{}", i); }
    std::string operator()(double d) const { return double_str(d); }
    std::string operator()(const std::string& s) const { return quote(s); }
    std::string operator()(DType d) const { return std::string(dtype_name(d)); }
    std::string operator()(const IntList& l) const { return shape_str(l); }
    std::string operator()(const IntLists& ls) const {
      std::vector<std::string> parts;
      for (const IntList& l : ls) parts.push_back(shape_str(l));
      return fmt::format("[{}]", fmt::join(parts, ","));
    }
    std::string operator()(const ObjectAttr& o) const { return quote(o.object ? o.object->text() : ""); }
  };
  return std::visit(Visitor{}, v);
}

void print_graph(const Graph& g, std::string& out, const std::string& indent) {
  std::unordered_map<ValueId, std::string> names;
  std::vector<std::string> params;
  for (size_t i = 0; i < g.params.size(); ++i) {
    names[g.params[i]] = "%" + g.param_names[i];
    params.push_back(fmt::format("%{}: {}", g.param_names[i], type_str(g.type(g.params[i]))));
  }
  std::vector<std::string> result_types;
  for (ValueId r : g.results) result_types.push_back(type_str(g.type(r)));
  out += fmt::format("{}graph @{}({}) -> ({}) {{\n", indent, g.name, fmt::join(params, ", "),
                     fmt::join(result_types, ", "));
  int counter = 0;
  auto name_of = [&](ValueId v) {
    auto it = names.find(v);
    return it == names.end() ? fmt::format("%?{}", v) : it->second;
  };
  for (const Node& n : g.nodes) {
    std::vector<std::string> outs, ins, attrs;
    for (ValueId v : n.outputs) {
      names[v] = fmt::format("%{}", counter++);
      outs.push_back(fmt::format("{}: {}", names[v], type_str(g.type(v))));
    }
    for (ValueId v : n.inputs) ins.push_back(name_of(v));
    for (const auto& [k, v] : n.attrs.items()) attrs.push_back(fmt::format("{}={}", k, attr_str(v)));
    out += fmt::format("{}  {} = {}{}({})", indent, fmt::join(outs, ", "), op_name(n.op), n.recomputed ? ".remat" : "",
                       fmt::join(ins, ", "));
    if (!attrs.empty()) out += fmt::format(" {{{}}}", fmt::join(attrs, ", "));
    if (!n.scope.empty()) out += " scope=" + quote(n.scope);
    out += "\n";
    if (n.body) print_graph(*n.body, out, indent + "    ");
  }
  std::vector<std::string> results;
  for (ValueId r : g.results) results.push_back(name_of(r));
  out += fmt::format("{}  return {}\n{}}}\n", indent, fmt::join(results, ", "), indent);
}

// ---- parser ----

struct Token {
  enum Kind { kIdent, kValue, kGraphName, kNumber, kString, kPunct, kEnd } kind;
  std::string text;
  int line;
};

class Lexer {
 public:
  Lexer(std::string_view src, std::string_view file) : src_(src), file_(file) {}

  std::vector<Token> run() {
    std::vector<Token> toks;
    while (true) {
      skip_space();
      if (pos_ >= src_.size()) break;
      char c = src_[pos_];
      if (c == '%' || c == '@') {
        ++pos_;
        toks.push_back({c == '%' ? Token::kValue : Token::kGraphName, word(), line_});
      } else if (c == '"') {
        toks.push_back({Token::kString, string_literal(), line_});
      } else if (src_.substr(pos_, 2) == "->") {
        toks.push_back({Token::kPunct, "->", line_});
        pos_ += 2;
      } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '-') {
        size_t start = pos_++;
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '.' ||
                                      ((src_[pos_] == '-' || src_[pos_] == '+') && (src_[pos_ - 1] == 'e'))))
          ++pos_;
        toks.push_back({Token::kNumber, std::string(src_.substr(start, pos_ - start)), line_});
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        toks.push_back({Token::kIdent, word(), line_});
      } else if (std::string_view("(){}[],:=").find(c) != std::string_view::npos) {
        toks.push_back({Token::kPunct, std::string(1, c), line_});
        ++pos_;
      } else {
        CHECK(false, "{}:{}: unexpected character '{}' in IR text", file_, line_, c);
      }
    }
    toks.push_back({Token::kEnd, "<end of input>", line_});
    return toks;
  }

 private:
  void skip_space() {
    while (pos_ < src_.size()) {
      if (src_[pos_] == '\n') {
        ++line_;
        ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(src_[pos_]))) {
        ++pos_;
      } else if (src_.substr(pos_, 2) == "//") {
        while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  std::string word() {
    size_t start = pos_;
    // Names may hold '.', and '/' as in parameter paths (decoder/layers/mlp/wi_0/kernel), but not "//".
    auto name_char = [&](size_t i) {
      char c = src_[i];
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
             (c == '/' && i + 1 < src_.size() && src_[i + 1] != '/' && i > 0 && src_[i - 1] != '/');
    };
    while (pos_ < src_.size() && name_char(pos_)) ++pos_;
    CHECK(pos_ > start, "{}:{}: expected a name", file_, line_);
    return std::string(src_.substr(start, pos_ - start));
  }
  std::string string_literal() {
    ++pos_;
    std::string s;
    while (pos_ < src_.size() && src_[pos_] != '"') {
      if (src_[pos_] == '\\' && pos_ + 1 < src_.size()) ++pos_;
      CHECK(src_[pos_] != '\n', "{}:{}: unterminated string", file_, line_);
      s += src_[pos_++];
    }
    CHECK(pos_ < src_.size(), "{}:{}: unterminated string", file_, line_);
    ++pos_;
    return s;
  }

  std::string_view src_;
  std::string_view file_;
  size_t pos_ = 0;
  int line_ = 1;
};

class Parser {
 public:
  Parser(std::vector<Token> toks, std::string_view file) : toks_(std::move(toks)), file_(file) {}

  Graph graph() {
    expect_ident("graph");
    Graph g;
    const Token& name = next();
    check(name.kind == Token::kGraphName, name, "a graph name like @main");
    g.name = name.text;
    std::unordered_map<std::string, ValueId> values;
    expect("(");
    while (!accept(")")) {
      if (!g.params.empty()) expect(",");
      const Token& p = next();
      check(p.kind == Token::kValue && !std::isdigit(static_cast<unsigned char>(p.text[0])), p,
            "a parameter name like %x");
      expect(":");
      ValueId v = g.add_param(p.text, type());
      CHECK(values.emplace(p.text, v).second, "{}:{}: parameter %{} is declared twice", file_, p.line, p.text);
    }
    expect("->");
    expect("(");
    std::vector<Type> result_types;
    while (!accept(")")) {
      if (!result_types.empty()) expect(",");
      result_types.push_back(type());
    }
    expect("{");
    while (!peek_ident("return")) node(g, values);
    next();
    for (size_t i = 0; i < result_types.size(); ++i) {
      if (i > 0) expect(",");
      g.results.push_back(use(values, next()));
    }
    expect("}");
    for (size_t i = 0; i < result_types.size(); ++i)
      CHECK(g.type(g.results[i]) == result_types[i], "{}: graph @{} declares result {} as {} but returns {}", file_,
            g.name, i, type_str(result_types[i]), type_str(g.type(g.results[i])));
    return g;
  }

  void expect_end() {
    const Token& t = next();
    check(t.kind == Token::kEnd, t, "end of input");
  }

 private:
  void node(Graph& g, std::unordered_map<std::string, ValueId>& values) {
    Node n;
    std::vector<std::pair<const Token*, Type>> outs;
    do {
      const Token& v = next();
      check(v.kind == Token::kValue, v, "a value like %3 or 'return'");
      expect(":");
      outs.emplace_back(&v, type());
    } while (accept(","));
    expect("=");
    const Token& op = next();
    std::string_view op_text = op.text;
    constexpr std::string_view kRematSuffix = ".remat";
    if (op_text.ends_with(kRematSuffix)) {
      n.recomputed = true;
      op_text.remove_suffix(kRematSuffix.size());
    }
    auto parsed = parse_op(op_text);
    CHECK(op.kind == Token::kIdent && parsed, "{}:{}: unknown op '{}'", file_, op.line, op.text);
    n.op = *parsed;
    n.origin = next_origin();
    expect("(");
    while (!accept(")")) {
      if (!n.inputs.empty()) expect(",");
      n.inputs.push_back(use(values, next()));
    }
    if (accept("{")) {
      while (!accept("}")) {
        if (!n.attrs.items().empty()) expect(",");
        const Token& key = next();
        check(key.kind == Token::kIdent, key, "an attribute name");
        expect("=");
        n.attrs.set(key.text, attr());
      }
    }
    if (peek_ident("scope")) {
      next();
      expect("=");
      const Token& s = next();
      check(s.kind == Token::kString, s, "a quoted scope");
      n.scope = s.text;
    }
    if (peek_ident("graph")) n.body = std::make_shared<Graph>(graph());
    for (auto& [tok, t] : outs) {
      ValueId v = g.new_value(t);
      CHECK(values.emplace(tok->text, v).second, "{}:{}: value %{} is defined twice", file_, tok->line, tok->text);
      n.outputs.push_back(v);
    }
    g.nodes.push_back(std::move(n));
  }

  AttrValue attr() {
    const Token& t = next();
    if (t.kind == Token::kString) return t.text;
    if (t.kind == Token::kNumber) return number(t);
    if (t.kind == Token::kIdent) {
      if (t.text == "true" || t.text == "false") return t.text == "true";
      auto d = parse_dtype(t.text);
      if (d) return *d;
      if (t.text == "inf" || t.text == "nan") return number(t);
    }
    check(t.text == "[", t, "an attribute value");
    if (peek("[")) {
      IntLists ls;
      do ls.push_back(int_list_after_open(next_open())); while (accept(","));
      expect("]");
      return ls;
    }
    return int_list_after_open(t);
  }

  const Token& next_open() {
    expect("[");
    return toks_[pos_ - 1];
  }

  IntList int_list_after_open(const Token&) {
    IntList l;
    while (!accept("]")) {
      if (!l.empty()) expect(",");
      l.push_back(integer(next()));
    }
    return l;
  }

  AttrValue number(const Token& t) {
    if (t.text.find_first_of(".eni") != std::string::npos) {
      double d = 0;
      auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), d);
      CHECK(ec == std::errc() && p == t.text.data() + t.text.size(), "{}:{}: bad number '{}'", file_, t.line, t.text);
      return d;
    }
    return integer(t);
  }

  int64_t integer(const Token& t) {
    int64_t i = 0;
    auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), i);
    CHECK(t.kind == Token::kNumber && ec == std::errc() && p == t.text.data() + t.text.size(),
          "{}:{}: expected an integer, got '{}'", file_, t.line, t.text);
    return i;
  }

  Type type() {
    const Token& t = next();
    auto d = parse_dtype(t.text);
    CHECK(t.kind == Token::kIdent && d, "{}:{}: expected a type like f32[8,64], got '{}'", file_, t.line, t.text);
    return Type{*d, int_list_after_open(next_open())};
  }

  ValueId use(const std::unordered_map<std::string, ValueId>& values, const Token& t) {
    check(t.kind == Token::kValue, t, "a value like %3");
    auto it = values.find(t.text);
    CHECK(it != values.end(), "{}:{}: value %{} is used before it is defined", file_, t.line, t.text);
    return it->second;
  }

  const Token& next() {
    const Token& t = toks_[pos_];
    if (t.kind != Token::kEnd) ++pos_;
    return t;
  }
  bool peek(std::string_view p) const { return toks_[pos_].kind == Token::kPunct && toks_[pos_].text == p; }
  bool peek_ident(std::string_view w) const { return toks_[pos_].kind == Token::kIdent && toks_[pos_].text == w; }
  bool accept(std::string_view p) {
    if (!peek(p)) return false;
    ++pos_;
    return true;
  }
  void expect(std::string_view p) { check(accept(p), toks_[pos_], fmt::format("'{}'", p)); }
  void expect_ident(std::string_view w) {
    check(peek_ident(w), toks_[pos_], fmt::format("'{}'", w));
    ++pos_;
  }
  void check(bool ok, const Token& t, std::string_view wanted) const {
    CHECK(ok, "{}:{}: expected {}, got '{}'", file_, t.line, wanted, t.text);
  }

  std::vector<Token> toks_;
  std::string_view file_;
  size_t pos_ = 0;
};

}  // namespace

std::string print(const Graph& g) {
  std::string out;
  print_graph(g, out, "");
  return out;
}

Graph parse(std::string_view text, std::string_view file) {
  Parser p(Lexer(text, file).run(), file);
  Graph g = p.graph();
  p.expect_end();
  verify(g);
  return g;
}

std::string print_attr(const AttrValue& v) { return attr_str(v); }

}  // namespace remat::ir
