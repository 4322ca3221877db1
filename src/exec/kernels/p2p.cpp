// Point-to-point kernels along a mesh axis (ops.h: send, send_done, recv), through exec::Mesh. A send's result
// is its operand (a view), so the planner keeps the buffer until the send_done that reads it.
#include "exec/kernels/kernels.h"
#include "exec/mesh.h"

namespace remat::exec {
namespace {

int attr_int(const ir::Node& n, const char* key) { return static_cast<int>(n.attrs.integer(key)); }

}  // namespace

void kernel_send(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  ctx.options.mesh->start_send(axis_of(n, ctx), attr_int(n, "peer"), attr_int(n, "tag"), in[0].bytes(), in[0].type().bytes());
  out[0] = in[0].view_as(out[0]);
}

void kernel_send_done(const ir::Node&, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  ctx.options.mesh->finish_send(in[0].bytes());
  out[0] = in[0].view_as(out[0]);
}

void kernel_recv(const ir::Node& n, std::span<const Array>, std::span<Array> out, const KernelContext& ctx) {
  ctx.options.mesh->receive(axis_of(n, ctx), attr_int(n, "peer"), attr_int(n, "tag"), out[0].bytes(), out[0].type().bytes());
}

}  // namespace remat::exec
