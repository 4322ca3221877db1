#include "exec/mesh.h"

#include "base/check.h"

#include <fmt/format.h>

#include <cstdlib>
#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <numeric>

namespace remat::exec {
namespace {

// MPI for the whole process: initialised once, finalised at exit (after every Mesh is gone).
struct Mpi {
  Mpi() {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  }
  ~Mpi() { MPI_Finalize(); }
};

void ensure_mpi() { static Mpi mpi; }

}  // namespace

std::string Mesh::first_rank_text(const std::string& text) {
  if (launched_ranks() == 1) return text;
  ensure_mpi();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int size = static_cast<int>(text.size());
  MPI_Bcast(&size, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string out = rank == 0 ? text : std::string(static_cast<size_t>(size), '\0');
  MPI_Bcast(out.data(), size, MPI_CHAR, 0, MPI_COMM_WORLD);
  return out;
}

int Mesh::launched_ranks() {
  // Open MPI's mpirun tells each process the launch's size in its environment.
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size ? std::max(1, std::atoi(size)) : 1;
}

void Mesh::abort_launch(int code) {
  int running = 0, finalized = 0;
  MPI_Initialized(&running);
  MPI_Finalized(&finalized);
  if (running && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

Mesh::Mesh(const std::vector<std::pair<std::string, int>>& axes) {
  const int launched = launched_ranks();
  const int product = std::accumulate(axes.begin(), axes.end(), 1, [](int p, const auto& a) { return p * a.second; });
  std::vector<std::string> shown;
  for (const auto& [name, n] : axes) shown.push_back(fmt::format("{}={}", name, n));
  CHECK(product == launched,
        "the mesh ({}) has {} ranks but {} process{} launched; start `mpirun -np {} remat train ...` or set the "
        "parallelism keys so that their product is {}",
        fmt::join(shown, ", "), product, launched, launched == 1 ? " was" : "es were", product, launched);
  if (launched > 1) {
    ensure_mpi();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  // Coordinates: the last axis varies fastest. An axis's communicator groups the ranks whose other
  // coordinates are equal (the split colour), ordered by their coordinate along it (the key).
  int stride = size_;
  for (const auto& [name, n] : axes) {
    CHECK(n >= 1, "mesh axis '{}' has {} ranks; it needs at least 1", name, n);
    stride /= n;
    MeshAxis a{name, n, (rank_ / stride) % n, MPI_COMM_NULL};
    if (size_ > 1) MPI_Comm_split(MPI_COMM_WORLD, rank_ - a.rank * stride, a.rank, &a.comm);
    axes_.push_back(a);
  }
  // Groups: for each set of two or more axes (a bit mask over them), the ranks equal outside the set, ordered
  // by their row-major index within it. Every rank creates them all, in the same order.
  const size_t n = axes_.size();
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    if (std::popcount(mask) < 2) continue;
    MeshAxis g{"", 1, 0, MPI_COMM_NULL};
    int outside = rank_, stride_in = size_;
    for (size_t i = 0; i < n; ++i) {
      stride_in /= axes_[i].size;
      if (!(mask & (1u << i))) continue;
      g.name += (g.name.empty() ? "" : ",") + axes_[i].name;
      g.rank = g.rank * axes_[i].size + axes_[i].rank;
      g.size *= axes_[i].size;
      outside -= axes_[i].rank * stride_in;
    }
    if (size_ > 1) MPI_Comm_split(MPI_COMM_WORLD, outside, g.rank, &g.comm);
    groups_.push_back(g);
  }
}

Mesh::~Mesh() {
  for (std::vector<MeshAxis>* list : {&axes_, &groups_})
    for (MeshAxis& a : *list)
      if (a.comm != MPI_COMM_NULL) MPI_Comm_free(&a.comm);
}

bool Mesh::all(bool ok) const {
  if (size_ == 1) return ok;
  int mine = ok ? 1 : 0, every = 0;
  MPI_Allreduce(&mine, &every, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return every != 0;
}

void Mesh::start_send(const MeshAxis& axis, int peer, int tag, const std::byte* data, int64_t bytes) const {
  CHECK(bytes <= INT_MAX, "send of {} bytes is too large for one MPI message", bytes);
  auto [it, fresh] = sends_.emplace(data, MPI_REQUEST_NULL);
  ASSERT(fresh);  // a buffer is sent again only after its send_done
  MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, axis.comm, &it->second);
}

void Mesh::finish_send(const std::byte* data) const {
  auto it = sends_.find(data);
  ASSERT(it != sends_.end());
  MPI_Wait(&it->second, MPI_STATUS_IGNORE);
  sends_.erase(it);
}

void Mesh::receive(const MeshAxis& axis, int peer, int tag, std::byte* data, int64_t bytes) const {
  CHECK(bytes <= INT_MAX, "receive of {} bytes is too large for one MPI message", bytes);
  MPI_Status status;
  MPI_Probe(peer, tag, axis.comm, &status);  // its size first: a longer message would end the launch in MPI_Recv
  int got = 0;
  MPI_Get_count(&status, MPI_BYTE, &got);
  CHECK(got == bytes, "a message of {} bytes from rank {} of mesh axis '{}' where {} were expected: the ranks run "
        "different programs (compiled from different configs?)", got, peer, axis.name, bytes);
  MPI_Recv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, axis.comm, MPI_STATUS_IGNORE);
}

const MeshAxis& Mesh::axis(std::string_view name) const {
  for (const std::vector<MeshAxis>* list : {&axes_, &groups_})
    for (const MeshAxis& a : *list)
      if (a.name == name) return a;
  CHECK(false, "the program communicates over mesh axis '{}', which this run's mesh does not have", name);
  __builtin_unreachable();
}

}  // namespace remat::exec
