// Collective kernels over a mesh axis (exec/mesh.h). all_reduce, deterministically: the operand is cut into
// one chunk per rank; every rank receives every rank's copy of its own chunk (MPI_Alltoallv), adds them in
// rank order starting from zero — exactly the sum ((0 + x_0) + x_1) + ... that one process accumulating
// the ranks' parts in order computes — and the summed chunks are gathered to every rank (MPI_Allgatherv).
#include "exec/kernels/kernels.h"
#include "exec/mesh.h"

#include <climits>
#include <cstring>
#include <vector>

namespace remat::exec {
namespace {

// Rank i's chunk of n elements: [start(i), start(i + 1)).
int64_t start(int64_t n, int64_t ranks, int64_t i) { return n * i / ranks; }
int64_t largest_chunk(int64_t n, int64_t ranks) { return (n + ranks - 1) / ranks; }

}  // namespace

int64_t workspace_all_reduce(const ir::Node& n, std::span<const ir::Type> in) {
  const int64_t ranks = n.attrs.integer("ranks");
  if (ranks == 1) return 0;
  return ranks * largest_chunk(in[0].num_elements(), ranks) * dtype_size(in[0].dtype);
}

void kernel_all_reduce(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const int64_t ranks = n.attrs.integer("ranks");
  const std::string& name = n.attrs.str("axis");
  if (ranks == 1) {
    if (out[0].bytes() != in[0].bytes()) std::memcpy(out[0].bytes(), in[0].bytes(), static_cast<size_t>(in[0].type().bytes()));
    return;
  }
  CHECK(ctx.options.mesh != nullptr, "all_reduce over mesh axis '{}' (scope '{}') needs a mesh: run under mpirun",
        name, n.scope);
  const MeshAxis& axis = ctx.options.mesh->axis(name);
  CHECK(axis.size == ranks, "all_reduce (scope '{}') was compiled for {} ranks along '{}', the mesh has {}", n.scope,
        ranks, name, axis.size);
  const int64_t count = in[0].size(), esize = dtype_size(in[0].type().dtype), me = axis.rank;
  const int64_t mine = start(count, ranks, me + 1) - start(count, ranks, me);
  CHECK(largest_chunk(count, ranks) * esize * ranks <= INT_MAX,
        "all_reduce (scope '{}'): {} of {} bytes is too large for one MPI exchange", n.scope,
        ir::type_str(in[0].type()), in[0].type().bytes());
  std::vector<int> send_counts, send_at, receive_counts, receive_at;
  for (int64_t i = 0; i < ranks; ++i) {
    send_counts.push_back(static_cast<int>((start(count, ranks, i + 1) - start(count, ranks, i)) * esize));
    send_at.push_back(static_cast<int>(start(count, ranks, i) * esize));
    receive_counts.push_back(static_cast<int>(mine * esize));
    receive_at.push_back(static_cast<int>(i * mine * esize));
  }
  std::byte* parts = ctx.workspace.data();
  MPI_Alltoallv(in[0].bytes(), send_counts.data(), send_at.data(), MPI_BYTE, parts, receive_counts.data(),
                receive_at.data(), MPI_BYTE, axis.comm);
  dispatch_float(in[0].type().dtype, n, [&](auto t) {
    using T = decltype(t);
    const T* part = reinterpret_cast<const T*>(parts);
    T* sum = out[0].data<T>() + start(count, ranks, me);
    for (int64_t e = 0; e < mine; ++e) {
      Compute<T> s = 0;
      for (int64_t r = 0; r < ranks; ++r) s = load(store<T>(s + load(part[r * mine + e])));
      sum[e] = store<T>(s);
    }
  });
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out[0].bytes(), send_counts.data(), send_at.data(), MPI_BYTE,
                 axis.comm);
}

}  // namespace remat::exec
