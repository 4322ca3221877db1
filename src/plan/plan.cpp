#include "plan/plan.h"

#include "base/check.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace remat::plan {
namespace {

using ir::Graph;
using ir::Node;
using ir::Op;
using ir::ValueId;

int64_t aligned(int64_t bytes) { return (std::max<int64_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment; }

// The given order, except that two kinds of nodes move to just before their first consumer: those
// reading only loop-invariant values (the first `invariant` params, constants, and what is computed from
// them alone: constants and weight broadcasts then live for one step instead of the whole forward; in a
// scan body only the consts are invariant, the carries and slices change every iteration), and
// recomputes (a rematerialized value is rebuilt just in time for the backward that reads it) unless the
// whole graph is a recompute (the body of a recomputed scan: there it keeps its order). And a node whose
// every result is a stacked result (from `stacked`: made in its slice of the scan's output, no arena bytes)
// moves up to just after its operands are made: a layer's weight gradient widened to f32 then ends its
// bf16 operand's life at once, where the VJP of the layer's first node would widen it at the body's end.
std::vector<int> schedule(const Graph& g, size_t invariant, bool float_recomputes, size_t stacked) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<int> producer(g.types.size(), -1);
  for (int i = 0; i < n; ++i)
    for (ValueId v : g.nodes[static_cast<size_t>(i)].outputs) producer[static_cast<size_t>(v)] = i;
  std::vector<bool> variant(g.types.size(), false);
  for (size_t k = invariant; k < g.params.size(); ++k) variant[static_cast<size_t>(g.params[k])] = true;
  std::vector<bool> floating(static_cast<size_t>(n), false);
  for (int i = 0; i < n; ++i) {
    bool all = true;
    for (ValueId v : g.nodes[static_cast<size_t>(i)].inputs) {
      int p = producer[static_cast<size_t>(v)];
      all = all && (p < 0 ? !variant[static_cast<size_t>(v)] : floating[static_cast<size_t>(p)]);
    }
    const Node& node = g.nodes[static_cast<size_t>(i)];
    // Effectful nodes never move (so they keep their order among themselves), nor do scans; a fusion is one
    // kernel and moves like one.
    floating[static_cast<size_t>(i)] = (all || (float_recomputes && node.recomputed)) &&
                                       (!node.body || node.op == Op::fusion) && !ir::is_effectful(node.op);
  }
  std::vector<std::vector<int>> consumers(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    for (ValueId v : g.nodes[static_cast<size_t>(i)].inputs)
      if (int p = producer[static_cast<size_t>(v)]; p >= 0) consumers[static_cast<size_t>(p)].push_back(i);
  std::vector<bool> early(static_cast<size_t>(n), false);
  for (int i = 0; i < n; ++i) {
    const Node& node = g.nodes[static_cast<size_t>(i)];
    bool all = !node.outputs.empty() && !node.body && !ir::is_effectful(node.op) && !ir::is_view(node.op) &&
               node.op != Op::convert_group && !floating[static_cast<size_t>(i)];
    for (ValueId v : node.outputs)
      all = all && std::count(g.results.begin() + static_cast<std::ptrdiff_t>(std::min(stacked, g.results.size())),
                              g.results.end(), v) == 1 &&
            std::count(g.results.begin(), g.results.end(), v) == 1;
    early[static_cast<size_t>(i)] = all;
  }
  std::vector<bool> placed(static_cast<size_t>(n), false);
  std::vector<int> order;
  auto ready = [&](int i) {
    for (ValueId v : g.nodes[static_cast<size_t>(i)].inputs)
      if (int p = producer[static_cast<size_t>(v)]; p >= 0 && !placed[static_cast<size_t>(p)]) return false;
    return true;
  };
  // Place a node (and, first, its floating inputs) where the order reaches it or its first consumer needs it;
  // then each early node it made ready.
  std::function<void(int)> place = [&](int i) {
    if (placed[static_cast<size_t>(i)]) return;
    for (ValueId v : g.nodes[static_cast<size_t>(i)].inputs)
      if (int p = producer[static_cast<size_t>(v)]; p >= 0) place(p);
    if (placed[static_cast<size_t>(i)]) return;  // an early node, placed as its last operand was made
    placed[static_cast<size_t>(i)] = true;
    order.push_back(i);
    for (int c : consumers[static_cast<size_t>(i)])
      if (early[static_cast<size_t>(c)] && !placed[static_cast<size_t>(c)] && ready(c)) place(c);
  };
  for (int i = 0; i < n; ++i) {
    bool used = !consumers[static_cast<size_t>(i)].empty();
    if (floating[static_cast<size_t>(i)] && used) continue;  // placed by its first consumer
    place(i);
  }
  return order;
}

// The buffers `ids` as an implicit balanced search tree by start (each range's middle its root), each subtree
// knowing its latest end: finds the buffers whose lifetimes overlap a given one in O(log n + overlaps), which
// keeps planning a long program (a pipeline rank's, thousands of actions) from growing quadratically.
class Overlaps {
 public:
  Overlaps(const std::vector<Buffer>& buffers, std::vector<int> ids) : buffers_(buffers), ids_(std::move(ids)) {
    std::sort(ids_.begin(), ids_.end(), [&](int a, int b) { return at(a).start < at(b).start; });
    latest_end_.resize(ids_.size());
    build(0, ids_.size());
  }
  // Calls f(id) for each buffer whose [start, end] meets [start, end].
  template <class F>
  void each(int start, int end, const F& f) const {
    visit(0, ids_.size(), start, end, f);
  }

 private:
  const Buffer& at(int id) const { return buffers_[static_cast<size_t>(id)]; }
  int build(size_t lo, size_t hi) {
    if (lo >= hi) return -1;
    const size_t mid = lo + (hi - lo) / 2;
    latest_end_[mid] = std::max({at(ids_[mid]).end, build(lo, mid), build(mid + 1, hi)});
    return latest_end_[mid];
  }
  template <class F>
  void visit(size_t lo, size_t hi, int start, int end, const F& f) const {
    if (lo >= hi) return;
    const size_t mid = lo + (hi - lo) / 2;
    if (latest_end_[mid] < start) return;  // the whole subtree ends before
    visit(lo, mid, start, end, f);
    const Buffer& y = at(ids_[mid]);
    if (y.start > end) return;  // it and every buffer to its right start after
    if (y.end >= start) f(ids_[mid]);
    visit(mid + 1, hi, start, end, f);
  }
  const std::vector<Buffer>& buffers_;
  std::vector<int> ids_;
  std::vector<int> latest_end_;
};

// Offsets by a best-fit heap, in the given order of buffers; returns the arena size.
int64_t place(std::vector<Buffer>& buffers, const std::vector<int>& order) {
  const Overlaps overlaps(buffers, order);  // lifetimes do not change here, offsets do
  int64_t top = 0;
  std::vector<bool> done(buffers.size(), false);
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, offset+bytes) of time-overlapping buffers
  for (int b : order) {
    Buffer& x = buffers[static_cast<size_t>(b)];
    busy.clear();
    overlaps.each(x.start, x.end, [&](int d) {
      const Buffer& y = buffers[static_cast<size_t>(d)];
      if (done[static_cast<size_t>(d)]) busy.emplace_back(y.offset, y.offset + y.bytes);
    });
    std::sort(busy.begin(), busy.end());
    int64_t best = -1, best_gap = INT64_MAX, cursor = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo - cursor >= x.bytes && lo - cursor < best_gap) best = cursor, best_gap = lo - cursor;
      cursor = std::max(cursor, hi);
    }
    x.offset = best >= 0 ? best : cursor;
    top = std::max(top, x.offset + x.bytes);
    done[static_cast<size_t>(b)] = true;
  }
  return top;
}

