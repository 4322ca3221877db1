// The CPU backend's kernels: one per op of the op table, except the regions (the executor runs scans itself;
// remat regions are inlined before planning); a fusion is one kernel over its body. Kernels write into pre-allocated outputs, except the view ops
// (reshape, name, check_finite: their outputs are views of the operand). Shapes follow lax semantics; see
// ir/shape_rules.cpp.
#pragma once

#include <omp.h>

#include "exec/exec.h"

#include <algorithm>
#include <array>
#include <span>
#include <utility>

namespace remat::exec {

struct MeshAxis;  // exec/mesh.h

// REMAT_KERNEL_OR(cls, K, R)(op) is K(op) for the op classes that have a kernel and R(op) for the ops with
// a body (run by the executor itself); K and R are macro names.
#define REMAT_KERNEL_OR(cls, kernel, region) REMAT_KERNEL_OR_##cls(kernel, region)
#define REMAT_KERNEL_OR_elementwise(k, r) k
#define REMAT_KERNEL_OR_view(k, r) k
#define REMAT_KERNEL_OR_layout(k, r) k
#define REMAT_KERNEL_OR_contraction(k, r) k
#define REMAT_KERNEL_OR_reduction(k, r) k
#define REMAT_KERNEL_OR_constant(k, r) k
#define REMAT_KERNEL_OR_group(k, r) k
#define REMAT_KERNEL_OR_transfer(k, r) k
#define REMAT_KERNEL_OR_region(k, r) r
#define REMAT_KERNEL_OR_fused(k, r) k
#define REMAT_KERNEL_OR_collective(k, r) k

#define REMAT_KERNEL_DECLARE(e) \
  void kernel_##e(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx);
#define REMAT_NOTHING(e)
#define X(e, arity, cls, ...) REMAT_KERNEL_OR(cls, REMAT_KERNEL_DECLARE, REMAT_NOTHING)(e)
REMAT_OPS(X)
#undef X

// The instruction sets a kernel's inner function is compiled for (REMAT_WIDEST_CLONES): baseline x86-64, AVX2 with
// FMA and AVX-512 (x86-64-v4) with GCC 12 or later on x86-64, baseline alone elsewhere.
enum class Isa { baseline, avx2, x86_64_v4 };
const char* isa_name(Isa isa);  // "default", "avx2", "x86-64-v4"
// Those compiled here that this CPU runs (__builtin_cpu_supports), baseline first.
std::span<const Isa> available_isas();
// The one the cloned kernels run: the widest available, chosen once, unless an IsaOverride is alive.
Isa kernel_isa();
// For tests: while it lives, the cloned kernels run `isa` (one of available_isas()). Not while kernels run.
class IsaOverride {
 public:
  explicit IsaOverride(Isa isa);
  ~IsaOverride();
  IsaOverride(const IsaOverride&) = delete;
  IsaOverride& operator=(const IsaOverride&) = delete;

 private:
  Isa before_;
};

// REMAT_WIDEST_CLONES(name, body) defines `name`: it calls the function `body` (arguments forwarded) compiled for
// kernel_isa(), one choice per call. Each target is a wrapper that inlines everything `body` calls (flatten; calls
// into libm stay calls, the same function from every target), so its loops vectorise at that width. Without FMA
// contraction (-ffp-contract=off) or reassociation, every target computes the same bits: by construction (a fused
// multiply-add is written as one, exp.h's fused_multiply_add), and tested for every cloned kernel and a training step
// (tests/exec/isa_test.cpp).
// REMAT_ISA_CLONES(name, body) is the same for a `body` that is a template on its target (body<Isa>): kernels whose
// register blocking depends on the vector width.
#if defined(__GNUC__) && __GNUC__ >= 12 && !defined(__clang__) && defined(__x86_64__)
#define REMAT_CLONES_(name, body_v4, body_avx2, body_baseline)                                                         \
  template <class... Args> __attribute__((flatten)) void name##_baseline(Args&&... a) {                                \
    body_baseline(std::forward<Args>(a)...);                                                                           \
  }                                                                                                                    \
  template <class... Args> __attribute__((target("avx2,fma"), flatten)) void name##_avx2(Args&&... a) {                \
    body_avx2(std::forward<Args>(a)...);                                                                               \
  }                                                                                                                    \
  template <class... Args> __attribute__((target("arch=x86-64-v4"), flatten)) void name##_v4(Args&&... a) {            \
    body_v4(std::forward<Args>(a)...);                                                                                 \
  }                                                                                                                    \
  template <class... Args> void name(Args&&... a) {                                                                    \
    switch (kernel_isa()) {                                                                                            \
      case Isa::x86_64_v4: return name##_v4(std::forward<Args>(a)...);                                                 \
      case Isa::avx2: return name##_avx2(std::forward<Args>(a)...);                                                    \
      case Isa::baseline: return name##_baseline(std::forward<Args>(a)...);                                            \
    }                                                                                                                  \
  }
