#include "ir/fuse.h"

#include "base/check.h"
#include "ir/dce.h"

#include <algorithm>
#include <fmt/format.h>

namespace remat::ir {
namespace {

struct Group {
  std::vector<size_t> members = {};     // node indices, in order
  std::vector<ValueId> external = {};   // values read from outside: the fusion's operands
  std::vector<ValueId> broadcasts = {};  // broadcasts and constants (iota, full) copied into the fusion
  Shape shape = {};
  bool recomputed = false;
  bool read_outside = false;       // closed: a node outside has read one of its values
  int epoch = 0;                   // the effectful ops before it: an effect since closes it
  bool merged = false;             // merged into another group
  int values() const { return static_cast<int>(members.size() + external.size() + broadcasts.size()); }
};

bool fusible(const Graph& g, const Node& n) {
  return is_fusible(n.op) && n.outputs.size() == 1 &&
         !(n.op == Op::div && g.type(n.inputs[0]).dtype == DType::i32);
}

class Fuser {
 public:
  explicit Fuser(Graph& g) : g_(g), def_(g.types.size(), -1), group_of_(g.types.size(), -1) {
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (ValueId v : g.nodes[i].outputs) def_[static_cast<size_t>(v)] = static_cast<int>(i);
  }

  // Whether it made a fusion.
  bool run() {
    for (size_t i = 0; i < g_.nodes.size(); ++i) take(i);
    rewrite();
    return fusions_ > 0;
  }

 private:
  // Whether `v` is an iota, a full, or a broadcast whose operand is not group `gid`'s own: copied into a fusion.
  bool absorbable(ValueId v, int gid) const {
    const int d = def_[static_cast<size_t>(v)];
    if (d < 0) return false;
    const Node& n = g_.nodes[static_cast<size_t>(d)];
    if (n.op == Op::iota || n.op == Op::full) return true;
    if (n.op != Op::broadcast_in_dim) return false;
    return gid < 0 || group_of_[static_cast<size_t>(n.inputs[0])] != gid;
  }