// Tries size-ordered and start-ordered placement and keeps the smaller arena (as XLA's heap simulator does).
void assign_offsets(Plan& p, Space space) {
  std::vector<int> ids;
  for (size_t b = 0; b < p.buffers.size(); ++b)
    if (p.buffers[b].space == space) ids.push_back(static_cast<int>(b));
  std::vector<int> by_size = ids, by_start = ids;
  std::stable_sort(by_size.begin(), by_size.end(), [&](int a, int b) {
    return p.buffers[static_cast<size_t>(a)].bytes > p.buffers[static_cast<size_t>(b)].bytes;
  });
  std::stable_sort(by_start.begin(), by_start.end(), [&](int a, int b) {
    const Buffer &x = p.buffers[static_cast<size_t>(a)], &y = p.buffers[static_cast<size_t>(b)];
    return std::pair(x.start, -(x.end - x.start)) < std::pair(y.start, -(y.end - y.start));
  });
  std::vector<Buffer> trial = p.buffers;
  int64_t a = place(p.buffers, by_size), b = place(trial, by_start);
  if (b < a) p.buffers = trial;
  p.arena[static_cast<int>(space)] = std::min(a, b);
}

// Where each value's storage is written (`def`) and last read (`last`), in schedule steps, and the space it
// lives in; a view's are its operand's (Plan::root).
struct Lifetimes {
  std::vector<int> def, last;
  std::vector<Space> space;
};

