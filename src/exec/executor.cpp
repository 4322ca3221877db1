#include "exec/executable.h"

#include "exec/kernels/kernels.h"

#include <algorithm>
#include <cstring>

namespace remat::exec {

namespace {

// The kernel table, indexed by op; null for the ops with a body (the executor runs those itself).
#define REMAT_KERNEL_ADDRESS(e) &kernel_##e,
#define REMAT_NO_KERNEL(e) nullptr,
constexpr Kernel kKernels[] = {
#define X(e, arity, cls, ...) REMAT_KERNEL_OR(cls, REMAT_KERNEL_ADDRESS, REMAT_NO_KERNEL)(e)
    REMAT_OPS(X)
#undef X
};
static_assert(std::size(kKernels) == ir::kNumOps);

class Cpu final : public Backend {
 public:
  // Zeroed: every page is touched here, once (2 MiB pages where the kernel gives them, see Array).
  Array allocate(bool, int64_t bytes) const override {
    return Array::zeros(ir::Type{DType::pred, {std::max<int64_t>(bytes, 1)}});
  }
  void copy(const Array& from, const Array& to, int64_t byte_offset) const override {
    if (from.bytes() == to.bytes() + byte_offset) return;
    std::memmove(to.bytes() + byte_offset, from.bytes(), static_cast<size_t>(from.type().bytes()));
  }
  Kernel kernel(ir::Op op) const override {
    ASSERT(!ir::is_region(op));
    return kKernels[static_cast<size_t>(op)];
  }
  int64_t workspace_bytes(const ir::Node& n, std::span<const ir::Type> in) const override {
    switch (n.op) {
      case ir::Op::dot_general: return workspace_dot_general(n, in);
      case ir::Op::attention:
      case ir::Op::attention_grad: return workspace_attention(n, in);
      case ir::Op::fusion: return workspace_fusion(n, in);
      case ir::Op::softmax:
      case ir::Op::softmax_grad:
      case ir::Op::log_softmax:
      case ir::Op::target_log_prob: return workspace_softmax(n, in);
      case ir::Op::rms_norm:
      case ir::Op::rms_norm_grad: return workspace_rms_norm(n, in);
      case ir::Op::swiglu:
      case ir::Op::swiglu_grad: return workspace_swiglu(n, in);
      case ir::Op::reduce_sum:
      case ir::Op::reduce_max:
      case ir::Op::sum_of_squares: return workspace_reduction(n, in);
      case ir::Op::all_reduce: return workspace_all_reduce(n, in);
      case ir::Op::all_gather: return workspace_all_gather(n, in);
      case ir::Op::reduce_scatter: return workspace_reduce_scatter(n, in);
      default: return 0;  // every other kernel works in its outputs
    }
  }
  void synchronize() const override {}  // kernels return when their work is done
};

}  // namespace

const Backend& cpu() {
  static const Cpu backend;
  return backend;
}

std::function<int64_t(const ir::Node&, std::span<const ir::Type>)> workspace_of(const Backend& backend) {
  return [&backend](const ir::Node& n, std::span<const ir::Type> in) { return backend.workspace_bytes(n, in); };
}

std::string Profile::breakdown(int top) const {
  struct Row {
    double seconds = 0, bytes = 0, flops = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Row> by_op, by_scope;
  Row all;
  for (const Call& c : timeline) {
    for (Row* r : {&by_op[std::string(ir::op_name(c.node->op))], &by_scope[c.node->scope.empty() ? "(none)" : c.node->scope], &all}) {
      r->seconds += c.end - c.start;
      r->bytes += c.bytes;
      r->flops += c.flops;
      r->calls += 1;
    }
  }
  auto table = [&](const std::map<std::string, Row>& rows, const char* what, size_t limit) {
    std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    std::string out = fmt::format("  {:<44} {:>9} {:>6} {:>7} {:>10} {:>8} {:>9}\n", what, "ms", "share", "calls", "moved", "GB/s", "GFLOP/s");
    for (size_t i = 0; i < sorted.size() && i < limit; ++i) {
      const Row& r = sorted[i].second;
      const double s = std::max(r.seconds, 1e-12);
      out += fmt::format("  {:<44} {:>9.2f} {:>5.1f}% {:>7} {:>8.1f}MB {:>8.1f} {:>9.1f}\n", sorted[i].first, 1e3 * r.seconds,
                         100 * r.seconds / std::max(all.seconds, 1e-12), r.calls, r.bytes / 1e6, r.bytes / s / 1e9,
                         r.flops / s / 1e9);
    }
    return out;
  };
  double gemm = 0;
  for (const char* op : {"dot_general", "attention", "attention_grad"}) gemm += by_op.count(op) ? by_op.at(op).seconds : 0;
  return fmt::format("kernel time {:.1f} ms in {} calls, {:.6g} GFLOP, {:.1f} GB moved; {:.1f}% in matmuls and attention\n",
                     1e3 * all.seconds, all.calls, all.flops / 1e9, all.bytes / 1e9, 100 * gemm / std::max(all.seconds, 1e-12)) +
         table(by_op, "by op", by_op.size()) + table(by_scope, fmt::format("by scope (the {} slowest)", top).c_str(), static_cast<size_t>(top));
}

std::vector<Array> run(const ir::Graph& g, std::span<const Array> args, const Options& options) {
  ir::Graph program = g.clone();
  ir::inline_remat_regions(program);
  plan::Plan p = plan::build(program, {.workspace = workspace_of(*options.backend)});
  Executable e(std::move(program), std::move(p), options);
  const std::vector<Array>& out = e.run(args);
  return {out.begin(), out.end()};
}

}  // namespace remat::exec
