// The backward split of zero-bubble pipelines (autodiff::split_backward), IR text in, IR text out: B is what the
// input's gradient needs, W the rest; a scanned backward becomes a B scan carrying the cotangent and stacking
// what W reads, and a W scan; a value the policy recomputes is recomputed again in W, not kept from B.
#include "autodiff/autodiff.h"
#include "support/filecheck.h"

#include <gtest/gtest.h>

#include <iostream>

namespace remat {
namespace {

// The printed graph after split_backward(g, first, input_gradient), each backward node's part (B or W) in a
// trailing comment line.
std::string split_text(ir::Graph& g, size_t first, ir::ValueId input_gradient) {
  const std::vector<bool> part = autodiff::split_backward(g, first, input_gradient);
  ir::verify(g);
  std::string out = ir::print(g) + "// parts:";
  for (size_t i = first; i < g.nodes.size(); ++i) out += part[i] ? " B" : " W";
  if (std::getenv("REMAT_PRINT_GOLDEN")) std::cout << out << "\n";
  return out + "\n";
}

// Three layers under a scan (as tests/autodiff/golden/scan_3_layers.ir), differentiated by grad with respect to
// (%h, %ws), split at %h's gradient.
TEST(SplitBackward, AScannedBackwardBecomesABScanAndAWScan) {
  const std::string text = R"(
graph @layers(%ws: f32[3,4,4], %h: f32[2,4]) -> (f32[]) {
  %0: f32[2,4] = scan(%h, %ws) {length=3, num_consts=0, num_carry=1, reverse=false} scope="layers"
    graph @layer(%h0: f32[2,4], %x0: f32[4,4]) -> (f32[2,4]) {
      %0: f32[2,4] = dot_general(%h0, %x0) {contract=[[1],[0]], batch=[[],[]]} scope="layers/dense"
      %1: f32[2,4] = tanh(%0) scope="layers"
      return %1
    }
  %1: f32[] = reduce_sum(%0) {axes=[0,1]}
  return %1
}
// The forward stacks tanh's outputs and the layers' inputs.
// CHECK: [[TANHS:%[0-9]+]]: f32[3,2,4], [[INS:%[0-9]+]]: f32[3,2,4] = scan(%h, %ws)
// B: the reverse scan carries dh and reads the weights and tanh's outputs (not the inputs: only dW reads them);
// it stacks d(pre), the cotangent of each layer's dot, for W.
// CHECK: [[DH:%[0-9]+]]: f32[2,4], [[DPRES:%[0-9]+]]: f32[3,2,4] = scan({{%[0-9]+}}, %ws, [[TANHS]]) {length=3, num_consts=0, num_carry=1, reverse=true}
// CHECK-NEXT: graph @layer_bwd_b(%dh0: f32[2,4], %x0: f32[4,4], %r0: f32[2,4]) -> (f32[2,4], f32[2,4])
// CHECK: [[DPRE:%[0-9]+]]: f32[2,4] = mul(%dh0,
// CHECK-NEXT: [[DIN:%[0-9]+]]: f32[2,4] = dot_general([[DPRE]], %x0)
// CHECK-NEXT: return [[DIN]], [[DPRE]]
// W: no carry; the layers' inputs and B's d(pre) as xs, in the same (reverse) order; dW = h^T . d(pre).
// CHECK: [[DWS:%[0-9]+]]: f32[3,4,4] = scan([[INS]], [[DPRES]]) {length=3, num_consts=0, num_carry=0, reverse=true}
// CHECK-NEXT: graph @layer_bwd_w(%r1: f32[2,4], %b0: f32[2,4]) -> (f32[4,4])
// CHECK-NEXT: [[DW:%[0-9]+]]: f32[4,4] = dot_general(%r1, %b0) {contract=[[0],[0]], batch=[[],[]]}
// CHECK-NEXT: return [[DW]]
// CHECK: return {{%[0-9]+}}, [[DH]], [[DWS]]
// CHECK-NEXT: }
// CHECK-NEXT: // parts: B B B W
)";
  ir::Graph g = ir::parse(text, "split_test");
  const size_t first = g.nodes.size();
  const std::vector<ir::ValueId> wrt = {g.params[1], g.params[0]};
  const std::vector<ir::ValueId> grads = autodiff::grad(g, g.results[0], wrt);
  for (ir::ValueId d : grads) g.results.push_back(d);
  EXPECT_EQ(testing_support::filecheck(text, split_text(g, first, grads[0])), "");
}

// A backward (from node 1 on) whose input gradient %3 and weight gradient %4 both read the recomputed %1: W gets
// its own recompute rather than keeping B's until it runs.
TEST(SplitBackward, WRecomputesWhatThePolicyRecomputes) {
  const std::string text = R"(
graph @g(%x: f32[2,4], %w: f32[4,4], %dy: f32[2,4]) -> (f32[2,4], f32[2,4], f32[4,4]) {
  %0: f32[2,4] = tanh(%x)
  %1: f32[2,4] = tanh.remat(%x)
  %2: f32[2,4] = dot_general(%dy, %w) {contract=[[1],[1]], batch=[[],[]]}
  %3: f32[2,4] = mul(%2, %1)
  %4: f32[4,4] = dot_general(%1, %dy) {contract=[[0],[0]], batch=[[],[]]}
  return %0, %3, %4
}
// CHECK: [[H:%[0-9]+]]: f32[2,4] = tanh.remat(%x)
// CHECK-NEXT: [[D:%[0-9]+]]: f32[2,4] = dot_general(%dy, %w)
// CHECK-NEXT: [[DX:%[0-9]+]]: f32[2,4] = mul([[D]], [[H]])
// CHECK-NEXT: [[H2:%[0-9]+]]: f32[2,4] = tanh.remat(%x)
// CHECK-NEXT: [[DW:%[0-9]+]]: f32[4,4] = dot_general([[H2]], %dy)
// CHECK-NEXT: return {{%[0-9]+}}, [[DX]], [[DW]]
// CHECK-NEXT: }
// CHECK-NEXT: // parts: B B B W W
)";
  ir::Graph g = ir::parse(text, "split_test");
  EXPECT_EQ(testing_support::filecheck(text, split_text(g, 1, g.nodes[3].outputs[0])), "");
}

}  // namespace
}  // namespace remat