Lifetimes lifetimes(const Graph& g, Plan& p, int end) {
  p.root.resize(g.types.size());
  std::iota(p.root.begin(), p.root.end(), 0);
  Lifetimes t{std::vector<int>(g.types.size(), -1), std::vector<int>(g.types.size(), -1),
              std::vector<Space>(g.types.size(), Space::device)};
  std::vector<int>& def = t.def;
  std::vector<int>& last = t.last;
  std::vector<Space>& space = t.space;
  for (int s = 0; s < end; ++s) {
    const Node& node = g.nodes[static_cast<size_t>(p.schedule[static_cast<size_t>(s)])];
    for (ValueId v : node.inputs) last[static_cast<size_t>(p.root[static_cast<size_t>(v)])] = s;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      ValueId v = node.outputs[k];
      if (ir::is_view(node.op)) {
        p.root[static_cast<size_t>(v)] = p.root[static_cast<size_t>(node.inputs[0])];
        space[static_cast<size_t>(v)] = space[static_cast<size_t>(node.inputs[0])];
      } else {
        def[static_cast<size_t>(v)] = s;
        if (node.op == Op::offload) space[static_cast<size_t>(v)] = Space::host;
        if (node.op == Op::scan && k >= static_cast<size_t>(ir::scan_attrs(node.attrs).num_carry)) {
          const Graph& body = *node.body;
          // A stacked output lives where the body's result does (an offload in the body: host).
          ValueId r = body.results[k];
          for (const Node& m : body.nodes)
            if (m.op == Op::offload && m.outputs[0] == r) space[static_cast<size_t>(v)] = Space::host;
        }
      }
    }
  }
  for (ValueId r : g.results) last[static_cast<size_t>(p.root[static_cast<size_t>(r)])] = end;
  return t;
}

// The operand whose storage result `r` of `node` may take: ir::in_place_operand's, or for a scan's final carry its
// initial value, when no other operand of the scan reads that storage (the loop updates the carry in place, while
// a const or xs would still be read whole).
int in_place_input(const Node& node, size_t r, const std::vector<ValueId>& root) {
  if (node.op != Op::scan) return ir::in_place_operand(node.op, r);
  const ir::ScanAttrs scan = ir::scan_attrs(node.attrs);
  if (r >= static_cast<size_t>(scan.num_carry)) return -1;
  const size_t k = static_cast<size_t>(scan.num_consts) + r;
  const ValueId from = root[static_cast<size_t>(node.inputs[k])];
  for (size_t q = 0; q < node.inputs.size(); ++q)
    if (q != k && root[static_cast<size_t>(node.inputs[q])] == from) return -1;
  return static_cast<int>(k);
}

void write_in_place(const Graph& g, Plan& p, Lifetimes& t, int end) {
  std::vector<int>& def = t.def;
  std::vector<int>& last = t.last;
  const std::vector<Space>& space = t.space;
  // In place: a kernel that may write a result over an operand (ir::in_place_operand), or a scan its final carry
  // over the initial one, does, when that operand's storage is a plain temporary of the result's size that nothing
  // reads afterwards. The result (and its views) then takes the operand's storage, whose buffer lives on to the
  // result's last use.
  for (int s = 0; s < end; ++s) {
    const Node& node = g.nodes[static_cast<size_t>(p.schedule[static_cast<size_t>(s)])];
    std::vector<ValueId> taken;  // storage a result of this node already took (one operand read twice)
    for (size_t r = 0; r < node.outputs.size(); ++r) {
      const int k = in_place_input(node, r, p.root);
      if (k < 0) continue;
      const ValueId out = node.outputs[r], from = p.root[static_cast<size_t>(node.inputs[static_cast<size_t>(k)])];
      const int d = def[static_cast<size_t>(from)];
      if (std::find(taken.begin(), taken.end(), from) != taken.end()) continue;
      taken.push_back(from);
      if (d < 0 || last[static_cast<size_t>(from)] != s || g.type(from).bytes() != g.type(out).bytes() ||
          space[static_cast<size_t>(from)] != Space::device)
        continue;
      const Op made_by = g.nodes[static_cast<size_t>(p.schedule[static_cast<size_t>(d)])].op;
      if (made_by == Op::convert_group || made_by == Op::scan) continue;  // shared or stacked storage
      for (ValueId& v : p.root)
        if (v == out) v = from;
      last[static_cast<size_t>(from)] = std::max(s, last[static_cast<size_t>(out)]);  // a result nobody reads: its step
    }
  }
}

