// Collective kernels over a mesh axis or group of axes (exec/mesh.h). Sums are deterministic: each rank
// receives every rank's copy of the part it sums and adds them in rank order starting from zero — exactly the
// sum ((0 + x_0) + x_1) + ... that one process accumulating the ranks' parts in order computes.
//   all_reduce      the operand cut into one chunk per rank; chunks exchanged (MPI_Alltoallv), summed, and
//                   the sums gathered to every rank (MPI_Allgatherv)
//   reduce_scatter  each rank sent the block of its last-axis coordinate (MPI_Alltoallv with a strided
//                   datatype: no packing), the received copies summed in the result's dtype
//   all_gather      this rank's shard converted into its place in the result, the others' received around it
//                   (MPI_Allgather in place with a strided datatype: no copy, whatever `dim`)
#include "exec/kernels/kernels.h"
#include "exec/mesh.h"

#include <climits>
#include <string_view>
#include <cstring>
#include <vector>

namespace remat::exec {
namespace {

// Rank i's chunk of n elements: [start(i), start(i + 1)).
int64_t start(int64_t n, int64_t ranks, int64_t i) { return n * i / ranks; }
int64_t largest_chunk(int64_t n, int64_t ranks) { return (n + ranks - 1) / ranks; }

// The last axis of a collective's axis or group ("data,fsdp" -> "fsdp"): its coordinate numbers the blocks
// of all_gather and reduce_scatter, and it has `parts` ranks.
const MeshAxis& last_axis_of(const ir::Node& n, const KernelContext& ctx, int64_t parts) {
  std::string_view name = n.attrs.str("axis");
  name = name.substr(name.rfind(',') + 1);  // npos + 1 == 0: the whole name
  const MeshAxis& axis = ctx.options.mesh->axis(name);
  CHECK(axis.size == parts, "{} (scope '{}') was compiled for {} parts along '{}', the mesh has {} ranks there",
        ir::op_name(n.op), n.scope, parts, name, axis.size);
  return axis;
}

int64_t parts_of(const ir::Node& n) { return n.attrs.has("parts") ? n.attrs.integer("parts") : n.attrs.integer("ranks"); }

// `count` blocks of `block` bytes, `stride` bytes apart, with an extent of `block` bytes: rank r's copy in a
// collective starts r blocks in, so the ranks' blocks interleave.
class Strided {
 public:
  Strided(int count, int block, int stride) {
    MPI_Datatype vector;
    MPI_Type_vector(count, block, stride, MPI_BYTE, &vector);
    MPI_Type_create_resized(vector, 0, block, &type_);
    MPI_Type_free(&vector);
    MPI_Type_commit(&type_);
  }
  ~Strided() { MPI_Type_free(&type_); }
  Strided(const Strided&) = delete;
  Strided& operator=(const Strided&) = delete;
  MPI_Datatype type() const { return type_; }

 private:
  MPI_Datatype type_;
};

// to[i] = from[i] converted as the convert op converts it (round to nearest even); a copy for equal dtypes.
void convert_elements(const ir::Node& n, DType from, const std::byte* src, DType to, std::byte* dst, int64_t count) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(count * dtype_size(from)));
    return;
  }
  dispatch_float(from, n, [&](auto f) {
    dispatch_float(to, n, [&](auto t) {
      using F = decltype(f);
      using T = decltype(t);
      const F* a = reinterpret_cast<const F*>(src);
      T* o = reinterpret_cast<T*>(dst);
      for (int64_t i = 0; i < count; ++i) o[i] = store<T>(static_cast<Compute<T>>(load(a[i])));
    });
  });
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

// out[e] = ((0 + parts[0][e]) + parts[1][e]) + ..., each sum rounded to the result's dtype as the add op
// rounds it; the parts (in their own dtype) are converted as they are added.
void sum_in_rank_order(const ir::Node& n, DType part_dtype, const std::byte* parts, int64_t ranks, int64_t count,
                       DType dtype, std::byte* out) {
  dispatch_float(part_dtype, n, [&](auto p) {
    dispatch_float(dtype, n, [&](auto t) {
      using P = decltype(p);
      using T = decltype(t);
      const P* part = reinterpret_cast<const P*>(parts);
      T* sum = reinterpret_cast<T*>(out);
      for (int64_t e = 0; e < count; ++e) {
        Compute<T> s = 0;
        for (int64_t r = 0; r < ranks; ++r)
          s = load(store<T>(s + static_cast<Compute<T>>(load(part[r * count + e]))));
        sum[e] = store<T>(s);
      }
    });
  });
}

}  // namespace

