#include "support/reference_executor.h"

#include <cstring>
#include <limits>

namespace remat::testing_support {
namespace {

using exec::Array;

void run_node(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const exec::Options& options);

// Runs the body `length` times; xs are views into the stacked inputs, ys are copied into stacked outputs.
void run_scan(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const exec::Options& options) {
  const int64_t length = n.attrs.integer("length");
  const size_t nc = static_cast<size_t>(n.attrs.integer("num_consts"));
  const size_t nh = static_cast<size_t>(n.attrs.integer("num_carry"));
  std::vector<Array> args(in.begin(), in.end());
  for (size_t k = nh; k < out.size(); ++k) out[k] = Array(out[k].type());
  for (int64_t step = 0; step < length; ++step) {
    const int64_t t = n.attrs.boolean("reverse") ? length - 1 - step : step;
    for (size_t p = nc + nh; p < in.size(); ++p) args[p] = in[p].slice0(t);
    std::vector<Array> results = reference_run(*n.body, args, options);
    for (size_t k = 0; k < nh; ++k) args[nc + k] = std::move(results[k]);
    for (size_t k = nh; k < out.size(); ++k)
      std::memcpy(out[k].bytes() + t * results[k].type().bytes(), results[k].bytes(),
                  static_cast<size_t>(results[k].type().bytes()));
  }
  for (size_t k = 0; k < nh; ++k) out[k] = args[nc + k];
}

void run_node(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const exec::Options& options) {
  if (n.op == ir::Op::scan) return run_scan(n, in, out, options);
  if (n.op == ir::Op::remat) {  // a call of its body: the policy matters only to differentiation
    std::vector<Array> results = reference_run(*n.body, in, options);
    for (size_t k = 0; k < out.size(); ++k) out[k] = std::move(results[k]);
    return;
  }
  std::vector<ir::Type> types;
  for (const Array& a : in) types.push_back(a.type());
  const int64_t bytes = options.backend->workspace_bytes(n, types);
  Array workspace = Array::exact(bytes);  // 64-byte aligned, exactly the bytes asked for
  options.backend->kernel(n.op)(n, in, out, {options, {workspace.bytes(), static_cast<size_t>(bytes)}});
}

}  // namespace

std::vector<Array> reference_run(const ir::Graph& g, std::span<const Array> args, const exec::Options& options) {
  CHECK(args.size() == g.params.size(), "graph @{} takes {} arguments, got {}", g.name, g.params.size(), args.size());
  std::vector<Array> values(g.types.size());
  for (size_t i = 0; i < args.size(); ++i) {
    CHECK(args[i].type() == g.type(g.params[i]), "graph @{}: argument {} has the wrong type", g.name, i);
    values[static_cast<size_t>(g.params[i])] = args[i];
  }
  std::vector<size_t> last_use(g.types.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ir::ValueId v : g.nodes[i].inputs) last_use[static_cast<size_t>(v)] = i;
  for (ir::ValueId v : g.results) last_use[static_cast<size_t>(v)] = std::numeric_limits<size_t>::max();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    std::vector<Array> ins, outs;
    for (ir::ValueId v : n.inputs) ins.push_back(values[static_cast<size_t>(v)]);
    for (ir::ValueId v : n.outputs)  // views and regions set their outputs themselves
      outs.push_back(ir::is_view(n.op) || ir::is_region(n.op) ? Array::unallocated(&g.type(v)) : Array(g.type(v)));
    try {
      run_node(n, ins, outs, options);
    } catch (const Error& e) {
      CHECK(false, "{}: {}", ir::describe_node(g, i), e.what());
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) values[static_cast<size_t>(n.outputs[k])] = std::move(outs[k]);
    for (ir::ValueId v : n.inputs)
      if (last_use[static_cast<size_t>(v)] == i) values[static_cast<size_t>(v)] = Array();
  }
  std::vector<Array> results;
  for (ir::ValueId v : g.results) results.push_back(values[static_cast<size_t>(v)].detached());
  return results;
}

}  // namespace remat::testing_support
