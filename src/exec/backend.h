// The backend seam: what the executor needs from a machine. Memory per space (device,
// host), copies between buffers of any spaces, a kernel for every op without a body (the executor runs
// scans itself), the workspace each kernel call needs (planned into the arena like any buffer), and
// synchronisation. The CPU is the one implementation; a GPU backend is another implementation of this,
// not a change to the executor.
#pragma once

#include "exec/array.h"

#include <cstddef>
#include <span>

namespace remat::exec {

struct Options;

// What a kernel call gets besides its node and operands: the run's options and the node's workspace, a
// planned buffer of the bytes Backend::workspace_bytes asked for (empty when it asked for none).
struct KernelContext {
  const Options& options;
  std::span<std::byte> workspace;
};

using Kernel = void (*)(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx);

class Backend {
 public:
  virtual ~Backend() = default;
  // A buffer of `bytes` in memory space `host` (false: the device's), zeroed and faulted in: running on it
  // takes no page fault.
  virtual Array allocate(bool host, int64_t bytes) const = 0;
  // Copies from's bytes into `to` at `byte_offset` (buffers of either space; overlapping allowed).
  virtual void copy(const Array& from, const Array& to, int64_t byte_offset = 0) const = 0;
  // The kernel of an op without a body.
  virtual Kernel kernel(ir::Op op) const = 0;
  // Workspace bytes a call of `n` on operands of these types needs (0 for most ops).
  virtual int64_t workspace_bytes(const ir::Node& n, std::span<const ir::Type> in) const = 0;
  // Returns when every kernel launched so far has finished.
  virtual void synchronize() const = 0;
};

// The CPU backend: oneDNN matmuls, OpenMP loops; device and host memory are both host RAM.
const Backend& cpu();

}  // namespace remat::exec
