// dot_general through oneDNN's batched matmul. The operands are viewed as lhs (B, M, K) and rhs (B, K, N);
// when an operand's dims are stored as [batch, free, contract] or [batch, contract, free] the view is just
// strides (a transpose folded into the descriptor), otherwise the operand is first copied into that order (so is
// a swapped rhs that f32 tiles read faster in order: transposes_rhs).
// The output [batch, lhs free, rhs free] is (B, M, N) row-major. The copies and oneDNN's scratchpad live
// in the node's planned workspace: [lhs copy][rhs copy][scratchpad, or one per thread][packed rhs][its reorder's
// scratchpad] (the last two where a whole matmul packs its rhs: packs_rhs), each 64-byte aligned.
// Everything that depends only on the shapes (the layout analysis, the primitive, its memory objects) is
// made once per node and reused, so a steady-state call allocates nothing. oneDNN has no f64 or i32
// matmul on CPU: those dtypes use the reference kernel.
//
// The thread count never changes a result's bits. oneDNN picks a matmul's thread decomposition from the thread
// count. Its AVX-512 kernels (brgemm) compute an output the same way in any decomposition unless it splits the
// contraction across threads, which it does where the outputs are few for the threads and the contraction long
// (an f32 [32768,16]^T x [32768,24] product at 2 threads, a [65536,1024]^T x [65536,512] one at 16). Its older
// kernels (gemm:jit, on CPUs without AVX-512) give an output other bits when another block of the decomposition
// holds it, at any shape (a [64,16] x [16,128] product differs between 2 and 3 threads on an AVX2 CPU). So a
// matmul runs as fixed output tiles per batch entry (tile_shape: by the shapes), whatever the thread count,
// each tile one single-threaded oneDNN call, the tiles shared by our threads, unless oneDNN's kernel is brgemm
// and the contraction no longer than an output side (outputs enough for many threads): each output is then
// computed by the same call, in the same order, at any thread count. tests/exec/thread_count_test.cpp checks
// the shapes of a step. A bf16 weight gradient runs as tiles whatever its contraction (tiles_faster).
//
// Where oneDNN has no bf16 matmul (CPUs without AVX-512), a bf16 matmul runs the same tiles in f32: each tile's
// rows of lhs and columns of rhs are widened into the thread's workspace (exactly: a bf16 is an f32 with a
// shorter mantissa; the columns once for each run of a column's tiles the thread takes), multiplied there with
// f32 accumulation, and rounded to bf16 (nearest, ties to even) into the output: the arithmetic of oneDNN's bf16
// matmul, in another summation order.
#include "exec/kernels/dot_general_tiles.h"
#include "exec/kernels/kernels.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

namespace remat::exec {
namespace {

int64_t product(const ir::Shape& s, const Dims& dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= s[static_cast<size_t>(d)];
  return p;
}

// How one operand is fed to the matmul: as it is (possibly with swapped matrix strides), or copied
// into [batch, g1, g2] order.
struct Layout {
  bool swapped = false;      // memory holds [batch, g2, g1]: a transposed matrix, no copy
  bool copy = false;         // neither order matches (or transposes_rhs): copy with these strides into that order
  Dims copy_src_strides, copy_shape;
};

// `order` read from `s`: copied into [batch, g1, g2] order.
Layout copied(const ir::Shape& s, const Dims& order) {
  Layout l;
  l.copy = true;
  Dims strides = strides_of(Dims(s));
  for (int64_t d : order) {
    l.copy_src_strides.push_back(strides[static_cast<size_t>(d)]);
    l.copy_shape.push_back(s[static_cast<size_t>(d)]);
  }
  return l;
}

// `transpose`: a swapped matrix is copied into order too.
Layout analyze(const ir::Shape& s, const ir::IntList& batch, const Dims& g1, const ir::IntList& g2_list,
               bool transpose = false) {
  Dims g2(g2_list), order, swapped, identity;
  for (int64_t d : batch) order.push_back(d), swapped.push_back(d);
  for (int64_t d : g1) order.push_back(d);
  for (int64_t d : g2) order.push_back(d), swapped.push_back(d);
  for (int64_t d : g1) swapped.push_back(d);
  for (size_t i = 0; i < s.size(); ++i) identity.push_back(static_cast<int64_t>(i));
  Layout l;
  if (order == identity) return l;
  if (swapped == identity && !transpose) {
    l.swapped = true;
    return l;
  }
  return copied(s, order);
}

dnnl::memory::data_type dnnl_type(DType d) {
  switch (d) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    case DType::f16: return dnnl::memory::data_type::f16;
    default: ASSERT(false);
  }
  return dnnl::memory::data_type::undef;
}

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
};

