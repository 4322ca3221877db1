// Collective kernels over a mesh axis (exec/mesh.h). Sums are deterministic: each rank receives every rank's
// copy of the part it sums and adds them in rank order starting from zero — exactly the sum
// ((0 + x_0) + x_1) + ... that one process accumulating the ranks' parts in order computes.
//   all_reduce      the operand cut into one chunk per rank; chunks exchanged (MPI_Alltoallv), summed, and
//                   the sums gathered to every rank (MPI_Allgatherv)
//   reduce_scatter  the blocks of `dim` exchanged (MPI_Alltoall; packed first when `dim` is not leading), summed
//   all_gather      MPI_Allgather, then interleaved along `dim` when it is not leading
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

// The mesh axis a collective runs over, checked against what it was compiled for.
const MeshAxis& axis_of(const ir::Node& n, const KernelContext& ctx) {
  const std::string& name = n.attrs.str("axis");
  CHECK(ctx.options.mesh != nullptr, "{} over mesh axis '{}' (scope '{}') needs a mesh: run under mpirun", ir::op_name(n.op),
        name, n.scope);
  const MeshAxis& axis = ctx.options.mesh->axis(name);
  CHECK(axis.size == n.attrs.integer("ranks"), "{} (scope '{}') was compiled for {} ranks along '{}', the mesh has {}",
        ir::op_name(n.op), n.scope, n.attrs.integer("ranks"), name, axis.size);
  return axis;
}

// Elements before dimension `dim` (the blocks a leading-dimension layout repeats).
int64_t outer(const ir::Type& t, int64_t dim) {
  int64_t o = 1;
  for (int64_t d = 0; d < dim; ++d) o *= t.shape[static_cast<size_t>(d)];
  return o;
}

int count_of(const ir::Node& n, int64_t bytes) {
  CHECK(bytes <= INT_MAX, "{} (scope '{}'): {} bytes per rank is too large for one MPI exchange", ir::op_name(n.op), n.scope,
        bytes);
  return static_cast<int>(bytes);
}

// out[e] = ((0 + parts[0][e]) + parts[1][e]) + ..., each sum rounded to the dtype as the add op rounds it.
void sum_in_rank_order(const ir::Node& n, DType dtype, const std::byte* parts, int64_t ranks, int64_t count,
                       std::byte* out) {
  dispatch_float(dtype, n, [&](auto t) {
    using T = decltype(t);
    const T* part = reinterpret_cast<const T*>(parts);
    T* sum = reinterpret_cast<T*>(out);
    for (int64_t e = 0; e < count; ++e) {
      Compute<T> s = 0;
      for (int64_t r = 0; r < ranks; ++r) s = load(store<T>(s + load(part[r * count + e])));
      sum[e] = store<T>(s);
    }
  });
}

}  // namespace

int64_t workspace_all_reduce(const ir::Node& n, std::span<const ir::Type> in) {
  const int64_t ranks = n.attrs.integer("ranks");
  if (ranks == 1) return 0;
  return ranks * largest_chunk(in[0].num_elements(), ranks) * dtype_size(in[0].dtype);
}

void kernel_all_reduce(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const int64_t ranks = n.attrs.integer("ranks");
  if (ranks == 1) return copy_all(in[0], out[0]);
  const MeshAxis& axis = axis_of(n, ctx);
  const int64_t count = in[0].size(), esize = dtype_size(in[0].type().dtype), me = axis.rank;
  const int64_t mine = start(count, ranks, me + 1) - start(count, ranks, me);
  count_of(n, largest_chunk(count, ranks) * esize * ranks);
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
  sum_in_rank_order(n, in[0].type().dtype, parts, ranks, mine, out[0].bytes() + start(count, ranks, me) * esize);
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out[0].bytes(), send_counts.data(), send_at.data(), MPI_BYTE,
                 axis.comm);
}

int64_t workspace_all_gather(const ir::Node& n, std::span<const ir::Type> in) {
  const int64_t ranks = n.attrs.integer("ranks");
  return ranks == 1 || outer(in[0], n.attrs.integer("dim")) == 1 ? 0 : ranks * in[0].bytes();
}

void kernel_all_gather(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const int64_t ranks = n.attrs.integer("ranks");
  if (ranks == 1) return copy_all(in[0], out[0]);
  const MeshAxis& axis = axis_of(n, ctx);
  const int64_t bytes = in[0].type().bytes(), blocks = outer(in[0].type(), n.attrs.integer("dim"));
  const int count = count_of(n, bytes);
  if (blocks == 1) {  // leading dimension: the ranks' operands one after another
    MPI_Allgather(in[0].bytes(), count, MPI_BYTE, out[0].bytes(), count, MPI_BYTE, axis.comm);
    return;
  }
  std::byte* all = ctx.workspace.data();
  MPI_Allgather(in[0].bytes(), count, MPI_BYTE, all, count, MPI_BYTE, axis.comm);
  const int64_t block = bytes / blocks;  // out[o][r] = rank r's block o
  for (int64_t o = 0; o < blocks; ++o)
    for (int64_t r = 0; r < ranks; ++r)
      std::memcpy(out[0].bytes() + (o * ranks + r) * block, all + r * bytes + o * block, static_cast<size_t>(block));
}

int64_t workspace_reduce_scatter(const ir::Node& n, std::span<const ir::Type> in) {
  const int64_t ranks = n.attrs.integer("ranks"), bytes = in[0].bytes();
  if (ranks == 1) return 0;
  return outer(in[0], n.attrs.integer("dim")) == 1 ? bytes : aligned64(bytes) + bytes;  // received (+ packed)
}

void kernel_reduce_scatter(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const int64_t ranks = n.attrs.integer("ranks");
  if (ranks == 1) return copy_all(in[0], out[0]);
  const MeshAxis& axis = axis_of(n, ctx);
  const ir::Type& t = in[0].type();
  const int64_t dim = n.attrs.integer("dim"), blocks = outer(t, dim), bytes = t.bytes();
  const int64_t mine = bytes / ranks;                                // this rank's block, and each rank's
  const int64_t piece = mine / blocks;                               // one rank's slice of one outer block
  std::span<std::byte> workspace = ctx.workspace;
  std::byte* received = take(workspace, blocks == 1 ? bytes : aligned64(bytes));
  const std::byte* send = in[0].bytes();
  if (blocks > 1) {  // rank i's block: slice i of every outer block, packed together
    std::byte* packed = take(workspace, bytes);
    for (int64_t i = 0; i < ranks; ++i)
      for (int64_t o = 0; o < blocks; ++o)
        std::memcpy(packed + i * mine + o * piece, send + o * (ranks * piece) + i * piece, static_cast<size_t>(piece));
    send = packed;
  }
  const int count = count_of(n, mine);
  MPI_Alltoall(send, count, MPI_BYTE, received, count, MPI_BYTE, axis.comm);
  sum_in_rank_order(n, t.dtype, received, ranks, out[0].size(), out[0].bytes());
}

}  // namespace remat::exec
