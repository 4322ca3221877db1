#include "exec/mesh.h"

#include "base/check.h"

#include <fmt/format.h>

#include <cstdlib>
#include <algorithm>
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
}

Mesh::~Mesh() {
  for (MeshAxis& a : axes_)
    if (a.comm != MPI_COMM_NULL) MPI_Comm_free(&a.comm);
}

const MeshAxis& Mesh::axis(std::string_view name) const {
  for (const MeshAxis& a : axes_)
    if (a.name == name) return a;
  CHECK(false, "the program communicates over mesh axis '{}', which this run's mesh does not have", name);
  __builtin_unreachable();
}

}  // namespace remat::exec