const MeshAxis& axis_of(const ir::Node& n, const KernelContext& ctx) {
  const std::string& name = n.attrs.str("axis");
  CHECK(ctx.options.mesh != nullptr, "{} along mesh axis '{}' (scope '{}') needs a mesh: run under mpirun",
        ir::op_name(n.op), name, n.scope);
  const MeshAxis& axis = ctx.options.mesh->axis(name);
  CHECK(axis.size == n.attrs.integer("ranks"), "{} (scope '{}') was compiled for {} ranks along '{}', the mesh has {}",
        ir::op_name(n.op), n.scope, n.attrs.integer("ranks"), name, axis.size);
  return axis;
}

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
  sum_in_rank_order(n, in[0].type().dtype, parts, ranks, mine, in[0].type().dtype,
                    out[0].bytes() + start(count, ranks, me) * esize);
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out[0].bytes(), send_counts.data(), send_at.data(), MPI_BYTE,
                 axis.comm);
}

void kernel_axis_index(const ir::Node& n, std::span<const Array>, std::span<Array> out, const KernelContext& ctx) {
  out[0].data<int32_t>()[0] = n.attrs.integer("ranks") == 1 ? 0 : static_cast<int32_t>(axis_of(n, ctx).rank);
}

int64_t workspace_all_gather(const ir::Node&, std::span<const ir::Type>) { return 0; }

void kernel_all_gather(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const int64_t parts = parts_of(n);
  const ir::Type &from = in[0].type(), &to = out[0].type();
  const int64_t blocks = outer(from, n.attrs.integer("dim")), piece = from.num_elements() / blocks;
  if (n.attrs.integer("ranks") > 1) axis_of(n, ctx);  // a mesh, with the group it was compiled for
  const int64_t me = parts == 1 ? 0 : last_axis_of(n, ctx, parts).rank;
  // out[o][r] = rank r's block o: this rank's blocks converted into place, the rest received around them.
  for (int64_t o = 0; o < blocks; ++o)
    convert_elements(n, from.dtype, in[0].bytes() + o * piece * dtype_size(from.dtype), to.dtype,
                     out[0].bytes() + (o * parts + me) * piece * dtype_size(to.dtype), piece);
  if (parts == 1) return;
  const int64_t block = piece * dtype_size(to.dtype);
  const Strided received(count_of(n, blocks), count_of(n, block), count_of(n, parts * block));
  MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out[0].bytes(), 1, received.type(), last_axis_of(n, ctx, parts).comm);
}

int64_t workspace_reduce_scatter(const ir::Node& n, std::span<const ir::Type> in) {
  const int64_t ranks = n.attrs.integer("ranks");
  return ranks == 1 ? 0 : ranks * in[0].bytes() / parts_of(n);  // every rank's copy of this rank's block
}

void kernel_reduce_scatter(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const int64_t ranks = n.attrs.integer("ranks"), parts = parts_of(n);
  const ir::Type &from = in[0].type(), &to = out[0].type();
  if (ranks == 1) return convert_elements(n, from.dtype, in[0].bytes(), to.dtype, out[0].bytes(), from.num_elements());
  const MeshAxis& group = axis_of(n, ctx);
  last_axis_of(n, ctx, parts);
  const int64_t blocks = outer(from, n.attrs.integer("dim")), bytes = from.bytes();
  const int64_t mine = bytes / parts;    // the bytes of one rank's block
  const int64_t piece = mine / blocks;   // its slice of one outer block
  // Group rank q gets block q mod parts (its last-axis coordinate: the last axis varies fastest): slice
  // q mod parts of every outer block, described by a strided datatype whose extent is one slice.
  const Strided block(count_of(n, blocks), count_of(n, piece), count_of(n, parts * piece));
  std::vector<int> send_counts(static_cast<size_t>(ranks), 1), send_at, receive_counts, receive_at;
  for (int64_t q = 0; q < ranks; ++q) {
    send_at.push_back(static_cast<int>(q % parts));
    receive_counts.push_back(count_of(n, mine));
    receive_at.push_back(count_of(n, q * mine));
  }
  std::byte* received = ctx.workspace.data();
  MPI_Alltoallv(in[0].bytes(), send_counts.data(), send_at.data(), block.type(), received, receive_counts.data(),
                receive_at.data(), MPI_BYTE, group.comm);
  sum_in_rank_order(n, from.dtype, received, ranks, out[0].size(), to.dtype, out[0].bytes());
}

}  // namespace remat::exec