Engine& engine() {
  static Engine e;
  return e;
}

// oneDNN fixes a primitive's decomposition for the thread count its descriptor is made under, and keys its
// primitive cache by the thread count the primitive is made under: a tile's descriptor and primitive are both
// made in the scope of one of these.
struct OneThread {
  const int saved = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;
};

// One output tile shape of a tiled matmul: whole tiles, and the last row and last column of tiles where the tile
// sizes do not divide M or N. Indexed by (last row) * 2 + (last column).
struct TileKind {
  int64_t rows = 0, cols = 0;
  dnnl::matmul::primitive_desc pd;
};

// What the shapes decide: how each operand is fed, and the matmul's primitive descriptor (one for the whole
// matmul, or one per tile kind, made for one thread).
struct Analysis {
  Sizes sizes;
  Layout a_layout, b_layout;
  dnnl::matmul::primitive_desc pd;
  std::vector<TileKind> tiles;  // empty: oneDNN's own decomposition
  TileShape tile;               // of the whole tiles
  bool widened = false;         // bf16 tiles computed in f32 (this CPU's oneDNN has no bf16 matmul)
  int64_t a_ld = 0, b_ld = 0;   // a tile's lhs, rhs copied into the thread's workspace, rows this many elements apart
  int64_t element_size = 0;     // of a tile's arithmetic: 4 widened, else the operands'
  int64_t pad_bytes = 0;        // scratchpad of the whole matmul, or of one thread's tile
  // A whole matmul may read its rhs packed into oneDNN's blocked layout (packs_rhs): the reorder from the rhs
  // as stored, its scratchpad, and the packed rhs's bytes.
  dnnl::reorder::primitive_desc pack;
  int64_t pack_pad_bytes = 0, packed_bytes = 0;
};

// A tile's copies in a thread's workspace, after its scratchpad, each in its source's orientation: widened or
// where its rows would alias, the lhs rows x K (K x rows when swapped), rows a_ld apart, and the rhs K x cols
// (cols x K when swapped), rows b_ld apart; widened, the f32 result rows x cols. `end` is the bytes they take.
struct TileCopies {
  std::byte *a, *b, *c;
  int64_t end;
};
TileCopies tile_copies(std::byte* at, const Analysis& x) {
  const Sizes& z = x.sizes;
  const int64_t rows = x.tile.rows, cols = x.tile.cols;
  const int64_t a = aligned64(x.pad_bytes);
  const int64_t b = a + (x.a_ld > 0 ? aligned64((x.a_layout.swapped ? z.K : rows) * x.a_ld * x.element_size) : 0);
  const int64_t c = b + (x.b_ld > 0 ? aligned64((x.b_layout.swapped ? cols : z.K) * x.b_ld * x.element_size) : 0);
  const int64_t end = c + (x.widened ? aligned64(rows * cols * 4) : 0);
  auto to = [&](int64_t offset) { return at ? at + offset : nullptr; };
  return {to(a), to(b), to(c), end};
}