#define REMAT_WIDEST_CLONES(name, body) REMAT_CLONES_(name, body, body, body)
#define REMAT_ISA_CLONES(name, body) REMAT_CLONES_(name, body<Isa::x86_64_v4>, body<Isa::avx2>, body<Isa::baseline>)
#define REMAT_HAS_ISA_CLONES 1
#else
#define REMAT_WIDEST_CLONES(name, body) \
  template <class... Args> void name(Args&&... a) { body(std::forward<Args>(a)...); }
#define REMAT_ISA_CLONES(name, body) \
  template <class... Args> void name(Args&&... a) { body<Isa::baseline>(std::forward<Args>(a)...); }
#define REMAT_HAS_ISA_CLONES 0
#endif

// One elementwise op `n` over `len` consecutive elements: out[i] = op(in[0][i], in[1][i], ...), each pointer at
// the range's first element. `operand` is the dtype of the data operands (select: its second), `result` the
// result's. Unfused kernels run it over each thread's part of their arrays, the fusion kernel over each tile.
void elementwise_range(const ir::Node& n, DType operand, DType result, std::span<const std::byte* const> in,
                       std::byte* out, int64_t len);
// len elements of dtype `from` at x, converted to `to` at y (lax's convert_element_type), at the CPU's widest
// vectors.
void convert_elements(DType from, DType to, const std::byte* x, std::byte* y, int64_t len);

// A fusion body compiled into one loop over groups of 8 or 16 elements (fusion_jit.cpp), for the fusion kernel:
// loop(values, results, len) reads element i of body value v at values[v] (a param's tile, or what the caller
// gathered for v), or its one element there for a param that only a broadcast reads, and writes element i of
// result k at results[k], for i in [0, len), len a multiple of kFusedLanes (the widest loop's lanes: it runs whole
// groups). Null where the body holds an op or dtype the compiler does not take, or the kernels run the baseline
// ISA: then the ops run one by one.
inline constexpr int64_t kFusedLanes = 16;
using FusedLoop = void (*)(const std::byte* const* values, std::byte* const* results, int64_t len);
FusedLoop fused_loop(const std::shared_ptr<ir::Graph>& body);
// Whether body node `m` is a value the fusion kernel makes per tile before the compiled loop runs: an iota, or a
// broadcast of more than one element (a broadcast of one is the loop's own).
bool gathered(const ir::Graph& body, const ir::Node& m);

// Elements [lo, lo + len) of the constant `n` (iota or full) of type `type`, into `out` (its first element):
// their kernels run it over each thread's part, the fusion kernel over each tile.
void constant_range(const ir::Node& n, const ir::Type& type, int64_t lo, int64_t len, std::byte* out);

// Workspace bytes of the kernels that need any (Backend::workspace_bytes): operand copies and oneDNN's
// scratchpad for dot_general, the accumulator row of a reduction over leading axes.
int64_t workspace_dot_general(const ir::Node& n, std::span<const ir::Type> in);
int64_t workspace_reduction(const ir::Node& n, std::span<const ir::Type> in);
int64_t workspace_attention(const ir::Node& n, std::span<const ir::Type> in);  // per thread: tiles (and dk, dv)
int64_t workspace_softmax(const ir::Node& n, std::span<const ir::Type> in);  // per thread: one row of probabilities
int64_t workspace_rms_norm(const ir::Node& n, std::span<const ir::Type> in);  // the scale in f32 (and rows' r, dw's sums)
int64_t workspace_fusion(const ir::Node& n, std::span<const ir::Type> in);  // per thread: its body's tiles
int64_t workspace_swiglu(const ir::Node& n, std::span<const ir::Type> in);  // its composition's fusion's
int64_t workspace_all_reduce(const ir::Node& n, std::span<const ir::Type> in);  // every rank's copy of a chunk
int64_t workspace_all_gather(const ir::Node& n, std::span<const ir::Type> in);
int64_t workspace_reduce_scatter(const ir::Node& n, std::span<const ir::Type> in);

// The mesh axis (or group) a collective or point-to-point kernel runs along, its `axis` attribute: CHECKs that
// the run has a mesh and that the axis has the `ranks` the node was compiled for (collective.cpp).
const MeshAxis& axis_of(const ir::Node& n, const KernelContext& ctx);

// Carves `bytes` off the front of a kernel's workspace; the next piece starts 64 bytes aligned. A kernel
// asks for its pieces rounded up with aligned64, except the last, so that the plan (and, with separate
// buffers, AddressSanitizer) holds it to the exact bytes it uses.
std::byte* take(std::span<std::byte>& workspace, int64_t bytes);
// `to` = `from` (equal types), byte for byte; nothing when they are the same buffer.
void copy_all(const Array& from, Array& to);
constexpr int64_t aligned64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