// The values written into a param's storage (-1: none), Plan::donated_param set.
std::vector<int> donate(const Graph& g, Plan& p, const Lifetimes& t, const Options& options) {
  const std::vector<int>& def = t.def;
  const std::vector<int>& last = t.last;
  // Donation: a result written into a param's storage, when that param is dead by the result's definition.
  p.donated_param.assign(g.results.size(), -1);
  std::vector<int> donated_into(g.types.size(), -1);
  std::vector<bool> param_taken(g.params.size(), false);
  for (const auto& [ri, pi] : options.donate) {
    CHECK(ri >= 0 && static_cast<size_t>(ri) < g.results.size() && pi >= 0 && static_cast<size_t>(pi) < g.params.size(),
          "plan::build: donation ({}, {}) is out of range for @{} ({} results, {} params)", ri, pi, g.name,
          g.results.size(), g.params.size());
    if (param_taken[static_cast<size_t>(pi)]) continue;  // one result per argument buffer
    ValueId r = g.results[static_cast<size_t>(ri)], param = g.params[static_cast<size_t>(pi)];
    ValueId rr = p.root[static_cast<size_t>(r)];
    bool ok = def[static_cast<size_t>(rr)] >= 0 && g.type(r) == g.type(param) &&
              last[static_cast<size_t>(param)] <= def[static_cast<size_t>(rr)] && donated_into[static_cast<size_t>(rr)] < 0 &&
              std::count(g.results.begin(), g.results.end(), r) == 1 && rr == r;
    // The defining node must not read the param, directly or through an alias (it would be overwritten
    // while read), unless it reads it elementwise (each element is read before it is written).
    if (ok) {
      const Node& d = g.nodes[static_cast<size_t>(p.schedule[static_cast<size_t>(def[static_cast<size_t>(rr)])])];
      for (size_t k = 0; k < d.inputs.size(); ++k)
        ok = ok && (p.root[static_cast<size_t>(d.inputs[k])] != param || ir::reads_elementwise(d, k));
    }
    if (ok) {
      p.donated_param[static_cast<size_t>(ri)] = pi;
      donated_into[static_cast<size_t>(rr)] = pi;
      param_taken[static_cast<size_t>(pi)] = true;
    }
  }
  return donated_into;
}

// The values made in their slice of a stacked result (Plan::in_slice set).
std::vector<bool> in_slices(const Graph& g, Plan& p, const Lifetimes& t, const Options& options) {
  const std::vector<int>& def = t.def;
  // Stacked in place (a scan body's ys): a result made by a body node (or a view of one) takes its slice of the
  // stacked output as storage. Not a param's view, nor a convert_group's shared buffer, nor a value that is two
  // results (two slices).
  p.in_slice.assign(g.results.size(), false);
  std::vector<bool> made_in_slice(g.types.size(), false);
  for (size_t r = std::min(options.stacked_results_from, g.results.size()); r < g.results.size(); ++r) {
    const ValueId rr = p.root[static_cast<size_t>(g.results[r])];
    const auto same_root = [&](ValueId x) { return p.root[static_cast<size_t>(x)] == rr; };
    if (def[static_cast<size_t>(rr)] < 0 || std::count_if(g.results.begin(), g.results.end(), same_root) != 1 ||
        g.nodes[static_cast<size_t>(p.schedule[static_cast<size_t>(def[static_cast<size_t>(rr)])])].op == Op::convert_group)
      continue;
    p.in_slice[r] = true;
    made_in_slice[static_cast<size_t>(rr)] = true;
  }
  return made_in_slice;
}

