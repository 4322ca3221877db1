// exec::matmul_floor (exec.h): each distinct matmul shape of a profile run alone, in its own planned arena.
#include "exec/executable.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

namespace remat::exec {
namespace {

// The best of a few runs of g (after one that faults its arena in and makes oneDNN's primitives), in seconds.
double best_seconds(const ir::Graph& g) {
  Executable e(g.clone(), plan::build(g, {.workspace = workspace_of(cpu())}));
  std::vector<Array>& args = e.own_arguments();
  for (Array& a : args)
    for (int64_t i = 0; i < a.size(); ++i) a.set(i, std::sin(0.37 * static_cast<double>(i)));
  e.run();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    e.run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

ir::DotDims dims_of(const ir::IntLists& contract, const ir::IntLists& batch) {
  return {contract[0], contract[1], batch[0], batch[1]};
}

double dot_seconds(const ir::Type& lhs, const ir::Type& rhs, const ir::DotDims& dims) {
  ir::Graph g;
  ir::Builder b(g);
  b.result(ir::dot_general(b.param("a", lhs), b.param("b", rhs), dims));
  return best_seconds(g);
}

// FLOP/s of the score and context matmuls of attention over q [B,T,H,D] (keys and values as many heads as q),
// each head's operands as [B,H,T,D] so that neither needs a copy.
double attention_rate(const ir::Type& q) {
  const int64_t b = q.shape[0], t = std::min<int64_t>(q.shape[1], 1024), h = q.shape[2], d = q.shape[3];
  const ir::Type heads{q.dtype, {b, h, t, d}}, scores{q.dtype, {b, h, t, t}};
  const double seconds = dot_seconds(heads, heads, {{3}, {3}, {0, 1}, {0, 1}}) +  // q·kᵀ
                         dot_seconds(scores, heads, {{3}, {2}, {0, 1}, {0, 1}});  // p·v
  return 2 * 2.0 * static_cast<double>(b * h * t * t * d) / seconds;
}

}  // namespace

// Each shape is timed in every pass, the passes one after another over all the shapes, and keeps its best: a slow
// burst of a shared machine (seconds long; the floor of a 4 x 512 step once came out 30% above the step) has to
// cover a shape in both passes to count.
constexpr int kPasses = 2;

MatmulFloor matmul_floor(const Profile& profile) {
  using Shape = std::tuple<ir::Type, ir::Type, ir::IntLists, ir::IntLists>;
  std::map<Shape, double> dot;        // seconds of one call
  std::map<ir::Type, double> rate;    // attention's FLOP/s, by q's type
  const auto shape_of = [](const Profile::Call& c) {
    return Shape{c.operands[0], c.operands[1], c.node->attrs.int_lists("contract"), c.node->attrs.int_lists("batch")};
  };
  for (const Profile::Call& c : profile.timeline) {
    if (c.operands.empty()) continue;
    if (c.node->op == ir::Op::dot_general) dot.emplace(shape_of(c), std::numeric_limits<double>::infinity());
    else rate.emplace(c.operands[0], 0.0);
  }
  for (int pass = 0; pass < kPasses; ++pass) {
    for (auto& [shape, seconds] : dot) {
      const auto& [lhs, rhs, contract, batch] = shape;
      seconds = std::min(seconds, dot_seconds(lhs, rhs, dims_of(contract, batch)));
    }
    for (auto& [q, flops_per_second] : rate) flops_per_second = std::max(flops_per_second, attention_rate(q));
  }
  MatmulFloor f;
  for (const Profile::Call& c : profile.timeline) {
    if (c.operands.empty()) continue;
    f.flops += c.flops;
    f.seconds += c.node->op == ir::Op::dot_general ? dot.at(shape_of(c)) : c.flops / rate.at(c.operands[0]);
  }
  f.shapes = static_cast<int64_t>(dot.size() + rate.size());
  return f;
}

}  // namespace remat::exec