// The kinds' primitives read operands and write outputs in place through their strides, or the thread's copies
// (tile_copies) where a_ld, b_ld or widened say so.
std::vector<TileKind> tile_kinds(const Sizes& z, const TileShape& tile, const Layout& a, const Layout& b,
                                 bool widened, int64_t a_ld, int64_t b_ld, dnnl::memory::data_type dt,
                                 const dnnl::primitive_attr& attr) {
  using dims = dnnl::memory::dims;
  std::vector<TileKind> kinds(4);
  const OneThread one_thread;
  for (int last_row : {0, 1})
    for (int last_col : {0, 1}) {
      const int64_t rows = last_row ? z.M % tile.rows : tile.rows, cols = last_col ? z.N % tile.cols : tile.cols;
      if (rows == 0 || cols == 0) continue;  // the tiles divide M (or N): no last row (column) of other tiles
      const int64_t lda = a_ld > 0 ? a_ld : a.swapped ? z.M : z.K, ldn = widened ? cols : z.N;
      dnnl::memory::desc src(dims{rows, z.K}, dt, a.swapped ? dims{1, lda} : dims{lda, 1});
      const int64_t ldb = b_ld > 0 ? b_ld : b.swapped ? z.K : z.N;
      dnnl::memory::desc weights(dims{z.K, cols}, dt, b.swapped ? dims{1, ldb} : dims{ldb, 1});
      dnnl::memory::desc dst(dims{rows, cols}, dt, dims{ldn, 1});
      kinds[static_cast<size_t>(last_row * 2 + last_col)] = {
          rows, cols, dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, engine().engine)};
    }
  return kinds;
}

bool is_brgemm(const dnnl::matmul::primitive_desc& pd) { return std::string_view(pd.impl_info_str()).starts_with("brg"); }

// Whether oneDNN has a bf16 matmul on this CPU (AVX-512 and later; DNNL_MAX_CPU_ISA can lower it): asked once.
bool has_bf16_matmul() {
  static const bool has = [] {
    const dnnl::memory::desc one({1, 1}, dnnl::memory::data_type::bf16, dnnl::memory::dims{1, 1});
    try {
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(one, one, one), engine().engine);
      return true;
    } catch (const dnnl::error& e) {
      if (e.status != dnnl_unimplemented) throw;
      return false;
    }
  }();
  return has;
}

// Whether a whole matmul packs its rhs: a matrix (no batch) that many rows of lhs read. oneDNN's brgemm copies a
// plain rhs into its blocked layout block by block as it goes; packed once by a reorder, its matmuls ran 5-9%
// faster on the medium config's shapes (2 cores, AVX512_BF16: [2048,768] x [768,3072] 395 -> 438 GFLOP/s, the
// reorder 0.26 ms of 22), and the reorder costs 1/M of the matmul: a weight's rows are read by every token.
bool packs_rhs(const Sizes& z) { return z.B == 1 && z.M >= 2048; }

// The whole matmul `x` with its rhs in the layout oneDNN picks for it (format any) where that is brgemm and not
// the plain one: the matmul, the reorder into that layout, and their sizes.
void pack_rhs(Analysis& x, const dnnl::memory::desc& lhs, const dnnl::memory::desc& rhs_as_read,
              const dnnl::memory::desc& out, const dnnl::primitive_attr& attr) {
  const dnnl::memory::desc any(rhs_as_read.dims(), rhs_as_read.data_type(), dnnl::memory::format_tag::any);
  dnnl::matmul::primitive_desc packed(dnnl::matmul::desc(lhs, any, out), attr, engine().engine);
  if (!is_brgemm(packed) || packed.weights_desc() == rhs_as_read) return;
  x.pd = packed;
  x.pack = dnnl::reorder::primitive_desc(engine().engine, rhs_as_read, engine().engine, packed.weights_desc(), attr);
  x.pack_pad_bytes = static_cast<int64_t>(x.pack.scratchpad_desc().get_size());
  x.packed_bytes = static_cast<int64_t>(packed.weights_desc().get_size());
}

