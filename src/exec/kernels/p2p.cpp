// Point-to-point kernels along a mesh axis (ops.h: send, send_done, recv), through exec::Mesh. A send's result
// is its operand (a view), so the planner keeps the buffer until the send_done that reads it.
#include "exec/kernels/kernels.h"
#include "exec/mesh.h"

namespace remat::exec {
namespace {

const MeshAxis& peer_axis(const ir::Node& n, const KernelContext& ctx) {
  const std::string& name = n.attrs.str("axis");
  CHECK(ctx.options.mesh != nullptr, "{} along mesh axis '{}' (scope '{}') needs a mesh: run under mpirun",
        ir::op_name(n.op), name, n.scope);
  const MeshAxis& axis = ctx.options.mesh->axis(name);
  CHECK(axis.size == n.attrs.integer("ranks"), "{} (scope '{}') was compiled for {} ranks along '{}', the mesh has {}",
        ir::op_name(n.op), n.scope, n.attrs.integer("ranks"), name, axis.size);
  return axis;
}

int attr_int(const ir::Node& n, const char* key) { return static_cast<int>(n.attrs.integer(key)); }

}  // namespace

void kernel_send(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  ctx.options.mesh->start_send(peer_axis(n, ctx), attr_int(n, "peer"), attr_int(n, "tag"), in[0].bytes(), in[0].type().bytes());
  out[0] = in[0].view_as(out[0]);
}

void kernel_send_done(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  ctx.options.mesh->finish_send(in[0].bytes());
  out[0] = in[0].view_as(out[0]);
}

void kernel_recv(const ir::Node& n, std::span<const Array>, std::span<Array> out, const KernelContext& ctx) {
  ctx.options.mesh->receive(peer_axis(n, ctx), attr_int(n, "peer"), attr_int(n, "tag"), out[0].bytes(), out[0].type().bytes());
}

}  // namespace remat::exec
