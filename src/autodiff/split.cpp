// A backward split into B (what the input's gradient needs) and W (the rest: the weights' gradients alone), for
// zero-bubble pipelines. A scanned backward (scan_layers) is one scan node computing both: it is split into a
// B scan (the carried input cotangent) and a W scan (the rest), the values W reads from B stacked per iteration.
#include "autodiff/autodiff.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

namespace remat::autodiff {

using namespace ir;

namespace {

// Walking nodes [first, end) of g from the last, the nodes with an output in `needed`, whose inputs become
// needed in turn (nodes read only earlier nodes' values).
std::vector<bool> mark_needed(const Graph& g, size_t first, std::vector<bool>& needed) {
  std::vector<bool> part(g.nodes.size(), false);
  for (size_t i = g.nodes.size(); i-- > first;) {
    for (ValueId v : g.nodes[i].outputs) part[i] = part[i] || needed[static_cast<size_t>(v)];
    if (part[i])
      for (ValueId v : g.nodes[i].inputs) needed[static_cast<size_t>(v)] = true;
  }
  return part;
}

// Gives W (the nodes of [first, end) not in `part`) its own copies of the recomputed B nodes whose values it
// reads, inserted before their first W reader, so that what a remat policy recomputes is recomputed again
// rather than kept from B until W runs. `part` follows the inserted nodes (false: W's).
void recompute_in_w(Graph& g, size_t first, std::vector<bool>& part) {
  std::vector<int64_t> producer(static_cast<size_t>(g.num_values()), -1);
  for (size_t i = first; i < g.nodes.size(); ++i)
    for (ValueId v : g.nodes[i].outputs) producer[static_cast<size_t>(v)] = static_cast<int64_t>(i);
  std::vector<Node> nodes(g.nodes.begin(), g.nodes.begin() + static_cast<std::ptrdiff_t>(first));
  std::vector<bool> out_part(part.begin(), part.begin() + static_cast<std::ptrdiff_t>(first));
  std::unordered_map<ValueId, ValueId> copy;  // B's recomputed value -> W's copy
  std::function<ValueId(ValueId)> in_w = [&](ValueId v) -> ValueId {
    const int64_t at = v < static_cast<ValueId>(producer.size()) ? producer[static_cast<size_t>(v)] : -1;
    if (at < 0 || !part[static_cast<size_t>(at)] || !g.nodes[static_cast<size_t>(at)].recomputed) return v;
    if (auto it = copy.find(v); it != copy.end()) return it->second;
    Node n = g.nodes[static_cast<size_t>(at)];
    for (ValueId& u : n.inputs) u = in_w(u);
    if (n.body) n.body = std::make_shared<Graph>(n.body->clone());
    for (ValueId& o : n.outputs) {
      const ValueId fresh = g.new_value(g.type(o));
      copy.emplace(o, fresh);
      o = fresh;
    }
    nodes.push_back(std::move(n));
    out_part.push_back(false);
    return copy.at(v);
  };
  for (size_t i = first; i < g.nodes.size(); ++i) {
    Node n = g.nodes[i];
    if (!part[i])
      for (ValueId& u : n.inputs) u = in_w(u);
    nodes.push_back(std::move(n));
    out_part.push_back(part[i]);
  }
  g.nodes = std::move(nodes);
  part = std::move(out_part);
}

// The scan `n` with body `nodes`, `params` (its inputs `inputs`, in order) and `results`, the types of `of`'s body;
// consts and xs its body does not read are dropped (so that the scan keeps nothing live it does not need).
// A param that is not one of `of`'s (a slice of B's stacked values) is named b0, b1, ...
void make_scan(Node& n, const Graph& of, std::string name, std::vector<Node> nodes, const std::vector<ValueId>& params,
               const std::vector<ValueId>& inputs, std::vector<ValueId> results, int64_t num_consts, int64_t num_carry) {
  std::vector<bool> read(static_cast<size_t>(of.num_values()), false);
  for (const Node& m : nodes)
    for (ValueId v : m.inputs) read[static_cast<size_t>(v)] = true;
  for (ValueId v : results) read[static_cast<size_t>(v)] = true;
  auto g = std::make_shared<Graph>();
  g->name = std::move(name);
  g->types = of.types;
  n.inputs.clear();
  int64_t consts = 0, crossing = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool carry = static_cast<int64_t>(i) >= num_consts && static_cast<int64_t>(i) < num_consts + num_carry;
    const bool is_const = static_cast<int64_t>(i) < num_consts;
    if (!carry && !read[static_cast<size_t>(params[i])]) continue;
    consts += is_const;
    g->params.push_back(params[i]);
    const auto it = std::find(of.params.begin(), of.params.end(), params[i]);
    g->param_names.push_back(it != of.params.end() ? of.param_names[static_cast<size_t>(it - of.params.begin())]
                                                   : fmt::format("b{}", crossing++));
    n.inputs.push_back(inputs[i]);
  }
  g->nodes = std::move(nodes);
  g->results = std::move(results);
  ScanAttrs a = scan_attrs(n.attrs);
  a.num_consts = consts, a.num_carry = num_carry;
  a.write(n.attrs);
  n.body = std::move(g);
}

// Marks B (what the values `needed` marks need, from node `first` on) and splits each scan of B that also
// computes values B does not need (split_scan), until none is left: per node, in B; `needed` grows to what B reads.
std::vector<bool> split_for(Graph& g, size_t first, std::vector<bool>& needed);

// Splits the scan g.nodes[index] whose outputs `wanted` (per output) B needs into a B scan, in its place, and a
// W scan after it: B carries what the wanted outputs need (a carry read by B is B's too), W the rest, reading
// B's per-iteration values as stacked xs. The outputs keep their ids. False where W would compute nothing.
bool split_scan(Graph& g, size_t index, std::vector<bool> wanted) {
  const Node s = g.nodes[index];
  Graph body = s.body->clone();
  const ScanAttrs a = scan_attrs(s.attrs);
  const size_t nc = static_cast<size_t>(a.num_consts), nh = static_cast<size_t>(a.num_carry);
  std::vector<bool> b_part, needed;
  for (bool changed = true; changed;) {  // a carry B reads is B's: its next value too
    needed.assign(static_cast<size_t>(body.num_values()), false);
    for (size_t k = 0; k < body.results.size(); ++k)
      if (wanted[k]) needed[static_cast<size_t>(body.results[k])] = true;
    b_part = split_for(body, 0, needed);  // a nested scan (layer groups) split too
    changed = false;
    for (size_t k = 0; k < nh; ++k)
      if (!wanted[k] && needed[static_cast<size_t>(body.params[nc + k])]) wanted[k] = changed = true;
  }
  if (std::all_of(b_part.begin(), b_part.end(), [](bool b) { return b; })) return false;
  recompute_in_w(body, 0, b_part);
  // B's values: its nodes' outputs and its carries; those W reads or returns cross, stacked.
  std::vector<bool> in_b(static_cast<size_t>(body.num_values()), false);
  for (size_t k = 0; k < nh; ++k) in_b[static_cast<size_t>(body.params[nc + k])] = wanted[k];
  std::vector<Node> b_nodes, w_nodes;
  for (size_t i = 0; i < body.nodes.size(); ++i) {
    if (b_part[i])
      for (ValueId v : body.nodes[i].outputs) in_b[static_cast<size_t>(v)] = true;
    (b_part[i] ? b_nodes : w_nodes).push_back(body.nodes[i]);
  }
  std::vector<ValueId> crossing;
  auto cross = [&](ValueId v) {
    if (in_b[static_cast<size_t>(v)] && std::find(crossing.begin(), crossing.end(), v) == crossing.end())
      crossing.push_back(v);
  };
  for (const Node& n : w_nodes)
    for (ValueId v : n.inputs) cross(v);
  for (size_t k = 0; k < body.results.size(); ++k)
    if (!wanted[k]) cross(body.results[k]);
  // Params (and the scan's inputs): consts, its carries, xs; W's then the crossing slices. Results (and the
  // scan's outputs): its carries' next values, its ys; B's then the crossing values, stacked.
  Node b = s, w = s;
  b.outputs.clear(), w.outputs.clear();
  std::vector<ValueId> b_params, w_params, b_inputs, w_inputs, b_results, w_results;
  auto both = [&](size_t p) {
    b_params.push_back(body.params[p]), w_params.push_back(body.params[p]);
    b_inputs.push_back(s.inputs[p]), w_inputs.push_back(s.inputs[p]);
  };
  for (size_t p = 0; p < nc; ++p) both(p);
  for (size_t k = 0; k < nh; ++k) {
    (wanted[k] ? b_params : w_params).push_back(body.params[nc + k]);
    (wanted[k] ? b_inputs : w_inputs).push_back(s.inputs[nc + k]);
  }
  for (size_t p = nc + nh; p < body.params.size(); ++p) both(p);
  for (size_t k = 0; k < body.results.size(); ++k) {
    (wanted[k] ? b_results : w_results).push_back(body.results[k]);
    (wanted[k] ? b.outputs : w.outputs).push_back(s.outputs[k]);
  }
  for (ValueId v : crossing) {
    Type t = body.type(v);
    t.shape.insert(t.shape.begin(), a.length);
    b_results.push_back(v), w_params.push_back(v);
    b.outputs.push_back(g.new_value(t));
    w_inputs.push_back(b.outputs.back());
  }
  const int64_t b_carries = std::count(wanted.begin(), wanted.begin() + static_cast<std::ptrdiff_t>(nh), true);
  make_scan(b, body, body.name + "_b", std::move(b_nodes), b_params, b_inputs, b_results, a.num_consts, b_carries);
  make_scan(w, body, body.name + "_w", std::move(w_nodes), w_params, w_inputs, w_results, a.num_consts,
            a.num_carry - b_carries);
  w.origin = next_origin();  // its own op: it runs in another action
  g.nodes[index] = std::move(b);
  g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(index) + 1, std::move(w));
  return true;
}

std::vector<bool> split_for(Graph& g, size_t first, std::vector<bool>& needed) {
  const std::vector<bool> wanted = needed;
  for (size_t i = first;; ++i) {
    needed = wanted;
    needed.resize(static_cast<size_t>(g.num_values()), false);  // a split adds values
    std::vector<bool> part = mark_needed(g, first, needed);
    for (; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (n.op != Op::scan || !part[i]) continue;
      std::vector<bool> outputs;
      for (ValueId v : n.outputs) outputs.push_back(needed[static_cast<size_t>(v)]);
      if (std::find(outputs.begin(), outputs.end(), false) != outputs.end() && split_scan(g, i, outputs)) break;
    }
    if (i >= g.nodes.size()) return part;
  }
}

}  // namespace

std::vector<bool> split_backward(Graph& g, size_t first, ValueId input_gradient) {
  std::vector<bool> needed(static_cast<size_t>(g.num_values()), false);
  needed[static_cast<size_t>(input_gradient)] = true;
  std::vector<bool> part = split_for(g, first, needed);
  recompute_in_w(g, first, part);
  return part;
}

}  // namespace remat::autodiff