Analysis analyze(const ir::Node& n, const ir::Type& lhs, const ir::Type& rhs) {
  const ir::IntLists& ct = n.attrs.int_lists("contract");
  const ir::IntLists& bt = n.attrs.int_lists("batch");
  const ir::Shape& ls = lhs.shape;
  const ir::Shape& rs = rhs.shape;
  Dims lf = free_dims(lhs.rank(), ct[0], bt[0]), rf = free_dims(rhs.rank(), ct[1], bt[1]);
  Analysis a;
  Sizes& z = a.sizes;
  z = {product(ls, bt[0]), product(ls, lf), product(ls, ct[0]), product(rs, rf)};
  a.a_layout = analyze(ls, bt[0], lf, ct[0]);  // (B, M, K), or (B, K, M) in memory when swapped
  Dims contract_rhs(ct[1]);
  ir::IntList rf_list(rf.begin(), rf.end());
  a.b_layout = analyze(rs, bt[1], contract_rhs, rf_list);  // (B, K, N), or (B, N, K) in memory when swapped
  using dims = dnnl::memory::dims;
  auto dt = dnnl_type(lhs.dtype);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // in the planned workspace
  // Without batch dims the descriptors are 2-D: oneDNN picks faster kernels for plain matrices.
  auto md = [&](int64_t rows, int64_t cols, bool swapped) {
    dims strides = swapped ? dims{1, rows} : dims{cols, 1};
    if (z.B == 1) return dnnl::memory::desc(dims{rows, cols}, dt, strides);
    return dnnl::memory::desc(dims{z.B, rows, cols}, dt, dims{rows * cols, strides[0], strides[1]});
  };
  a.widened = lhs.dtype == DType::bf16 && !has_bf16_matmul();
  if (!a.widened && !long_contraction(z) && !tiles_faster(z, a.a_layout.swapped, lhs.dtype)) {
    a.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(md(z.M, z.K, a.a_layout.swapped),
                                                           md(z.K, z.N, a.b_layout.swapped), md(z.M, z.N, false)),
                                        attr, engine().engine);
    if (is_brgemm(a.pd)) {
      if (packs_rhs(z)) pack_rhs(a, md(z.M, z.K, a.a_layout.swapped), md(z.K, z.N, a.b_layout.swapped),
                                 md(z.M, z.N, false), attr);
      a.pad_bytes = static_cast<int64_t>(a.pd.scratchpad_desc().get_size());
      return a;
    }
    a.pd = {};
  }
  if (transposes_rhs(z, a.b_layout.swapped, lhs.dtype)) a.b_layout = analyze(rs, bt[1], contract_rhs, rf_list, true);
  a.element_size = a.widened ? 4 : dtype_size(lhs.dtype);
  const bool a_swapped = a.a_layout.swapped, b_swapped = a.b_layout.swapped;
  auto copies = [&] {
    a.a_ld = copied_ld(a_swapped ? a.tile.rows : z.K, a_swapped ? z.M : z.K, a_swapped, a.widened, a.element_size);
    a.b_ld = copied_ld(b_swapped ? z.K : a.tile.cols, b_swapped ? z.K : z.N, true, a.widened, a.element_size);
  };
  a.tile = tile_shape(z, false);
  copies();
  // Grown only where the tiles read their operands in place: a copy takes K x (rows + cols) of each thread's
  // workspace (llama3-8b's [32768,4096]^T x [32768,14336] at 384 x 768: 75 MB a thread).
  if (!a.widened && lhs.dtype == DType::bf16 && a.a_ld == 0 && a.b_ld == 0) {
    a.tile = tile_shape(z, true);
    copies();
  }
  a.tiles = tile_kinds(z, a.tile, a.a_layout, a.b_layout, a.widened, a.a_ld, a.b_ld,
                       a.widened ? dnnl::memory::data_type::f32 : dt, attr);
  for (const TileKind& k : a.tiles)
    if (k.rows > 0) a.pad_bytes = std::max(a.pad_bytes, static_cast<int64_t>(k.pd.scratchpad_desc().get_size()));
  return a;
}

// What one thread of tiles takes: its tile's scratchpad, then its copies (tile_copies).
int64_t per_thread_bytes(const Analysis& a) {
  return tile_copies(nullptr, a).end;
}
// The scratchpads a call takes: one for the whole matmul, or one per thread of tiles.
int64_t scratchpad_bytes(const Analysis& a, int threads) {
  return a.tiles.empty() ? a.pad_bytes : threads * per_thread_bytes(a);
}

bool uses_onednn(DType dt, const Options& options) {
  return !options.reference_kernels && (dt == DType::f32 || dt == DType::bf16);
}

// A primitive (a matmul, or the reorder that packs one's rhs) with the memory objects and argument list it
// executes with; the memories' data handles are set per call.
struct Call {
  dnnl_primitive_t primitive = nullptr;  // owned by the Entry's matmuls or its reorder
  dnnl::memory a, b, c, pad;
  std::vector<dnnl_exec_arg_t> args;  // for the C API: the C++ execute() builds this vector on every call

  Call() = default;  // a tile kind the shapes do not have

