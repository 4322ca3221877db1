// The device mesh of a distributed run (docs/parallelism.md): one process per rank, launched by Open MPI's mpirun,
// and named axes whose sizes multiply to the number of processes. Each axis is a communicator over the
// ranks that differ only in that axis's coordinate (the last axis varies fastest). A group of several axes,
// named by their names joined with commas in the mesh's order ("data,fsdp"), is the communicator over the
// ranks that differ only in those axes, ordered row-major (its last axis fastest). Collective kernels find
// their axis or group here through exec::Options::mesh.
// Determinism: a collective's sum is taken in rank order on every rank (each rank receives every rank's
// part of its chunk and adds them in order 0, 1, ...), never in an order the MPI library picks, so the
// result does not depend on the library, the launch or the network.
//
//   exec::Mesh mesh({{"data", 2}});     // under `mpirun -np 2`; without mpirun only sizes of 1 are allowed
//   exec::Options o{.mesh = &mesh};
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace remat::exec {

struct MeshAxis {
  std::string name;
  int size = 1;
  int rank = 0;                   // this process's coordinate along the axis
  MPI_Comm comm = MPI_COMM_NULL;  // the ranks sharing every other coordinate; null when MPI is not running
};

class Mesh {
 public:
  // One process: no axes, no MPI.
  Mesh() = default;
  // The processes of this launch arranged as `axes` (name, size); CHECKs that the sizes multiply to the
  // number of processes mpirun started (1 without mpirun).
  explicit Mesh(const std::vector<std::pair<std::string, int>>& axes);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }  // in the whole launch
  int size() const { return size_; }
  // An axis, or a group of axes ("data,fsdp"); CHECKs that the mesh has it.
  const MeshAxis& axis(std::string_view name) const;
  // Whether `ok` holds on every rank (a barrier as well); `ok` itself without MPI.
  bool all(bool ok) const;
  const std::vector<MeshAxis>& axes() const { return axes_; }

  // Point to point (the send, send_done and recv kernels): starts sending `bytes` at `data` to coordinate `peer`
  // of `axis` as a message of kind `tag` (MPI_Isend); waits until the send from `data` completed; receives the
  // next message of kind `tag` from `peer` into `data`, CHECKing its size. A send in flight is known by its
  // buffer, which its program keeps live until the wait.
  void start_send(const MeshAxis& axis, int peer, int tag, const std::byte* data, int64_t bytes) const;
  void finish_send(const std::byte* data) const;
  void receive(const MeshAxis& axis, int peer, int tag, std::byte* data, int64_t bytes) const;

  // The number of processes mpirun started for this launch (1 when not launched by mpirun); MPI is
  // initialised on first use when there are several.
  static int launched_ranks();
  // Under mpirun: the text the first rank of the launch passes (every rank calls it); else `text` itself.
  static std::string first_rank_text(const std::string& text);
  // After an error on this rank: ends every rank of the launch with exit status `code` (MPI_Abort) when MPI is
  // running, since the others would wait in their next collective forever; otherwise returns.
  static void abort_launch(int code);

 private:
  std::vector<MeshAxis> axes_;
  std::vector<MeshAxis> groups_;  // every set of two or more axes
  mutable std::map<const std::byte*, MPI_Request> sends_;  // in flight, by buffer (kernels see a const Mesh)
  int rank_ = 0, size_ = 1;
};

}  // namespace remat::exec
