// dot_general through oneDNN's batched matmul. The operands are viewed as lhs (B, M, K) and rhs (B, K, N);
// when an operand's dims are stored as [batch, free, contract] or [batch, contract, free] the view is just
// strides (a transpose folded into the descriptor), otherwise the operand is first copied into that order.
// The output [batch, lhs free, rhs free] is (B, M, N) row-major. The copies and oneDNN's scratchpad live
// in the node's planned workspace: [lhs copy][rhs copy][scratchpad], each 64-byte aligned.
// Everything that depends only on the shapes (the layout analysis, the primitive, its memory objects) is
// made once per node and reused, so a steady-state call allocates nothing. oneDNN has no f64 or i32
// matmul on CPU: those dtypes use the reference kernel.
#include "exec/kernels/kernels.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

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
  bool copy = false;         // neither order matches: copy with these strides into that order
  Dims copy_src_strides, copy_shape;
};

Layout analyze(const ir::Shape& s, const ir::IntList& batch, const Dims& g1, const ir::IntList& g2_list) {
  Dims g2(g2_list), order, swapped, identity;
  for (int64_t d : batch) order.push_back(d), swapped.push_back(d);
  for (int64_t d : g1) order.push_back(d);
  for (int64_t d : g2) order.push_back(d), swapped.push_back(d);
  for (int64_t d : g1) swapped.push_back(d);
  for (size_t i = 0; i < s.size(); ++i) identity.push_back(static_cast<int64_t>(i));
  Layout l;
  if (order == identity) return l;
  if (swapped == identity) {
    l.swapped = true;
    return l;
  }
  l.copy = true;
  Dims strides = strides_of(Dims(s));
  for (int64_t d : order) {
    l.copy_src_strides.push_back(strides[static_cast<size_t>(d)]);
    l.copy_shape.push_back(s[static_cast<size_t>(d)]);
  }
  return l;
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
  dnnl::stream stream{engine};
};

Engine& engine() {
  static Engine e;
  return e;
}

// What the shapes decide: how each operand is fed, and the matmul's primitive descriptor.
struct Analysis {
  Layout a_layout, b_layout;
  dnnl::matmul::primitive_desc pd;
};

Analysis analyze(const ir::Node& n, const ir::Type& lhs, const ir::Type& rhs) {
  const ir::IntLists& ct = n.attrs.int_lists("contract");
  const ir::IntLists& bt = n.attrs.int_lists("batch");
  const ir::Shape& ls = lhs.shape;
  const ir::Shape& rs = rhs.shape;
  Dims lf = free_dims(lhs.rank(), ct[0], bt[0]), rf = free_dims(rhs.rank(), ct[1], bt[1]);
  const int64_t B = product(ls, bt[0]), M = product(ls, lf), K = product(ls, ct[0]), N = product(rs, rf);
  Analysis a;
  a.a_layout = analyze(ls, bt[0], lf, ct[0]);  // (B, M, K), or (B, K, M) in memory when swapped
  Dims contract_rhs(ct[1]);
  ir::IntList rf_list(rf.begin(), rf.end());
  a.b_layout = analyze(rs, bt[1], contract_rhs, rf_list);  // (B, K, N), or (B, N, K) in memory when swapped
  using dims = dnnl::memory::dims;
  auto dt = dnnl_type(lhs.dtype);
  // Without batch dims the descriptors are 2-D: oneDNN picks faster kernels for plain matrices.
  auto md = [&](int64_t rows, int64_t cols, bool swapped) {
    dims strides = swapped ? dims{1, rows} : dims{cols, 1};
    if (B == 1) return dnnl::memory::desc(dims{rows, cols}, dt, strides);
    return dnnl::memory::desc(dims{B, rows, cols}, dt, dims{rows * cols, strides[0], strides[1]});
  };
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // in the planned workspace
  a.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(md(M, K, a.a_layout.swapped), md(K, N, a.b_layout.swapped),
                                                         md(M, N, false)),
                                      attr, engine().engine);
  return a;
}

bool uses_onednn(DType dt, const Options& options) {
  return !options.reference_kernels && (dt == DType::f32 || dt == DType::bf16);
}

// Everything a node's matmul needs, made on its first call.
struct Entry {
  ir::Type lhs, rhs;           // the operand types and dimension numbers it was made for: a node address
  ir::IntLists contract, batch;  // reused by another graph, or new shapes, remake it
  // oneDNN fixes a primitive's thread decomposition, and so its scratchpad size, when it is made: a primitive
  // made under another OpenMP thread count would run with that count and need another workspace than planned.
  int threads = 0;
  Layout a_layout, b_layout;
  dnnl::matmul matmul;
  dnnl::memory a, b, c, pad;
  std::vector<dnnl_exec_arg_t> args;  // for the C API: the C++ execute() builds this vector on every call
  int64_t pad_bytes = 0;
};

Entry make_entry(const ir::Node& n, const ir::Type& lhs, const ir::Type& rhs) {
  Analysis x = analyze(n, lhs, rhs);
  Entry e;
  e.lhs = lhs;
  e.rhs = rhs;
  e.contract = n.attrs.int_lists("contract");
  e.batch = n.attrs.int_lists("batch");
  e.threads = omp_get_max_threads();
  e.a_layout = x.a_layout;
  e.b_layout = x.b_layout;
  e.matmul = dnnl::matmul(x.pd);
  e.a = dnnl::memory(x.pd.src_desc(), engine().engine, DNNL_MEMORY_NONE);
  e.b = dnnl::memory(x.pd.weights_desc(), engine().engine, DNNL_MEMORY_NONE);
  e.c = dnnl::memory(x.pd.dst_desc(), engine().engine, DNNL_MEMORY_NONE);
  e.pad = dnnl::memory(x.pd.scratchpad_desc(), engine().engine, DNNL_MEMORY_NONE);
  e.pad_bytes = static_cast<int64_t>(x.pd.scratchpad_desc().get_size());
  e.args = {{DNNL_ARG_SRC, e.a.get()}, {DNNL_ARG_WEIGHTS, e.b.get()}, {DNNL_ARG_DST, e.c.get()},
            {DNNL_ARG_SCRATCHPAD, e.pad.get()}};
  return e;
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
                        static_cast<int64_t>(x.pd.scratchpad_desc().get_size())})
    if (piece > 0) bytes = aligned64(bytes) + piece;
  known.emplace(std::move(key), bytes);
  return bytes;
}

void kernel_dot_general(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext& ctx) {
  // f32 and bf16 (f32 accumulation, native AVX512_BF16) go to oneDNN; f64, f16 and i32 to the reference.
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
  e.a.set_data_handle(feed(in[0], e.a_layout, workspace));
  e.b.set_data_handle(feed(in[1], e.b_layout, workspace));
  e.c.set_data_handle(out[0].bytes());
  e.pad.set_data_handle(e.pad_bytes > 0 ? take(workspace, e.pad_bytes) : nullptr);
  dnnl::error::wrap_c_api(dnnl_primitive_execute(e.matmul.get(), engine().stream.get(), static_cast<int>(e.args.size()),
                                                 e.args.data()),
                          "could not execute a matmul");
  engine().stream.wait();
}

}  // namespace remat::exec
