// SwiGLU's product and its VJP (ir/ops.h) run as the fusion of the primitives they stand for: the kernel builds
// that composition once per (op, dtype, length), silu(gate)·up from logistic and mul, and its VJP as autodiff
// writes the VJPs of mul and logistic, and runs it through the fusion kernel (the compiled loop, or the
// interpreter). The bits are the composition's by construction, and the speed the fusion compiler's: one pass,
// nothing stored between, the backward recomputing the logistic. A bf16 composition computes in f32 between a
// convert of each operand and a convert of each result (the ops' definition, as XLA's excess precision: rounding
// each bf16 intermediate cost the compiled loop more than the f32 arithmetic itself; f16 keeps each rounding).
// Each group of elements is read whole before a result of it is written, so a result may be written over gate.
#include "exec/kernels/kernels.h"
#include "ir/ir.h"

#include <map>
#include <mutex>
#include <tuple>

namespace remat::exec {
namespace {

// A fusion node whose body is `op`'s composition over `len` elements of dtype `d`: swiglu's (gate, up) -> h, or
// swiglu_grad's (gate, up, g) -> (dgate, dup).
const ir::Node& composition(ir::Op op, DType d, int64_t len) {
  static std::mutex mutex;
  static std::map<std::tuple<ir::Op, DType, int64_t>, ir::Node> made;
  std::lock_guard<std::mutex> lock(mutex);
  ir::Node& n = made[{op, d, len}];
  if (n.body) return n;
  auto body = std::make_shared<ir::Graph>();
  body->name = ir::op_name(op);
  ir::Builder b(*body);
  const ir::Type t{d, {len}};
  const DType c = d == DType::bf16 ? DType::f32 : d;  // what the composition computes in
  const auto result = [&](ir::Tensor y) { b.result(convert(y, d)); };
  ir::Tensor gate = convert(b.param("gate", t), c), up = convert(b.param("up", t), c);
  ir::Tensor s = logistic(gate);
  ir::Tensor silu = gate * s;
  if (op == ir::Op::swiglu) {
    result(silu * up);
  } else {
    ir::Tensor g = convert(b.param("g", t), c);
    ir::Tensor dsilu = g * up;                                    // mul's VJP: the cotangent times the other operand
    ir::Tensor slope = s * (full(b, {c, {len}}, 1.0) - s);        // logistic's VJP: ds·(s·(1 − s))
    result(dsilu * s + (dsilu * gate) * slope);                   // through silu = gate·s's operands, in that order
    result(g * silu);
  }
  n.op = ir::Op::fusion;
  n.body = std::move(body);
  return n;
}

const ir::Node& composition_of(const ir::Node& n, const ir::Type& gate) {
  return composition(n.op, gate.dtype, gate.num_elements());
}

}  // namespace

int64_t workspace_swiglu(const ir::Node& n, std::span<const ir::Type> in) {
  return workspace_fusion(composition_of(n, in[0]), in);
}

void kernel_swiglu(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  kernel_fusion(composition_of(n, in[0].type()), in, out, ctx);
}

void kernel_swiglu_grad(const ir::Node& n, std::span<const Array> in, std::span<Array> out,
                        const KernelContext& ctx) {
  kernel_fusion(composition_of(n, in[0].type()), in, out, ctx);
}

}  // namespace remat::exec