// The buffers: each scan body's sub-arena, each kernel's workspace, each value that owns its storage.
// The scan bodies planned so far in one build, with the options they were planned under: a pipeline rank's
// program holds each chunk's bodies once per microbatch, copies of one another, planned once.
struct BodyPlans {
  struct Made {
    const Graph* body;
    int64_t consts, carries;
    bool recomputed;
    const Plan* plan;
  };
  std::vector<Made> made;
};

Plan build(const Graph& g, const Options& options, BodyPlans& known);

void make_buffers(const Graph& g, Plan& p, const Lifetimes& t, const Options& options,
                  const std::vector<int>& donated_into, const std::vector<bool>& made_in_slice, int end,
                  BodyPlans& known) {
  const std::vector<int>& last = t.last;
  const std::vector<Space>& space = t.space;
  p.buffer_of.assign(g.types.size(), -2);
  p.within.assign(g.types.size(), 0);
  for (ValueId v : g.params) p.buffer_of[static_cast<size_t>(v)] = -1;
  for (int s = 0; s < end; ++s) {
    const int i = p.schedule[static_cast<size_t>(s)];
    const Node& node = g.nodes[static_cast<size_t>(i)];
    if (node.op == Op::scan) {
      const ir::ScanAttrs scan = ir::scan_attrs(node.attrs);
      auto same = [&](const BodyPlans::Made& m) {
        return m.consts == scan.num_consts && m.carries == scan.num_carry && m.recomputed == node.recomputed &&
               ir::same_computation(*m.body, *node.body);
      };
      auto it = std::find_if(known.made.begin(), known.made.end(), same);
      Plan body = it != known.made.end() ? *it->plan
                                         : build(*node.body,
                                                 {.donate = {},
                                                  .invariant_params = static_cast<size_t>(scan.num_consts),
                                                  .stacked_results_from = static_cast<size_t>(scan.num_carry),
                                                  .float_recomputes = !node.recomputed,
                                                  .workspace = options.workspace},
                                                 known);
      for (Space sp : {Space::device, Space::host}) {
        if (body.arena[static_cast<int>(sp)] == 0) continue;
        Buffer sub;
        sub.node = i;
        sub.bytes = aligned(body.arena[static_cast<int>(sp)]);
        sub.start = sub.end = s;
        sub.space = sp;
        (sp == Space::device ? p.body_buffer : p.body_host_buffer)[i] = static_cast<int>(p.buffers.size());
        p.buffers.push_back(sub);
      }
      const Plan& kept = p.bodies.emplace(i, std::move(body)).first->second;
      if (it == known.made.end())
        known.made.push_back({node.body.get(), scan.num_consts, scan.num_carry, node.recomputed, &kept});
    }
    if (options.workspace && !ir::is_region(node.op)) {
      std::vector<ir::Type> in;
      for (ValueId v : node.inputs) in.push_back(g.type(v));
      if (const int64_t bytes = options.workspace(node, in); bytes > 0) {
        Buffer w;
        w.node = i;
        w.bytes = aligned(bytes);
        w.requested = bytes;
        w.start = w.end = s;
        w.workspace = true;
        p.workspace_buffer[i] = static_cast<int>(p.buffers.size());
        p.buffers.push_back(w);
      }
    }
    if (ir::is_view(node.op)) continue;
    if (node.op == Op::convert_group) {  // one buffer for all outputs, live until the last use of any
      Buffer b;
      b.value = node.outputs[0];
      b.node = i;
      b.start = b.end = s;
      for (ValueId v : node.outputs) {
        if (donated_into[static_cast<size_t>(v)] >= 0) {  // written into its argument, outside the group
          p.buffer_of[static_cast<size_t>(v)] = -1;
          continue;
        }
        p.within[static_cast<size_t>(v)] = b.bytes;
        b.bytes += aligned(g.type(v).bytes());
        b.end = std::max(b.end, last[static_cast<size_t>(v)]);
        p.buffer_of[static_cast<size_t>(v)] = static_cast<int>(p.buffers.size());
      }
      if (b.bytes > 0) p.buffers.push_back(b);
      continue;
    }
    for (ValueId v : node.outputs) {
      if (donated_into[static_cast<size_t>(v)] >= 0) {
        p.buffer_of[static_cast<size_t>(v)] = -1;
        continue;
      }
      if (p.root[static_cast<size_t>(v)] != v) continue;  // written in place over an operand
      if (made_in_slice[static_cast<size_t>(v)]) {
        p.buffer_of[static_cast<size_t>(v)] = kInSlice;
        continue;
      }
      Buffer b;
      b.value = v;
      b.node = i;
      b.bytes = aligned(g.type(v).bytes());
      b.start = s;
      b.end = std::max(s, last[static_cast<size_t>(v)]);  // an output nobody reads still needs its step
      b.space = space[static_cast<size_t>(v)];
      p.buffer_of[static_cast<size_t>(v)] = static_cast<int>(p.buffers.size());
      p.buffers.push_back(b);
    }
  }
  for (size_t v = 0; v < g.types.size(); ++v)
    if (p.root[v] != static_cast<ValueId>(v)) {
      p.buffer_of[v] = p.buffer_of[static_cast<size_t>(p.root[v])];
      p.within[v] = p.within[static_cast<size_t>(p.root[v])];
    }
}