namespace ref {
// Naive twin of the oneDNN dot_general: loops over every output and contracting index, f64 accumulation.
void dot_general(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx);
}  // namespace ref

// A short list of dims or strides with inline storage: kernels build these per call without touching the
// heap (a steady-state step allocates nothing).
class Dims {
 public:
  static constexpr size_t kMax = 8;
  Dims() = default;
  explicit Dims(size_t count, int64_t fill = 0);
  Dims(const std::vector<int64_t>& x);  // NOLINT: implicit from ir::Shape / ir::IntList
  void push_back(int64_t x);
  int64_t& operator[](size_t i) { return v_[i]; }
  int64_t operator[](size_t i) const { return v_[i]; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const int64_t* begin() const { return v_.data(); }
  const int64_t* end() const { return v_.data() + n_; }
  int64_t back() const { return v_[n_ - 1]; }
  int64_t front() const { return v_[0]; }
  bool operator==(const Dims& o) const { return std::equal(begin(), end(), o.begin(), o.end()); }

 private:
  std::array<int64_t, kMax> v_{};
  size_t n_ = 0;
};

int64_t num_elements(const Dims& shape);

// The dims of an operand of rank `rank` that are neither contracting nor batch (dot_general's free dims).
Dims free_dims(int64_t rank, const ir::IntList& contract, const ir::IntList& batch);

// Row-major strides (in elements) of a shape.
Dims strides_of(const Dims& shape);

// dst[dst_base + sum(i_d * dst_strides_d)] = src[src_base + sum(i_d * src_strides_d)] for every index i
// of `shape`. Offsets and strides are in elements of `elem_size` bytes.
void copy_strided(const std::byte* src, int64_t src_base, const Dims& src_strides, std::byte* dst, int64_t dst_base,
                  const Dims& dst_strides, const Dims& shape, int64_t elem_size);

// Storage types and the type their arithmetic runs in: bf16 and f16 compute in f32 registers and store
// rounded to nearest even; the others compute in themselves.
template <class T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<bf16_t> { using type = float; };
template <> struct ComputeOf<f16_t> { using type = float; };
template <class T> using Compute = typename ComputeOf<T>::type;

template <class T> inline Compute<T> load(T x) { return x; }
inline float load(bf16_t x) { return bf16_to_float(x); }
inline float load(f16_t x) { return f16_to_float(x); }
template <class T> inline T store(Compute<T> x) { return x; }
template <> inline bf16_t store<bf16_t>(float x) { return float_to_bf16(x); }
template <> inline f16_t store<f16_t>(float x) { return float_to_f16(x); }

// Calls f(T{}) with T the storage type of a float dtype (f64, f32, bf16, f16).
template <class F>
void dispatch_float(DType d, const ir::Node& n, F&& f) {
  switch (d) {
    case DType::f64: f(double{}); return;
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f16: f(f16_t{}); return;
    default: CHECK(false, "{}: needs a floating-point operand, got {}", ir::op_name(n.op), dtype_name(d));
  }
}

// Calls f(X{}) with X the storage type of an operand of dtype d that a kernel computing in T reads widened on load:
// T itself, or a narrower float T holds exactly (ir's shape rules admit no other: base/dtype.h's widens_exactly).
template <class T, class F>
void dispatch_widened(DType d, const ir::Node& n, F&& f) {
  dispatch_float(d, n, [&](auto x) {
    if constexpr (std::is_same_v<decltype(x), T> || sizeof(decltype(x)) < sizeof(T)) f(x);
    else ASSERT(false);
  });
}

// As dispatch_float, plus i32.
template <class F>
void dispatch_numeric(DType d, const ir::Node& n, F&& f) {
  if (d == DType::i32) return f(int32_t{});
  dispatch_float(d, n, std::forward<F>(f));
}

// Calls f(U{}) with U the unsigned integer of `bytes` bytes: for kernels that only move bit patterns.
template <class F>
void dispatch_bits(int64_t bytes, F&& f) {
  switch (bytes) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
    default: ASSERT(false);
  }
}

// Elementwise loops run on all threads once they are this long.
inline constexpr int64_t kParallelMin = 1 << 14;

// Runs body(begin, end) over [0, n): split evenly across the OpenMP threads when `parallel`, else once on
// the calling thread. Not an `if` clause on the pragma: libgomp allocates and frees a team for every
// region it runs serialized, so each small op would call malloc on every step.
template <class F>
void parallel_ranges(int64_t n, bool parallel, F&& body) {
  if (!parallel) return body(int64_t{0}, n);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    body(n * t / nt, n * (t + 1) / nt);
  }
}

}  // namespace remat::exec