  Call(const dnnl::matmul& m, const dnnl::matmul::primitive_desc& pd) : primitive(m.get()) {
    a = dnnl::memory(pd.src_desc(), engine().engine, DNNL_MEMORY_NONE);
    b = dnnl::memory(pd.weights_desc(), engine().engine, DNNL_MEMORY_NONE);
    c = dnnl::memory(pd.dst_desc(), engine().engine, DNNL_MEMORY_NONE);
    pad = dnnl::memory(pd.scratchpad_desc(), engine().engine, DNNL_MEMORY_NONE);
    args = {{DNNL_ARG_SRC, a.get()}, {DNNL_ARG_WEIGHTS, b.get()}, {DNNL_ARG_DST, c.get()},
            {DNNL_ARG_SCRATCHPAD, pad.get()}};
  }
  // A reorder: `a` its source, `c` its destination.
  Call(const dnnl::reorder& r, const dnnl::reorder::primitive_desc& pd) : primitive(r.get()) {
    a = dnnl::memory(pd.src_desc(), engine().engine, DNNL_MEMORY_NONE);
    c = dnnl::memory(pd.dst_desc(), engine().engine, DNNL_MEMORY_NONE);
    pad = dnnl::memory(pd.scratchpad_desc(), engine().engine, DNNL_MEMORY_NONE);
    args = {{DNNL_ARG_FROM, a.get()}, {DNNL_ARG_TO, c.get()}, {DNNL_ARG_SCRATCHPAD, pad.get()}};
  }
  dnnl_status_t run(const dnnl::stream& stream, void* lhs, void* rhs, void* out, void* scratchpad) {
    b.set_data_handle(rhs);
    return execute(stream, lhs, out, scratchpad);
  }
  dnnl_status_t run_reorder(const dnnl::stream& stream, void* from, void* to, void* scratchpad) {
    return execute(stream, from, to, scratchpad);
  }

 private:
  dnnl_status_t execute(const dnnl::stream& stream, void* first, void* last, void* scratchpad) {
    a.set_data_handle(first);
    c.set_data_handle(last);
    pad.set_data_handle(scratchpad);
    const dnnl_status_t s = dnnl_primitive_execute(primitive, stream.get(), static_cast<int>(args.size()), args.data());
    return s == dnnl_success ? dnnl_stream_wait(stream.get()) : s;
  }
};

// Everything a node's matmul needs, made on its first call.
struct Entry {
  ir::Type lhs, rhs;           // the operand types and dimension numbers it was made for: a node address
  ir::IntLists contract, batch;  // reused by another graph, or new shapes, remake it
  // oneDNN fixes a primitive's thread decomposition, and so its scratchpad size, when it is made: a primitive
  // made under another OpenMP thread count would run with that count and need another workspace than planned.
  // A tiled matmul's primitives are made for one thread, but its calls and scratchpads are per thread.
  int threads = 0;
  Analysis x;
  std::vector<dnnl::matmul> matmuls;   // the whole matmul, or one per tile kind (empty where none)
  dnnl::reorder pack;                  // the rhs into its packed layout (Analysis::pack), if it has one
  Call packing;                        // its memories and arguments, the handles set per call
  std::vector<dnnl::stream> streams;   // one per thread
  std::vector<std::vector<Call>> calls;  // [thread][tile kind], or [0][0] for the whole matmul
  // Widened: the column of tiles (batch entry · column tiles + column) whose rhs each thread's workspace holds in
  // f32 during a call (-1: none yet).
  std::vector<int64_t> widened_column;
};

