#include "exec/exec.h"

#include "exec/kernels/kernels.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

namespace remat::exec {

using ir::Graph;
using ir::Node;
using ir::Op;

void kernel_for(const Node& n, std::span<const Array> in, std::span<Array> out, const Options& options) {
  switch (n.op) {
#define X(e, ...) \
  case Op::e:       \
    return kernel_##e(n, in, out, options);
    REMAT_OPS(X)
#undef X
  }
}

namespace {

// Ops whose outputs are not fresh buffers: views of an operand, or (scan) set by the loop itself.
bool allocates_own_outputs(Op op) { return ir::is_view(op) || ir::has_body(op); }

}  // namespace

// Runs the body `length` times; xs are views into the stacked inputs, ys are copied into stacked outputs.
void kernel_scan(const Node& n, std::span<const Array> in, std::span<Array> out, const Options& options) {
  const Graph& body = *n.body;
  const int64_t length = n.attrs.integer("length");
  const size_t nc = static_cast<size_t>(n.attrs.integer("num_consts"));
  const size_t nh = static_cast<size_t>(n.attrs.integer("num_carry"));
  const bool reverse = n.attrs.boolean("reverse");
  std::vector<Array> args(in.begin(), in.end());
  for (size_t k = nh; k < out.size(); ++k) out[k] = Array(out[k].type());
  for (int64_t step = 0; step < length; ++step) {
    const int64_t t = reverse ? length - 1 - step : step;
    for (size_t p = nc + nh; p < in.size(); ++p) args[p] = in[p].slice0(t);
    std::vector<Array> results = run(body, args, options);
    for (size_t k = 0; k < nh; ++k) args[nc + k] = std::move(results[k]);
    for (size_t k = nh; k < out.size(); ++k) {
      const Array& y = results[k];
      std::memcpy(out[k].bytes() + t * y.type().bytes(), y.bytes(), static_cast<size_t>(y.type().bytes()));
    }
  }
  for (size_t k = 0; k < nh; ++k) out[k] = args[nc + k];
}

// A remat region runs its body once, like a call; its policy matters only to differentiation.
void kernel_remat(const Node& n, std::span<const Array> in, std::span<Array> out, const Options& options) {
  std::vector<Array> results = run(*n.body, in, options);
  for (size_t k = 0; k < out.size(); ++k) out[k] = std::move(results[k]);
}

std::string Profile::table() const {
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (const auto& [op, s] : seconds) rows.emplace_back(s, op), total += s;
  std::sort(rows.rbegin(), rows.rend());
  std::string out = fmt::format("{:<22} {:>10} {:>7} {:>9}\n", "op", "seconds", "share", "calls");
  for (const auto& [s, op] : rows)
    out += fmt::format("{:<22} {:>10.3f} {:>6.1f}% {:>9}\n", op, s, 100 * s / total, calls.at(op));
  return out;
}

std::vector<Array> run(const Graph& g, std::span<const Array> args, const Options& options) {
  CHECK(args.size() == g.params.size(), "graph @{} takes {} arguments, got {}", g.name, g.params.size(), args.size());
  std::vector<Array> values(g.types.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::Type& want = g.type(g.params[i]);
    CHECK(args[i].type() == want, "graph @{}: argument {} (%{}) is {} but the graph expects {}", g.name, i,
          g.param_names[i], ir::type_str(args[i].type()), ir::type_str(want));
    values[static_cast<size_t>(g.params[i])] = args[i];
  }
  // Free each buffer after its last reader (results are kept).
  std::vector<size_t> last_use(g.types.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ir::ValueId v : g.nodes[i].inputs) last_use[static_cast<size_t>(v)] = i;
  for (ir::ValueId v : g.results) last_use[static_cast<size_t>(v)] = std::numeric_limits<size_t>::max();

  std::vector<Array> ins, outs;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    ins.clear();
    outs.clear();
    for (ir::ValueId v : n.inputs) ins.push_back(values[static_cast<size_t>(v)]);
    for (ir::ValueId v : n.outputs) {
      const ir::Type& t = g.type(v);
      outs.push_back(allocates_own_outputs(n.op) ? Array::unallocated(&t) : Array(t));
    }
    try {
      if (options.profile && !ir::has_body(n.op)) {
        auto t0 = std::chrono::steady_clock::now();
        kernel_for(n, ins, outs, options);
        std::string key(ir::op_name(n.op));
        options.profile->seconds[key] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        options.profile->calls[key] += 1;
        options.profile->runs_by_origin[n.origin] += 1;
      } else {
        kernel_for(n, ins, outs, options);
      }
    } catch (const Error& e) {
      CHECK(false, "{}: {}", ir::describe_node(g, i), e.what());
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) values[static_cast<size_t>(n.outputs[k])] = std::move(outs[k]);
    for (ir::ValueId v : n.inputs)
      if (last_use[static_cast<size_t>(v)] == i) values[static_cast<size_t>(v)] = Array();
  }
  std::vector<Array> results;
  // Results own their types: an alias result (reshape, name) borrows its type from g, which may not outlive it.
  for (ir::ValueId v : g.results) results.push_back(values[static_cast<size_t>(v)].detached());
  return results;
}

}  // namespace remat::exec
