// The naive twin of dot_general: every output element sums over every contracting index, in f64.
// Slow and obviously correct; the fast kernel is tested against it.
#include "exec/kernels/kernels.h"

#include <algorithm>

namespace remat::exec::ref {

void dot_general(const ir::Node& n, std::span<const Array> in, std::span<Array> out, const KernelContext&) {
  const ir::IntLists& ct = n.attrs.int_lists("contract");
  const ir::IntLists& bt = n.attrs.int_lists("batch");
  const ir::Shape& ls = in[0].type().shape;
  const ir::Shape& rs = in[1].type().shape;
  Dims l_strides = strides_of(Dims(ls)), r_strides = strides_of(Dims(rs));
  Dims lf = free_dims(static_cast<int64_t>(ls.size()), ct[0], bt[0]);
  Dims rf = free_dims(static_cast<int64_t>(rs.size()), ct[1], bt[1]);
  // Output dim o maps to (lhs stride, rhs stride); contracting dim k likewise.
  ir::IntList out_l, out_r, k_l, k_r;
  ir::Shape k_shape;
  for (size_t i = 0; i < bt[0].size(); ++i) {
    out_l.push_back(l_strides[static_cast<size_t>(bt[0][i])]);
    out_r.push_back(r_strides[static_cast<size_t>(bt[1][i])]);
  }
  for (int64_t d : lf) out_l.push_back(l_strides[static_cast<size_t>(d)]), out_r.push_back(0);
  for (int64_t d : rf) out_l.push_back(0), out_r.push_back(r_strides[static_cast<size_t>(d)]);
  for (size_t i = 0; i < ct[0].size(); ++i) {
    k_l.push_back(l_strides[static_cast<size_t>(ct[0][i])]);
    k_r.push_back(r_strides[static_cast<size_t>(ct[1][i])]);
    k_shape.push_back(ls[static_cast<size_t>(ct[0][i])]);
  }
  const ir::Shape& os = out[0].type().shape;
  const int64_t K = ir::num_elements(k_shape);
  for (int64_t o = 0; o < out[0].size(); ++o) {
    int64_t lo = 0, ro = 0, rem = o;
    for (size_t d = os.size(); d-- > 0;) {
      int64_t idx = rem % os[d];
      rem /= os[d];
      lo += idx * out_l[d];
      ro += idx * out_r[d];
    }
    double acc = 0;
    for (int64_t k = 0; k < K; ++k) {
      int64_t lk = lo, rk = ro, krem = k;
      for (size_t d = k_shape.size(); d-- > 0;) {
        int64_t idx = krem % k_shape[d];
        krem /= k_shape[d];
        lk += idx * k_l[d];
        rk += idx * k_r[d];
      }
      acc += in[0].get(lk) * in[1].get(rk);
    }
    out[0].set(o, acc);
  }
}

}  // namespace remat::exec::ref