  // What node `i` adds to group `gid` (-1: a new group): its operands from outside, and broadcasts.
  void add_reads(Group& grp, int gid, const Node& n) {
    auto note = [](std::vector<ValueId>& list, ValueId v) {
      if (std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
    };
    for (ValueId v : n.inputs) {
      if (group_of_[static_cast<size_t>(v)] == gid && gid >= 0) continue;
      if (absorbable(v, gid)) {
        note(grp.broadcasts, v);
        const Node& d = g_.nodes[static_cast<size_t>(def_[static_cast<size_t>(v)])];
        if (!d.inputs.empty()) note(grp.external, d.inputs[0]);
      } else {
        note(grp.external, v);
      }
    }
  }

  void take(size_t i) {
    const Node& n = g_.nodes[i];
    int gid = -1;
    if (fusible(g_, n)) {
      const Shape& shape = g_.type(n.outputs[0]).shape;
      std::vector<int> joined;
      for (ValueId v : n.inputs) {
        const int o = group_of_[static_cast<size_t>(v)];
        if (o < 0 || std::find(joined.begin(), joined.end(), o) != joined.end()) continue;
        const Group& c = groups_[static_cast<size_t>(o)];
        if (!c.read_outside && c.epoch == epoch_ && c.shape == shape && c.recomputed == n.recomputed) joined.push_back(o);
      }
      gid = joined.empty() ? new_group(shape, n.recomputed) : joined[0];
      if (!within_limit(gid, joined, n)) gid = new_group(shape, n.recomputed);
      else
        for (size_t k = 1; k < joined.size(); ++k) merge(joined[k], gid);
      Group& grp = groups_[static_cast<size_t>(gid)];
      add_reads(grp, gid, n);
      grp.members.push_back(i);
      group_of_[static_cast<size_t>(n.outputs[0])] = gid;
    }
    for (ValueId v : n.inputs) {  // a read from outside closes a group
      const int o = group_of_[static_cast<size_t>(v)];
      if (o >= 0 && o != gid) groups_[static_cast<size_t>(o)].read_outside = true;
    }
    if (is_effectful(n.op)) ++epoch_;  // and an effect closes them all: no fusion spans a message or a collective
  }

  int new_group(const Shape& shape, bool recomputed) {
    groups_.push_back(Group{.shape = shape, .recomputed = recomputed, .epoch = epoch_});
    return static_cast<int>(groups_.size()) - 1;
  }

  // Whether the groups `joined` (into `gid`) and node `n` together fit a fusion's body.
  bool within_limit(int gid, const std::vector<int>& joined, const Node& n) {
    Group trial = groups_[static_cast<size_t>(gid)];
    for (size_t k = 1; k < joined.size(); ++k) {
      const Group& o = groups_[static_cast<size_t>(joined[k])];
      trial.members.insert(trial.members.end(), o.members.begin(), o.members.end());
      trial.external.insert(trial.external.end(), o.external.begin(), o.external.end());
      trial.broadcasts.insert(trial.broadcasts.end(), o.broadcasts.begin(), o.broadcasts.end());
    }
    add_reads(trial, -1, n);  // an upper bound: reads of the joined groups' values counted as operands
    return trial.values() + 1 <= kMaxFusionValues;
  }

  void merge(int from, int into) {
    Group& a = groups_[static_cast<size_t>(from)];
    Group& b = groups_[static_cast<size_t>(into)];
    for (size_t m : a.members) group_of_[static_cast<size_t>(g_.nodes[m].outputs[0])] = into;
    b.members.insert(b.members.end(), a.members.begin(), a.members.end());
    std::sort(b.members.begin(), b.members.end());
    for (ValueId v : a.external)
      if (group_of_[static_cast<size_t>(v)] != into && std::find(b.external.begin(), b.external.end(), v) == b.external.end())
        b.external.push_back(v);
    std::erase_if(b.external, [&](ValueId v) { return group_of_[static_cast<size_t>(v)] == into; });
    for (ValueId v : a.broadcasts)
      if (std::find(b.broadcasts.begin(), b.broadcasts.end(), v) == b.broadcasts.end()) b.broadcasts.push_back(v);
    a = Group{.merged = true};
  }

  bool worth_fusing(const Group& grp) const {
    return !grp.merged && (grp.members.size() >= 2 || (grp.members.size() == 1 && !grp.broadcasts.empty()));
  }

  // The fusion node of group `gid`: its body copies the members (and the broadcasts they read) in order.
  Node fusion_of(int gid, const std::vector<bool>& read_elsewhere) {
    const Group& grp = groups_[static_cast<size_t>(gid)];
    auto body = std::make_shared<Graph>();
    body->name = fmt::format("fusion{}", fusions_++);
    std::vector<ValueId> inner(g_.types.size(), -1);
    Node f;
    f.op = Op::fusion;
    auto operand = [&](ValueId v) {  // the body's param for outer value v
      if (inner[static_cast<size_t>(v)] < 0) {
        inner[static_cast<size_t>(v)] = body->add_param(fmt::format("x{}", body->params.size()), g_.type(v));
        f.inputs.push_back(v);
      }
      return inner[static_cast<size_t>(v)];
    };
    for (size_t i : grp.members) {
      Node m = g_.nodes[i];
      for (ValueId& v : m.inputs) {
        if (inner[static_cast<size_t>(v)] >= 0 && group_of_[static_cast<size_t>(v)] == gid) {
          v = inner[static_cast<size_t>(v)];
        } else if (std::find(grp.broadcasts.begin(), grp.broadcasts.end(), v) != grp.broadcasts.end()) {
          if (inner[static_cast<size_t>(v)] < 0) {
            Node b = g_.nodes[static_cast<size_t>(def_[static_cast<size_t>(v)])];
            if (!b.inputs.empty()) b.inputs = {operand(b.inputs[0])};
            b.outputs = {body->new_value(g_.type(v))};
            inner[static_cast<size_t>(v)] = b.outputs[0];
            body->nodes.push_back(std::move(b));
          }
          v = inner[static_cast<size_t>(v)];
        } else {
          v = operand(v);
        }
      }
      const ValueId out = m.outputs[0];
      m.outputs = {body->new_value(g_.type(out))};
      inner[static_cast<size_t>(out)] = m.outputs[0];
      if (read_elsewhere[static_cast<size_t>(out)]) {
        body->results.push_back(m.outputs[0]);
        f.outputs.push_back(out);
      }
      body->nodes.push_back(std::move(m));
    }
    const Node& last = g_.nodes[grp.members.back()];
    f.scope = last.scope;
    f.origin = last.origin;
    f.recomputed = grp.recomputed;
    f.body = std::move(body);
    ASSERT(f.body->num_values() <= kMaxFusionValues && !f.outputs.empty());
    return f;
  }

  void rewrite() {
    // Values read by a node outside their group, or results: a fusion's outputs.
    std::vector<bool> read_elsewhere(g_.types.size(), false);
    for (ValueId r : g_.results) read_elsewhere[static_cast<size_t>(r)] = true;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      const int own = fusible(g_, n) ? group_of_[static_cast<size_t>(n.outputs[0])] : -1;
      for (ValueId v : n.inputs) {
        const int o = group_of_[static_cast<size_t>(v)];
        if (o >= 0 && o != own) read_elsewhere[static_cast<size_t>(v)] = true;
      }
    }
    std::vector<Node> nodes;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = g_.nodes[i];
      const int gid = fusible(g_, n) ? group_of_[static_cast<size_t>(n.outputs[0])] : -1;
      if (gid < 0 || !worth_fusing(groups_[static_cast<size_t>(gid)])) {
        nodes.push_back(n);
        continue;
      }
      if (groups_[static_cast<size_t>(gid)].members.back() == i) nodes.push_back(fusion_of(gid, read_elsewhere));
    }
    g_.nodes = std::move(nodes);
  }

  Graph& g_;
  std::vector<int> def_;       // the node defining each value (-1: a param)
  std::vector<int> group_of_;  // the group whose member computes each value (-1: none)
  std::vector<Group> groups_;
  int epoch_ = 0;  // effectful ops taken so far
  int fusions_ = 0;
};

}  // namespace

bool reads_elementwise(const Node& n, size_t k) {
  if (n.op != Op::fusion) return is_elementwise(n.op);
  const ValueId p = n.body->params[k];
  for (const Node& m : n.body->nodes)
    if (m.op == Op::broadcast_in_dim && m.inputs[0] == p) return false;
  return true;
}

bool fuse(Graph& g) {
  bool changed = false;
  for (Node& n : g.nodes)
    if (n.op == Op::scan) changed = fuse(*n.body) || changed;
  changed = Fuser(g).run() || changed;
  return dce(g) || changed;
}

}  // namespace remat::ir