Entry make_entry(const ir::Node& n, const ir::Type& lhs, const ir::Type& rhs) {
  Entry e;
  e.lhs = lhs;
  e.rhs = rhs;
  e.contract = n.attrs.int_lists("contract");
  e.batch = n.attrs.int_lists("batch");
  e.threads = omp_get_max_threads();
  e.x = analyze(n, lhs, rhs);
  std::vector<const dnnl::matmul::primitive_desc*> pds;
  if (e.x.tiles.empty()) pds.push_back(&e.x.pd);
  for (const TileKind& k : e.x.tiles) pds.push_back(k.rows > 0 ? &k.pd : nullptr);
  {
    std::optional<OneThread> one_thread;
    if (!e.x.tiles.empty()) one_thread.emplace();
    for (const auto* pd : pds) e.matmuls.push_back(pd ? dnnl::matmul(*pd) : dnnl::matmul());
  }
  if (e.x.packed_bytes > 0) {
    e.pack = dnnl::reorder(e.x.pack);
    e.packing = Call(e.pack, e.x.pack);
  }
  const int callers = e.x.tiles.empty() ? 1 : e.threads;
  e.widened_column.assign(static_cast<size_t>(callers), -1);
  for (int t = 0; t < callers; ++t) {
    e.streams.emplace_back(engine().engine);
    e.calls.emplace_back();
    for (size_t k = 0; k < pds.size(); ++k)
      if (pds[k]) e.calls.back().emplace_back(e.matmuls[k], *pds[k]);
      else e.calls.back().emplace_back();
  }
  return e;
}

// `outer` runs of n elements, `from_ld` elements apart at `from`, converted into runs `to_ld` apart at `to`: bf16
// widened to f32, or f32 rounded to bf16.
template <class From, class To>
void convert_runs(const From* from, int64_t from_ld, To* to, int64_t to_ld, int64_t outer, int64_t n) {
  auto dtype = [](auto* p) { return std::is_same_v<std::remove_cvref_t<decltype(*p)>, float> ? DType::f32 : DType::bf16; };
  for (int64_t o = 0; o < outer; ++o)
    convert_elements(dtype(from), dtype(to), reinterpret_cast<const std::byte*>(from + o * from_ld),
                     reinterpret_cast<std::byte*>(to + o * to_ld), n);
}

// The runs a tile reads of its lhs (rows [r0, r0 + rows)) or rhs (columns [c0, c0 + cols)), in the operand's
// orientation: f(first element, elements between runs, runs, run length), in elements of the operand.
template <class F>
void lhs_runs(const Analysis& x, int64_t r0, int64_t rows, F f) {
  const Sizes& z = x.sizes;
  if (x.a_layout.swapped) f(r0, z.M, z.K, rows);
  else f(r0 * z.K, z.K, rows, z.K);
}
template <class F>
void rhs_runs(const Analysis& x, int64_t c0, int64_t cols, F f) {
  const Sizes& z = x.sizes;
  if (x.b_layout.swapped) f(c0 * z.K, z.K, cols, z.K);
  else f(c0, z.N, z.K, cols);
}

// One widened tile: rows [r0, r0 + rows) of batch entry `lhs` against columns [c0, c0 + cols) of `rhs`, whose
// f32 copy the workspace holds already when `rhs_held`.
dnnl_status_t run_wide_tile(Call& call, const dnnl::stream& stream, const Analysis& x, const bf16_t* lhs,
                            const bf16_t* rhs, bf16_t* out, int64_t r0, int64_t c0, int64_t rows, int64_t cols,
                            std::byte* scratch, bool rhs_held) {
  const Sizes& z = x.sizes;
  const TileCopies w = tile_copies(scratch, x);
  auto* a = reinterpret_cast<float*>(w.a);
  auto* b = reinterpret_cast<float*>(w.b);
  auto* c = reinterpret_cast<float*>(w.c);
  lhs_runs(x, r0, rows,
           [&](int64_t at, int64_t ld, int64_t outer, int64_t n) { convert_runs(lhs + at, ld, a, x.a_ld, outer, n); });
  if (!rhs_held)
    rhs_runs(x, c0, cols,
             [&](int64_t at, int64_t ld, int64_t outer, int64_t n) { convert_runs(rhs + at, ld, b, x.b_ld, outer, n); });
  const dnnl_status_t s = call.run(stream, a, b, c, x.pad_bytes > 0 ? scratch : nullptr);
  if (s == dnnl_success) convert_runs(c, cols, out + r0 * z.N + c0, z.N, rows, cols);
  return s;
}

