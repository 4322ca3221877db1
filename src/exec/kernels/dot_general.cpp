// dot_general through oneDNN's batched matmul. The operands are viewed as lhs (B, M, K) and rhs (B, K, N);
// when an operand's dims are stored as [batch, free, contract] or [batch, contract, free] the view is just
// strides (a transpose folded into the descriptor), otherwise the operand is first copied into that order.
// The output [batch, lhs free, rhs free] is (B, M, N) row-major. oneDNN has no f64 or i32 matmul on CPU:
// those dtypes use the reference kernel.
#include "exec/kernels/kernels.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

namespace remat::exec {
namespace {

struct Operand {
  ir::IntList order;        // dims in [batch, free, contract] (lhs) or [batch, contract, free] (rhs) order
  int64_t batch = 1, rows = 1, cols = 1;  // sizes of the three groups in that order
};

ir::IntList free_dims(int64_t rank, const ir::IntList& contract, const ir::IntList& batch) {
  ir::IntList f;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(contract.begin(), contract.end(), d) == contract.end() &&
        std::find(batch.begin(), batch.end(), d) == batch.end())
      f.push_back(d);
  return f;
}

int64_t product(const ir::Shape& s, const ir::IntList& dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= s[static_cast<size_t>(d)];
  return p;
}

// Groups: [batch, g1, g2]. Returns the operand in that order, copied only if strides cannot express it.
// `swapped` reports that memory holds [batch, g2, g1] (a transposed matrix), which costs no copy.
struct Prepared {
  Array data;
  bool swapped = false;
};

Prepared prepare(const Array& x, const ir::IntList& batch, const ir::IntList& g1, const ir::IntList& g2) {
  auto concat = [](std::initializer_list<const ir::IntList*> parts) {
    ir::IntList out;
    for (const ir::IntList* p : parts) out.insert(out.end(), p->begin(), p->end());
    return out;
  };
  ir::IntList identity(static_cast<size_t>(x.type().rank()));
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int64_t>(i);
  ir::IntList straight = concat({&batch, &g1, &g2});
  if (straight == identity) return {x, false};
  if (concat({&batch, &g2, &g1}) == identity) return {x, true};
  const ir::Shape& s = x.type().shape;
  ir::IntList in_strides = strides_of(s), src;
  ir::Shape shape;
  for (int64_t d : straight) {
    src.push_back(in_strides[static_cast<size_t>(d)]);
    shape.push_back(s[static_cast<size_t>(d)]);
  }
  Array copy(ir::Type{x.type().dtype, shape});
  copy_strided(x.bytes(), 0, src, copy.bytes(), 0, strides_of(shape), shape, dtype_size(x.type().dtype));
  return {copy, false};
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
  std::mutex mutex;
  // Primitive cache: (dtype, B, M, K, N, lhs swapped, rhs swapped) -> matmul.
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, bool, bool>, dnnl::matmul> cache;
};

Engine& engine() {
  static Engine e;
  return e;
}

}  // namespace

void kernel_dot_general(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const Options& options) {
  if (options.reference_kernels) return ref::dot_general(n, in, out, options);
  const DType dtype = in[0].type().dtype;
  if (dtype != DType::f32) return ref::dot_general(n, in, out, options);
  const ir::IntLists& ct = n.attrs.int_lists("contract");
  const ir::IntLists& bt = n.attrs.int_lists("batch");
  const ir::Shape& ls = in[0].type().shape;
  const ir::Shape& rs = in[1].type().shape;
  ir::IntList lf = free_dims(in[0].type().rank(), ct[0], bt[0]);
  ir::IntList rf = free_dims(in[1].type().rank(), ct[1], bt[1]);
  const int64_t B = product(ls, bt[0]), M = product(ls, lf), K = product(ls, ct[0]), N = product(rs, rf);
  Prepared a = prepare(in[0], bt[0], lf, ct[0]);  // (B, M, K), or (B, K, M) in memory when swapped
  Prepared b = prepare(in[1], bt[1], ct[1], rf);  // (B, K, N), or (B, N, K) in memory when swapped
  using dims = dnnl::memory::dims;
  auto dt = dnnl_type(dtype);
  // Without batch dims the descriptors are 2-D: oneDNN picks faster kernels for plain matrices.
  auto md = [&](int64_t rows, int64_t cols, bool swapped) {
    dims strides = swapped ? dims{1, rows} : dims{cols, 1};
    if (B == 1) return dnnl::memory::desc(dims{rows, cols}, dt, strides);
    return dnnl::memory::desc(dims{B, rows, cols}, dt, dims{rows * cols, strides[0], strides[1]});
  };
  dnnl::memory::desc a_md = md(M, K, a.swapped), b_md = md(K, N, b.swapped), c_md = md(M, N, false);
  Engine& e = engine();
  std::lock_guard<std::mutex> lock(e.mutex);
  auto key = std::make_tuple(static_cast<int>(dtype), B, M, K, N, a.swapped, b.swapped);
  auto it = e.cache.find(key);
  if (it == e.cache.end()) {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), e.engine);
    it = e.cache.emplace(key, dnnl::matmul(pd)).first;
  }
  dnnl::memory am(a_md, e.engine, a.data.bytes()), bm(b_md, e.engine, b.data.bytes()), cm(c_md, e.engine, out[0].bytes());
  it->second.execute(e.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  e.stream.wait();
}

}  // namespace remat::exec
