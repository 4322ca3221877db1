// The IR's data structures: types, attributes, nodes and graphs.
// Invariants (checked by verify()):
//  - A Graph is closed: nodes read only its params and outputs of earlier nodes (topological order).
//  - Every ValueId is defined exactly once, and `types[id]` is its type.
//  - Higher-order nodes (scan) own a closed body graph, shared with no other node: passes rewrite bodies
//    in place, so copy graphs with clone(), never by plain assignment.
// Value ids are dense per graph but may have holes after passes; the printer renumbers.
#pragma once

#include "base/dtype.h"
#include "ir/ops.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace remat::ir {

using Shape = std::vector<int64_t>;
using ValueId = int32_t;

int64_t num_elements(const Shape& s);
std::string shape_str(const Shape& s);  // "[8,64]"

struct Type {
  DType dtype = DType::f32;
  Shape shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t num_elements() const { return ir::num_elements(shape); }
  int64_t bytes() const { return num_elements() * dtype_size(dtype); }
  bool operator==(const Type&) const = default;
  auto operator<=>(const Type&) const = default;  // an order, for maps keyed by types
};

std::string type_str(const Type& t);  // "f32[8,64]"

using IntList = std::vector<int64_t>;
using IntLists = std::vector<IntList>;
// A value a later stage defines and the IR carries without knowing it (a remat region's policy: remat/policy.h,
// as a jaxpr's remat equation holds its policy). Printed as its text, a quoted string (parsed back, it is that
// string); equal by the defining stage's rule.
struct AttrObject {
  virtual ~AttrObject() = default;
  virtual std::string text() const = 0;
  virtual bool equals(const AttrObject& other) const = 0;
};
struct ObjectAttr {
  std::shared_ptr<const AttrObject> object;
  bool operator==(const ObjectAttr& o) const {
    return object == o.object || (object && o.object && object->equals(*o.object));
  }
};
using AttrValue = std::variant<bool, int64_t, double, std::string, DType, IntList, IntLists, ObjectAttr>;

// Named attributes in insertion order (printed in that order).
class Attrs {
 public:
  Attrs() = default;
  Attrs& set(std::string key, AttrValue v);
  bool has(std::string_view key) const;
  // The typed accessors CHECK presence and kind: attributes parsed from text can be missing or mistyped.
  const AttrValue& get(std::string_view key) const;
  bool boolean(std::string_view key) const { return typed<bool>(key); }
  int64_t integer(std::string_view key) const { return typed<int64_t>(key); }
  double real(std::string_view key) const { return typed<double>(key); }
  const std::string& str(std::string_view key) const { return typed<std::string>(key); }
  DType dtype(std::string_view key) const { return typed<DType>(key); }
  const IntList& ints(std::string_view key) const { return typed<IntList>(key); }
  const IntLists& int_lists(std::string_view key) const { return typed<IntLists>(key); }
  const ObjectAttr& object(std::string_view key) const { return typed<ObjectAttr>(key); }
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  bool operator==(const Attrs&) const = default;

 private:
  template <class T>
  const T& typed(std::string_view key) const {
    const AttrValue& v = get(key);
    if (const T* p = std::get_if<T>(&v)) return *p;
    kind_error(key, v, AttrValue(T{}));
  }
  [[noreturn]] static void kind_error(std::string_view key, const AttrValue& got, const AttrValue& wanted);

  std::vector<std::pair<std::string, AttrValue>> items_;
};

// A scan's attributes (the `scan` op in ir/ops.h), typed: the one place their names are spelled. A scan's
// inputs are num_consts invariants, num_carry carries, then the stacked xs; its outputs the final carries,
// then the stacked ys.
struct ScanAttrs {
  int64_t length = 0;      // iterations
  int64_t num_consts = 0;  // the leading inputs, read whole by every iteration
  int64_t num_carry = 0;   // the carried values: the inputs after the constants, and the first outputs
  bool reverse = false;    // iterate from the last slice to the first
  void write(Attrs& a) const;  // sets the four (in place where `a` has them)
};
// Reads them from a scan's attributes; CHECKs presence and kind, as Attrs' accessors do.
ScanAttrs scan_attrs(const Attrs& a);

struct Graph;

struct Node {
  Op op = Op::add;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;
  std::string scope;               // module path, e.g. "decoder/layers/mlp/wi_0"
  std::shared_ptr<Graph> body;     // scan or remat body (closed graph); null for other ops
  bool recomputed = false;         // a clone that recomputes a forward value for the backward (prints op.remat)
  uint64_t origin = 0;             // identity of the traced op this node is, or recomputes; not printed
};

// Whether element i of each of `n`'s results depends only on element i of its operand `k` (an elementwise op;
// a fusion whose body reads that operand other than through a broadcast), so that a result may be written
// into the operand's storage (the planner's donation).
bool reads_elementwise(const Node& n, size_t k);

// A fresh origin id for a newly traced node (unique in the process).
uint64_t next_origin();

struct Graph {
  std::string name = "main";
  std::vector<Type> types;         // indexed by ValueId
  std::vector<ValueId> params;
  std::vector<std::string> param_names;  // parallel to params, unique within the graph
  std::vector<Node> nodes;
  std::vector<ValueId> results;

  ValueId new_value(Type t);
  ValueId add_param(std::string name, Type t);
  const Type& type(ValueId v) const { return types.at(static_cast<size_t>(v)); }
  int num_values() const { return static_cast<int>(types.size()); }
  // Deep copy: body graphs are cloned too, so the copy can be rewritten independently.
  Graph clone() const;
};

// Whether a and b are one computation: the same values (ids and types), params, results and nodes (ops,
// operands, attributes, recompute marks, bodies alike), whatever their names, scopes and origins. Copies of one
// template (ir::instantiate) are; the planner plans such bodies once.
bool same_computation(const Graph& a, const Graph& b);

// A node's human-readable location for messages: "node #12 dot_general (scope 'mlp/wi_0')".
std::string describe_node(const Graph& g, size_t node_index);

}  // namespace remat::ir
