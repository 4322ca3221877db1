// The fusion kernel (ir/ops.h): its body runs over tiles of kTile elements of the results, each thread over
// its tiles. Where fusion_jit.cpp compiles the body, a tile is one call of the compiled loop, after the tile's
// gathered values (broadcasts of more than one element, iotas) are made. Otherwise each op runs over the tile
// in turn: a param is read where it lies (the operand's elements of the tile), a result is written where it
// goes (the output's), and every other value of the body holds its tile in the thread's workspace; a broadcast
// gathers its operand's elements of the tile, an iota or full makes its own. Each elementwise op is then the
// loop the unfused kernel runs (elementwise_range), so fused and unfused steps give the same bits, and the
// compiled loop gives the interpreter's.
#include "exec/kernels/kernels.h"

#include <algorithm>
#include <cstring>

namespace remat::exec {
namespace {

constexpr int64_t kTile = 2048;  // elements: the tiles of a body's values stay in a core's L2

// Where each body value's tile lives in the thread's scratch (-1: a param). A result has a slot too: it is
// written straight to its output unless the output is an operand's storage (donated: written in place), then
// staged there until the tile's last op has read the operand.
struct Layout {
  std::array<int64_t, ir::kMaxFusionValues> scratch{};
  std::array<int, ir::kMaxFusionValues> result{};  // which result a value is, or -1
  int64_t per_thread = 0;                           // scratch bytes per thread
};

Layout layout_of(const ir::Graph& body) {
  Layout l;
  l.scratch.fill(-1);
  l.result.fill(-1);
  for (size_t k = 0; k < body.results.size(); ++k) l.result[static_cast<size_t>(body.results[k])] = static_cast<int>(k);
  // A tile is never longer than the loop (every value of the body has its shape): a scalar's slot is one element.
  const int64_t tile = std::min(kTile, std::max<int64_t>(1, body.type(body.results[0]).num_elements()));
  for (const ir::Node& m : body.nodes) {
    l.scratch[static_cast<size_t>(m.outputs[0])] = l.per_thread;
    l.per_thread += aligned64(tile * dtype_size(body.type(m.outputs[0]).dtype));
  }
  return l;
}

// dst[0, len) = the elements [lo, lo + len) of broadcast `m`'s result (shape `shape`) from its operand at `src`.
void gather(const ir::Node& m, const ir::Type& operand, const Dims& shape, const std::byte* src, int64_t lo, int64_t len,
            std::byte* dst) {
  const ir::IntList& dims = m.attrs.ints("dims");
  const Dims from = strides_of(operand.shape);
  Dims stride(shape.size(), 0);  // the operand's stride along each result dim (0: broadcast along it)
  for (size_t j = 0; j < dims.size(); ++j)
    if (operand.shape[j] != 1) stride[static_cast<size_t>(dims[j])] = from[j];
  Dims index(shape.size(), 0);
  for (int64_t rest = lo, d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[static_cast<size_t>(d)] = rest % shape[static_cast<size_t>(d)];
    rest /= shape[static_cast<size_t>(d)];
  }
  const size_t last = shape.size() - 1;
  dispatch_bits(dtype_size(operand.dtype), [&](auto bits) {
    using U = decltype(bits);
    const U* x = reinterpret_cast<const U*>(src);
    U* y = reinterpret_cast<U*>(dst);
    for (int64_t i = 0; i < len;) {  // row segment by row segment along the last dim
      int64_t at = 0;
      for (size_t d = 0; d < shape.size(); ++d) at += index[d] * stride[d];
      const int64_t run = std::min(len - i, shape[last] - index[last]), step = stride[last];
      if (step == 0) std::fill(y + i, y + i + run, x[at]);
      else if (step == 1) std::copy_n(x + at, run, y + i);  // the operand's rows as they are (a mask's)
      else
        for (int64_t k = 0; k < run; ++k) y[i + k] = x[at + k * step];
      i += run;
      index[last] += run;
      for (size_t d = last; d > 0 && index[d] == shape[d]; --d) index[d] = 0, ++index[d - 1];
    }
  });
}

using Values = std::array<const std::byte*, ir::kMaxFusionValues>;

// One tile [lo, lo + len) through the compiled loop: the tile's gathered values into the thread's scratch, the
// loop over its first len - len % kFusedLanes elements, then the rest from and into copies padded to
// kFusedLanes. Each group reads all its operands before it writes a result, so a result donated into an operand
// needs no staging.
void run_compiled(FusedLoop loop, const ir::Graph& body, const Layout& l, const Dims& shape, const Values& whole,
                  Values& at, std::span<Array> out, int64_t lo, int64_t len, std::byte* scratch) {
  for (const ir::Node& m : body.nodes) {
    if (!gathered(body, m)) continue;
    const auto v = static_cast<size_t>(m.outputs[0]);
    std::byte* dst = scratch + l.scratch[v];
    if (m.op == ir::Op::iota) constant_range(m, body.type(m.outputs[0]), lo, len, dst);
    else gather(m, body.type(m.inputs[0]), shape, whole[static_cast<size_t>(m.inputs[0])], lo, len, dst);
    at[v] = dst;
  }
  std::array<std::byte*, ir::kMaxFusionValues> results{};
  for (size_t k = 0; k < out.size(); ++k) results[k] = out[k].bytes() + lo * dtype_size(out[k].type().dtype);
  const int64_t groups = len / kFusedLanes * kFusedLanes, rest = len - groups;
  loop(at.data(), results.data(), groups);
  if (rest == 0) return;
  alignas(64) std::array<std::array<std::byte, 4 * kFusedLanes>, ir::kMaxFusionValues> operands{}, written{};
  const int64_t total = body.type(body.results[0]).num_elements();
  for (size_t v = 0; v < at.size(); ++v) {  // every value the loop reads element by element: it has the loop's size
    if (at[v] == nullptr) continue;
    const ir::Type& type = body.type(static_cast<ir::ValueId>(v));
    if (type.num_elements() != total) continue;  // a param that only broadcasts read (whole, or gathered)
    const int64_t size = dtype_size(type.dtype);
    std::memcpy(operands[v].data(), at[v] + groups * size, static_cast<size_t>(rest * size));
    at[v] = operands[v].data();
  }
  std::array<std::byte*, ir::kMaxFusionValues> padded{};
  for (size_t k = 0; k < out.size(); ++k) padded[k] = written[k].data();
  loop(at.data(), padded.data(), kFusedLanes);
  for (size_t k = 0; k < out.size(); ++k) {
    const int64_t size = dtype_size(out[k].type().dtype);
    std::memcpy(results[k] + groups * size, written[k].data(), static_cast<size_t>(rest * size));
  }
}

}  // namespace

int64_t workspace_fusion(const ir::Node& n, std::span<const ir::Type>) {
  return layout_of(*n.body).per_thread * omp_get_max_threads();
}

void kernel_fusion(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  const ir::Graph& body = *n.body;
  const Layout l = layout_of(body);
  const ir::Type& loop = body.type(body.results[0]);
  const Dims shape = loop.shape.empty() ? Dims(1, 1) : Dims(loop.shape);
  const int64_t total = loop.num_elements(), tiles = (total + kTile - 1) / kTile;
  ASSERT(static_cast<int64_t>(ctx.workspace.size()) >= l.per_thread * omp_get_max_threads());
  const FusedLoop compiled = fused_loop(n.body);
  bool in_place = false;  // a result donated into an operand's storage
  for (const Array& o : out)
    for (const Array& a : in) in_place = in_place || o.bytes() == a.bytes();
  parallel_ranges(tiles, total >= kParallelMin, [&](int64_t first, int64_t end) {
    std::byte* scratch = ctx.workspace.data() + l.per_thread * omp_get_thread_num();
    std::array<const std::byte*, ir::kMaxFusionValues> at{};  // each value's tile
    std::array<const std::byte*, ir::kMaxFusionValues> whole{};  // each param's first element
    for (size_t i = 0; i < body.params.size(); ++i) whole[static_cast<size_t>(body.params[i])] = in[i].bytes();
    std::array<const std::byte*, 3> operands{};
    for (int64_t t = first; t < end; ++t) {
      const int64_t lo = t * kTile, len = std::min(kTile, total - lo);
      for (size_t i = 0; i < body.params.size(); ++i)  // a param of one element is read whole (by broadcasts)
        at[static_cast<size_t>(body.params[i])] =
            in[i].bytes() + (in[i].size() == 1 ? 0 : lo * dtype_size(in[i].type().dtype));
      if (compiled) {
        run_compiled(compiled, body, l, shape, whole, at, out, lo, len, scratch);
        continue;
      }
      for (const ir::Node& m : body.nodes) {
        const ir::ValueId v = m.outputs[0];
        const ir::Type& type = body.type(v);
        const int k = l.result[static_cast<size_t>(v)];
        std::byte* dst = k >= 0 && !in_place ? out[static_cast<size_t>(k)].bytes() + lo * dtype_size(type.dtype)
                                             : scratch + l.scratch[static_cast<size_t>(v)];
        if (m.op == ir::Op::broadcast_in_dim) {
          gather(m, body.type(m.inputs[0]), shape, whole[static_cast<size_t>(m.inputs[0])], lo, len, dst);
        } else if (m.op == ir::Op::iota || m.op == ir::Op::full) {
          constant_range(m, type, lo, len, dst);
        } else {
          for (size_t q = 0; q < m.inputs.size(); ++q) operands[q] = at[static_cast<size_t>(m.inputs[q])];
          const DType operand = body.type(m.inputs[m.op == ir::Op::select ? 1 : 0]).dtype;
          elementwise_range(m, operand, type.dtype, std::span(operands.data(), m.inputs.size()), dst, len);
        }
        at[static_cast<size_t>(v)] = dst;
      }
      if (in_place)
        for (size_t k = 0; k < out.size(); ++k) {
          const int64_t size = dtype_size(out[k].type().dtype);
          std::memcpy(out[k].bytes() + lo * size, at[static_cast<size_t>(body.results[k])], static_cast<size_t>(len * size));
        }
    }
  });
}

}  // namespace remat::exec