// `outer` runs of n elements, `from_ld` elements apart at `from`, copied into runs `to_ld` apart at `to`.
void copy_runs(const std::byte* from, int64_t from_ld, std::byte* to, int64_t to_ld, int64_t outer, int64_t n,
               int64_t element_size) {
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(to + o * to_ld * element_size, from + o * from_ld * element_size, n * element_size);
}
// A tile's lhs, rows [r0, r0 + rows) of `lhs`, copied into the thread's workspace (copied_ld): the copy.
std::byte* copy_lhs(const Analysis& x, const std::byte* lhs, int64_t r0, int64_t rows, std::byte* scratch) {
  std::byte* to = tile_copies(scratch, x).a;
  const int64_t es = x.element_size;
  lhs_runs(x, r0, rows,
           [&](int64_t at, int64_t ld, int64_t outer, int64_t n) { copy_runs(lhs + at * es, ld, to, x.a_ld, outer, n, es); });
  return to;
}
// A tile's rhs, columns [c0, c0 + cols) of `rhs`, copied into the thread's workspace (copied_ld): the copy.
std::byte* copy_rhs(const Analysis& x, const std::byte* rhs, int64_t c0, int64_t cols, std::byte* scratch) {
  std::byte* to = tile_copies(scratch, x).b;
  const int64_t es = x.element_size;
  rhs_runs(x, c0, cols,
           [&](int64_t at, int64_t ld, int64_t outer, int64_t n) { copy_runs(rhs + at * es, ld, to, x.b_ld, outer, n, es); });
  return to;
}

// Runs a tiled matmul: every (batch entry, tile) is one single-threaded call, on whichever thread takes it. Widened,
// the tiles are taken column by column (rows fastest), and a thread converts a column's rhs (the larger of a tile's
// operands) once for the run of its tiles it takes.
void run_tiles(Entry& e, std::byte* lhs, std::byte* rhs, std::byte* out, std::byte* per_thread, int64_t element_size) {
  const Sizes& z = e.x.sizes;
  const TileShape& shape = e.x.tile;
  const int64_t row_tiles = (z.M + shape.rows - 1) / shape.rows, col_tiles = (z.N + shape.cols - 1) / shape.cols;
  const int64_t tiles = z.B * row_tiles * col_tiles;
  const int64_t a_row = e.x.a_layout.swapped ? 1 : z.K, b_col = e.x.b_layout.swapped ? z.K : 1;
  const int64_t stride = per_thread_bytes(e.x);
  std::fill(e.widened_column.begin(), e.widened_column.end(), -1);  // the operands are new
  std::atomic<int> failed{dnnl_success};
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t b = t / (row_tiles * col_tiles), tile = t % (row_tiles * col_tiles);
    const int64_t i = e.x.widened ? tile % row_tiles : tile / col_tiles, j = e.x.widened ? tile / row_tiles : tile % col_tiles;
    const bool last_row = i == row_tiles - 1 && z.M % shape.rows != 0;
    const bool last_col = j == col_tiles - 1 && z.N % shape.cols != 0;
    const auto thread = static_cast<size_t>(omp_get_thread_num()), kind = static_cast<size_t>(last_row * 2 + last_col);
    Call& call = e.calls[thread][kind];
    std::byte* scratch = stride > 0 ? per_thread + static_cast<int64_t>(thread) * stride : nullptr;
    const int64_t r0 = i * shape.rows, c0 = j * shape.cols;
    std::byte *a = lhs + b * z.M * z.K * element_size, *w = rhs + b * z.K * z.N * element_size,
              *c = out + b * z.M * z.N * element_size;
    const int64_t column = b * col_tiles + j;
    const bool rhs_held = e.x.widened && std::exchange(e.widened_column[thread], column) == column;
    const dnnl_status_t s =
        e.x.widened
            ? run_wide_tile(call, e.streams[thread], e.x, reinterpret_cast<const bf16_t*>(a),
                            reinterpret_cast<const bf16_t*>(w), reinterpret_cast<bf16_t*>(c), r0, c0,
                            e.x.tiles[kind].rows, e.x.tiles[kind].cols, scratch, rhs_held)
            : call.run(e.streams[thread],
                       e.x.a_ld > 0 ? copy_lhs(e.x, a, r0, e.x.tiles[kind].rows, scratch) : a + r0 * a_row * element_size,
                       e.x.b_ld > 0 ? copy_rhs(e.x, w, c0, e.x.tiles[kind].cols, scratch) : w + c0 * b_col * element_size,
                       c + (r0 * z.N + c0) * element_size, e.x.pad_bytes > 0 ? scratch : nullptr);
    if (s != dnnl_success) failed = s;
  }
  dnnl::error::wrap_c_api(static_cast<dnnl_status_t>(failed.load()), "could not execute a matmul tile");
}

