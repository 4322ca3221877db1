#include "ir/graph.h"

#include "base/check.h"

#include <fmt/format.h>

#include <atomic>
#include <iterator>

namespace remat::ir {

int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

std::string type_str(const Type& t) { return fmt::format("{}{}", dtype_name(t.dtype), shape_str(t.shape)); }

Attrs& Attrs::set(std::string key, AttrValue v) {
  for (auto& [k, old] : items_) {
    if (k == key) {
      old = std::move(v);
      return *this;
    }
  }
  items_.emplace_back(std::move(key), std::move(v));
  return *this;
}

void ScanAttrs::write(Attrs& a) const {
  a.set("length", length).set("num_consts", num_consts).set("num_carry", num_carry).set("reverse", reverse);
}

ScanAttrs scan_attrs(const Attrs& a) {
  return {.length = a.integer("length"), .num_consts = a.integer("num_consts"), .num_carry = a.integer("num_carry"),
          .reverse = a.boolean("reverse")};
}

bool Attrs::has(std::string_view key) const {
  for (const auto& item : items_)
    if (item.first == key) return true;
  return false;
}

const AttrValue& Attrs::get(std::string_view key) const {
  for (const auto& item : items_)
    if (item.first == key) return item.second;
  CHECK(false, "missing attribute '{}'", key);
  __builtin_unreachable();
}

void Attrs::kind_error(std::string_view key, const AttrValue& got, const AttrValue& wanted) {
  static constexpr const char* kinds[] = {"a boolean", "an integer", "a number", "a string",
                                          "a dtype",   "a list of integers", "a list of integer lists",
                                          "an object of a later stage"};
  static_assert(std::size(kinds) == std::variant_size_v<AttrValue>);
  CHECK(false, "attribute '{}' is {}, expected {}", key, kinds[got.index()], kinds[wanted.index()]);
  __builtin_unreachable();
}

ValueId Graph::new_value(Type t) {
  types.push_back(std::move(t));
  return static_cast<ValueId>(types.size() - 1);
}

ValueId Graph::add_param(std::string pname, Type t) {
  ValueId v = new_value(std::move(t));
  params.push_back(v);
  param_names.push_back(std::move(pname));
  return v;
}

Graph Graph::clone() const {
  Graph g = *this;
  for (Node& n : g.nodes)
    if (n.body) n.body = std::make_shared<Graph>(n.body->clone());
  return g;
}

bool same_computation(const Graph& a, const Graph& b) {
  if (a.types != b.types || a.params != b.params || a.results != b.results || a.nodes.size() != b.nodes.size())
    return false;
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const Node &x = a.nodes[i], &y = b.nodes[i];
    if (x.op != y.op || x.inputs != y.inputs || x.outputs != y.outputs || x.recomputed != y.recomputed ||
        !(x.attrs == y.attrs) || (x.body == nullptr) != (y.body == nullptr))
      return false;
    if (x.body && x.body != y.body && !same_computation(*x.body, *y.body)) return false;
  }
  return true;
}

uint64_t next_origin() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

std::string describe_node(const Graph& g, size_t node_index) {
  const Node& n = g.nodes.at(node_index);
  std::string s = fmt::format("node #{} {} in graph @{}", node_index, op_name(n.op), g.name);
  if (!n.scope.empty()) s += fmt::format(" (scope '{}')", n.scope);
  return s;
}

}  // namespace remat::ir