Plan build(const Graph& g, const Options& options, BodyPlans& known) {
  Plan p;
  const int n = static_cast<int>(g.nodes.size());
  for (const Node& node : g.nodes)
    CHECK(node.op != Op::remat, "plan::build: graph @{} still has remat regions; inline them first", g.name);
  p.schedule = schedule(g, std::min(options.invariant_params, g.params.size()), options.float_recomputes,
                        options.stacked_results_from);
  p.position.assign(static_cast<size_t>(n), -1);
  for (int s = 0; s < static_cast<int>(p.schedule.size()); ++s) p.position[static_cast<size_t>(p.schedule[static_cast<size_t>(s)])] = s;
  const int end = static_cast<int>(p.schedule.size());  // results live through the last step
  Lifetimes t = lifetimes(g, p, end);
  write_in_place(g, p, t, end);
  const std::vector<int> donated_into = donate(g, p, t, options);
  const std::vector<bool> made_in_slice = in_slices(g, p, t, options);
  make_buffers(g, p, t, options, donated_into, made_in_slice, end, known);

  for (Space sp : {Space::device, Space::host}) {
    std::vector<int64_t>& live = p.live[static_cast<int>(sp)];
    live.assign(static_cast<size_t>(end + 1), 0);
    std::vector<int64_t> change(static_cast<size_t>(end + 2), 0);  // at each step: bytes allocated - freed
    for (const Buffer& b : p.buffers)
      if (b.space == sp) {
        change[static_cast<size_t>(b.start)] += b.bytes;
        change[static_cast<size_t>(b.end) + 1] -= b.bytes;
      }
    std::partial_sum(change.begin(), change.end() - 1, live.begin());
    p.lower_bound[static_cast<int>(sp)] = live.empty() ? 0 : *std::max_element(live.begin(), live.end());
    assign_offsets(p, sp);
  }
  return p;
}

}  // namespace

Plan build(const Graph& g, const Options& options) {
  BodyPlans known;
  return build(g, options, known);
}

std::string trace(const Plan& p, const Graph& g) {
  std::string out;
  std::vector<std::vector<int>> frees(p.schedule.size() + 1);
  for (size_t b = 0; b < p.buffers.size(); ++b) frees[static_cast<size_t>(p.buffers[b].end)].push_back(static_cast<int>(b));
  auto name = [&](const Buffer& b) {
    return b.value >= 0 ? fmt::format("%{}", b.value)
                        : fmt::format("{} of node #{}", b.workspace ? "workspace" : "body", b.node);
  };
  for (size_t s = 0; s < p.schedule.size(); ++s) {
    const int i = p.schedule[s];
    out += fmt::format("step {}: node #{} {}\n", s, i, ir::op_name(g.nodes[static_cast<size_t>(i)].op));
    for (size_t b = 0; b < p.buffers.size(); ++b) {
      const Buffer& x = p.buffers[b];
      if (x.start == static_cast<int>(s))
        out += fmt::format("  alloc {} {} B @{}{}\n", name(x), x.bytes, x.offset, x.space == Space::host ? " host" : "");
    }
    for (int b : frees[s]) out += fmt::format("  free  {}\n", name(p.buffers[static_cast<size_t>(b)]));
  }
  for (int b : frees[p.schedule.size()]) out += fmt::format("end: keep {}\n", name(p.buffers[static_cast<size_t>(b)]));
  out += fmt::format("arena {} B (lower bound {} B), host {} B\n", p.arena[0], p.lower_bound[0], p.arena[1]);
  return out;
}

}  // namespace remat::plan