// The operand's bytes in the layout the matmul reads: in place, or copied into the workspace.
void* feed(const Array& x, const Layout& l, std::span<std::byte>& workspace) {
  if (!l.copy) return x.bytes();
  const int64_t es = dtype_size(x.type().dtype);
  std::byte* dst = take(workspace, x.type().bytes());
  copy_strided(x.bytes(), 0, l.copy_src_strides, dst, 0, strides_of(l.copy_shape), l.copy_shape, es);
  return dst;
}

}  // namespace

int64_t workspace_dot_general(const ir::Node& n, std::span<const ir::Type> in) {
  if (in[0].dtype != DType::f32 && in[0].dtype != DType::bf16) return 0;  // the reference kernel needs none
  // Remembered by everything the analysis reads: a pipeline rank's program repeats each matmul per microbatch,
  // and making a oneDNN primitive descriptor costs more than planning the node.
  using Key = std::tuple<ir::Type, ir::Type, ir::IntLists, ir::IntLists, int>;
  static std::mutex mutex;
  static std::map<Key, int64_t> known;
  Key key{in[0], in[1], n.attrs.int_lists("contract"), n.attrs.int_lists("batch"), omp_get_max_threads()};
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(key); it != known.end()) return it->second;
  Analysis x = analyze(n, in[0], in[1]);
  // The pieces in the order the kernel takes them, each but the last rounded up to the next piece's alignment.
  int64_t bytes = 0;
  for (int64_t piece : {x.a_layout.copy ? in[0].bytes() : 0, x.b_layout.copy ? in[1].bytes() : 0,
                        scratchpad_bytes(x, omp_get_max_threads()), x.packed_bytes, x.pack_pad_bytes})
    if (piece > 0) bytes = aligned64(bytes) + piece;
  known.emplace(std::move(key), bytes);
  return bytes;
}

void kernel_dot_general(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  // f32 and bf16 (f32 accumulation) go to oneDNN; f64, f16 and i32 to the reference.
  if (!uses_onednn(in[0].type().dtype, ctx.options)) return ref::dot_general(n, in, out, ctx);
  // One entry per node; a different graph at the same address, new shapes or another thread count remake it.
  static std::mutex mutex;
  static std::map<const ir::Node*, Entry> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(&n);
  if (it == cache.end() || !(it->second.lhs == in[0].type()) || !(it->second.rhs == in[1].type()) ||
      it->second.contract != n.attrs.int_lists("contract") || it->second.batch != n.attrs.int_lists("batch") ||
      it->second.threads != omp_get_max_threads())
    it = cache.insert_or_assign(&n, make_entry(n, in[0].type(), in[1].type())).first;
  Entry& e = it->second;
  std::span<std::byte> workspace = ctx.workspace;
  auto* lhs = static_cast<std::byte*>(feed(in[0], e.x.a_layout, workspace));
  auto* rhs = static_cast<std::byte*>(feed(in[1], e.x.b_layout, workspace));
  const int64_t pad = scratchpad_bytes(e.x, e.threads);
  std::byte* pads = pad > 0 ? take(workspace, pad) : nullptr;
  if (!e.x.tiles.empty()) return run_tiles(e, lhs, rhs, out[0].bytes(), pads, dtype_size(in[0].type().dtype));
  if (e.x.packed_bytes > 0) {
    std::byte* packed = take(workspace, e.x.packed_bytes);
    std::byte* pack_pad = e.x.pack_pad_bytes > 0 ? take(workspace, e.x.pack_pad_bytes) : nullptr;
    dnnl::error::wrap_c_api(e.packing.run_reorder(e.streams[0], rhs, packed, pack_pad), "could not pack a matmul's rhs");
    rhs = packed;
  }
  dnnl::error::wrap_c_api(e.calls[0][0].run(e.streams[0], lhs, rhs, out[0].bytes(), pads), "could not execute a matmul");
}

}  // namespace remat::exec
