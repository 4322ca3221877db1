// A fusion body compiled into one loop (Xbyak), for the fusion kernel (fusion.cpp): per group of 8 lanes (AVX2)
// or 16 (AVX-512, where the kernels run x86-64-v4), each stream (a param, a gathered broadcast or iota) is read
// once, the body's ops run in registers with every value parked in a stack slot of one vector (L1), and each
// result is written once. The interpreter instead runs each op as a loop over a tile held in memory, which leaves
// the step's fusions far below the memory's rate. The loop takes 4 groups per iteration, each op emitted for the
// 4 in turn: a body is one chain of dependent operations per group (exp alone is ~20 deep), and 4 independent
// chains side by side keep the core's out-of-order window full where one would leave it waiting on latencies.
//
// Same bits as the interpreter, op for op: each value is held as lanes of 32 bits (f32; bf16 widened, which
// is exact; i32; pred as a lane mask), each op is the sequence of IEEE operations its elementwise_range loop
// runs (-ffp-contract=off there: no FMA here either; exp_f32's operations in exp.h's order and constants), and
// a bf16 result is rounded to nearest even after every op, as store<bf16_t> does. tests/exec/fusion_jit_test.cpp
// holds the two to equal bits, op by op and dtype by dtype, NaN, infinities, zeros and subnormals included.
// A body with an op or dtype not handled below runs in the interpreter.
#include "exec/kernels/exp.h"
#include "exec/kernels/kernels.h"
#include "ir/text.h"

#include <xbyak/xbyak.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>

namespace remat::exec {
namespace {

bool held(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::i32 || d == DType::pred; }
bool floating(DType d) { return d == DType::f32 || d == DType::bf16; }

// Whether the compiler takes node `m` of `body` (its operands and result in held dtypes).
bool compilable(const ir::Graph& body, const ir::Node& m) {
  const DType out = body.type(m.outputs[0]).dtype, in = m.inputs.empty() ? out : body.type(m.inputs[0]).dtype;
  if (!held(out)) return false;
  for (ir::ValueId v : m.inputs)
    if (!held(body.type(v).dtype)) return false;
  switch (m.op) {
    case ir::Op::broadcast_in_dim:
    case ir::Op::iota:
    case ir::Op::full: return true;
    case ir::Op::add:
    case ir::Op::sub:
    case ir::Op::mul:
    case ir::Op::div:
    case ir::Op::max:
    case ir::Op::min:
    case ir::Op::neg:
    case ir::Op::exp:
    case ir::Op::logistic:
    case ir::Op::sqrt:
    case ir::Op::rsqrt: return floating(out);
    case ir::Op::compare: return in != DType::pred;
    case ir::Op::select: return true;
    case ir::Op::convert_element_type:
      return in == out || (in == DType::f32 && out == DType::bf16) || (in == DType::bf16 && out == DType::f32) ||
             ((in == DType::pred || in == DType::i32) && out == DType::f32);
    default: return false;
  }
}

// The element a `full` holds, as the 32 bits of its lane.
uint32_t lane_bits(const ir::Node& full, DType d) {
  std::array<std::byte, 8> one{};
  constant_range(full, ir::Type{d, {}}, 0, 1, one.data());
  uint32_t bits = 0;
  if (d == DType::bf16) {
    uint16_t h = 0;
    std::memcpy(&h, one.data(), 2);
    bits = static_cast<uint32_t>(h) << 16;
  } else if (d == DType::pred) {
    bits = one[0] != std::byte{0} ? ~0u : 0u;
  } else {
    std::memcpy(&bits, one.data(), 4);
  }
  return bits;
}

// vcmpps predicates, as C++'s comparisons of floats behave (ordered, except !=).
constexpr uint8_t kEq = 0x00, kLt = 0x11, kLe = 0x12, kUnord = 0x03, kNe = 0x04, kGe = 0x1d, kGt = 0x1e;

// Vec: Xbyak::Ymm (AVX2, 8 lanes) or Xbyak::Zmm (AVX-512, 16 lanes, where the kernels run x86-64-v4). A mask
// is a vector of all-ones or zero lanes either way; AVX-512 compares into k1 and blends from it.
template <class Vec>
class Compiler : public Xbyak::CodeGenerator {
 public:
  explicit Compiler(const ir::Graph& body) : Xbyak::CodeGenerator(1 << 18, Xbyak::DontSetProtectRWE), body_(body) {
    for (const ir::Node& m : body.nodes) {
      const auto v = static_cast<size_t>(m.outputs[0]);
      if (gathered(body, m)) stream_[v] = true;
      else if (m.op == ir::Op::full) constant_[v] = lane_bits(m, body.type(m.outputs[0]).dtype);
      else uniform_[v] = m.op == ir::Op::broadcast_in_dim, slot_[v] = slots_++;
    }
    for (ir::ValueId p : body.params) stream_[static_cast<size_t>(p)] = true;
    generate();
    setProtectModeRE();
  }

 private:
  static constexpr bool kWide = std::is_same_v<Vec, Xbyak::Zmm>;
  static constexpr int kLanes = kWide ? 16 : 8, kBytes = 4 * kLanes;
  static constexpr int kGroups = 4;  // groups of kLanes elements per iteration of the main loop
  const ir::Graph& body_;
  std::array<bool, ir::kMaxFusionValues> stream_{}, uniform_{};  // uniform: a scalar broadcast, one slot for all
  std::array<std::optional<uint32_t>, ir::kMaxFusionValues> constant_{};
  std::array<int, ir::kMaxFusionValues> slot_{};
  int slots_ = 0;
  std::map<uint32_t, Xbyak::Label> table_;  // kLanes copies of each constant, after the code
  int carried_ = -1;                          // the value in Vec(16 + g) for group g, if any
  const Vec zero_ = Vec(15);

  Xbyak::Address slot(ir::ValueId v, int g) {
    return ptr[rsp + (slot_[static_cast<size_t>(v)] * kGroups + g) * kBytes];
  }
  Xbyak::Address k(uint32_t bits) { return ptr[rip + table_[bits]]; }
  Xbyak::Address k(float x) { return k(std::bit_cast<uint32_t>(x)); }
  DType dtype(ir::ValueId v) const { return body_.type(v).dtype; }

  void generate() {
    push(rbp);
    mov(rbp, rsp);
    and_(rsp, -kBytes);
    sub(rsp, std::max(slots_, 1) * kGroups * kBytes);
    vpxord(zero_, zero_, zero_);
    for (const ir::Node& m : body_.nodes)  // a scalar broadcast is one load per call
      if (uniform_[static_cast<size_t>(m.outputs[0])]) {
        broadcast_scalar(m.inputs[0]);
        vmovaps(slot(m.outputs[0], 0), Vec(0));
      }
    Xbyak::Label wide, narrow, done;
    xor_(ecx, ecx);
    mov(r9, rdx);
    and_(r9, -kLanes * kGroups);  // the elements the main loop takes
    L(wide);
    cmp(rcx, r9);
    jge(narrow, T_NEAR);
    groups(kGroups);
    add(rcx, kLanes * kGroups);
    jmp(wide, T_NEAR);
    L(narrow);
    cmp(rcx, rdx);
    jge(done, T_NEAR);
    groups(1);
    add(rcx, kLanes);
    jmp(narrow, T_NEAR);
    L(done);
    vzeroupper();
    mov(rsp, rbp);
    pop(rbp);
    ret();
    align(64);
    for (auto& [bits, label] : table_) {
      L(label);
      for (int i = 0; i < kLanes; ++i) dd(bits);
    }
  }

  // Whether node m runs in the loop (not made per call, per tile or as a constant).
  static bool looped(const ir::Node& m) {
    return m.op != ir::Op::broadcast_in_dim && m.op != ir::Op::iota && m.op != ir::Op::full;
  }

  // `count` groups at element rcx: each op for every group in turn, then each result's groups. With AVX-512, a
  // looped node's value also stays in a register per group (Vec(16 + g)) for the next looped node, and skips its
  // slot when that node is its only reader and it is no result.
  void groups(int count) {
    std::array<int, ir::kMaxFusionValues> readers{}, last_reader{};
    int position = 0;
    for (const ir::Node& m : body_.nodes) {
      if (!looped(m)) continue;
      for (ir::ValueId v : m.inputs) ++readers[static_cast<size_t>(v)], last_reader[static_cast<size_t>(v)] = position;
      ++position;
    }
    for (ir::ValueId r : body_.results) readers[static_cast<size_t>(r)] += 2;
    position = 0;
    carried_ = -1;
    for (const ir::Node& m : body_.nodes) {
      if (!looped(m)) continue;
      const auto v = static_cast<size_t>(m.outputs[0]);
      bool own_reader = false;  // the next looped node reads v, and it alone (once or more)
      for (const ir::Node* next = &m + 1; next < body_.nodes.data() + body_.nodes.size(); ++next)
        if (looped(*next)) {
          own_reader = readers[v] > 0 && last_reader[v] == position + 1 &&
                       static_cast<int>(std::count(next->inputs.begin(), next->inputs.end(), m.outputs[0])) == readers[v];
          break;
        }
      for (int g = 0; g < count; ++g) {
        op(m, g);
        if (!kWide || !own_reader) vmovaps(slot(m.outputs[0], g), Vec(0));
        if constexpr (kWide) vmovaps(Vec(16 + g), Vec(0));
      }
      carried_ = kWide ? static_cast<int>(v) : -1;
      ++position;
    }
    carried_ = -1;
    for (size_t r = 0; r < body_.results.size(); ++r)
      for (int g = 0; g < count; ++g) {
        fetch(Vec(0), body_.results[r], g);
        mov(rax, ptr[rsi + static_cast<int>(r * 8)]);
        put(Vec(0), dtype(body_.results[r]), g);
      }
  }

  // dst = a mask of the lanes where vcmpps(a, b, predicate) holds.
  void compare_floats(const Vec& dst, const Vec& a, const Vec& b, uint8_t predicate) {
    if constexpr (kWide) {
      vcmpps(k1, a, b, predicate);
      vpmovm2d(dst, k1);
    } else {
      vcmpps(dst, a, b, predicate);
    }
  }
  // dst = mask ? if_true : if_false, lane by lane.
  void blend(const Vec& dst, const Vec& if_false, const Vec& if_true, const Vec& mask) {
    if constexpr (kWide) {
      vpmovd2m(k1, mask);
      vblendmps(dst | k1, if_false, if_true);
    } else {
      vblendvps(dst, if_false, if_true, mask);
    }
  }

  // r = value v's lanes of group g (elements rcx + kLanes g on).
  void fetch(const Vec& r, ir::ValueId v, int g) {
    const auto i = static_cast<size_t>(v);
    if (constant_[i]) return vmovaps(r, k(*constant_[i]));
    if (static_cast<int>(i) == carried_) return vmovaps(r, Vec(16 + g));
    if (!stream_[i]) return vmovaps(r, slot(v, uniform_[i] ? 0 : g));
    mov(rax, ptr[rdi + static_cast<int>(i * 8)]);
    switch (dtype(v)) {
      case DType::bf16:
        vpmovzxwd(r, ptr[rax + rcx * 2 + g * kLanes * 2]);
        vpslld(r, r, 16);
        return;
      case DType::pred:
        vpmovzxbd(r, ptr[rax + rcx + g * kLanes]);
        vpsubd(r, zero_, r);  // 0 or 1 -> 0 or all ones
        return;
      default: vmovups(r, ptr[rax + rcx * 4 + g * kBytes]); return;
    }
  }

  // Vec(0) = the one element of value v (a param), in every lane.
  void broadcast_scalar(ir::ValueId v) {
    mov(r8, ptr[rdi + static_cast<int>(v) * 8]);
    switch (dtype(v)) {
      case DType::bf16:
        movzx(eax, word[r8]);
        shl(eax, 16);
        break;
      case DType::pred:
        movzx(eax, byte[r8]);
        neg(eax);  // 0 or 1 -> 0 or all ones
        break;
      default: mov(eax, dword[r8]); break;
    }
    vmovd(xmm0, eax);
    vpbroadcastd(Vec(0), xmm0);
  }

  // r's lanes into result storage at rax, group g, as dtype d.
  void put(const Vec& r, DType d, int g) {
    const Xbyak::Xmm x(r.getIdx());
    switch (d) {
      case DType::bf16:
        vpsrld(r, r, 16);
        if constexpr (kWide) {
          vpmovdw(ptr[rax + rcx * 2 + g * kLanes * 2], r);
        } else {
          vpackusdw(r, r, r);
          vpermq(r, r, 0x08);
          vmovdqu(ptr[rax + rcx * 2 + g * kLanes * 2], x);
        }
        return;
      case DType::pred:
        vpsrld(r, r, 31);
        if constexpr (kWide) {
          vpmovdb(ptr[rax + rcx + g * kLanes], r);
        } else {
          vpackusdw(r, r, r);
          vpermq(r, r, 0x08);
          vpackuswb(x, x, x);
          vmovq(ptr[rax + rcx + g * kLanes], x);
        }
        return;
      default: vmovups(ptr[rax + rcx * 4 + g * kBytes], r); return;
    }
  }

  // r = r rounded to bf16 (nearest, ties to even; a NaN made quiet), widened back: float_to_bf16's arithmetic.
  void round_bf16(const Vec& r) {
    const Vec t(12), quiet(13), nan(14);
    vpsrld(t, r, 16);
    vpandd(t, t, k(1u));
    vpaddd(t, t, k(0x7fffu));
    vpaddd(t, t, r);
    if constexpr (kWide) {
      vcmpps(k1, r, r, kUnord);
      vpord(t | k1, r, k(0x00400000u));
    } else {
      vpord(quiet, r, k(0x00400000u));
      vcmpps(nan, r, r, kUnord);
      vblendvps(t, t, quiet, nan);
    }
    vpandd(r, t, k(0xffff0000u));
  }

  // out = a where a is a NaN (else out as it is).
  void keep_nan(const Vec& out, const Vec& a, const Vec& scratch) {
    if constexpr (kWide) {
      vcmpps(k1, a, a, kUnord);
      vmovaps(out | k1, a);
    } else {
      vcmpps(scratch, a, a, kUnord);
      vblendvps(out, out, a, scratch);
    }
  }

  // Vec(0) = exp_f32(Vec(0)); Vec(4)-Vec(8) clobbered.
  void exp_f32() {
    const Vec x(0), c(4), shifted(5), n(6), r(7), p(8);
    vmovaps(c, k(kExpLow));
    vmaxps(x, c, x);  // std::max(x, low): x unless x < low; a NaN stays
    vmovaps(c, k(kExpHigh));
    vminps(x, c, x);  // std::min(x, high)
    vmulps(shifted, x, k(kExpLog2e));
    vaddps(shifted, shifted, k(kExpRound));
    vsubps(n, shifted, k(kExpRound));
    vmulps(r, n, k(kExpLn2High));
    vsubps(r, x, r);
    vmulps(p, n, k(kExpLn2Low));
    vsubps(r, r, p);
    vmovaps(p, k(kExpPoly[0]));
    for (int i = 1; i < 7; ++i) {
      vmulps(p, p, r);
      vaddps(p, p, k(kExpPoly[i]));
    }
    if constexpr (kWide) {  // p 2^n rounded once: exp_f32's two scalings give that too (the first is exact)
      vscalefps(x, p, n);
      return;
    }
    const Vec& kk = shifted;  // k, from the bits of the rounding sum
    const Vec& half = n;
    vpsubd(kk, shifted, k(kExpRound));
    vpsrad(half, kk, 1);
    vpsubd(kk, kk, half);  // k - half
    vpaddd(half, half, k(127u));
    vpslld(half, half, 23);
    vpaddd(kk, kk, k(127u));
    vpslld(kk, kk, 23);
    vmulps(x, p, half);
    vmulps(x, x, kk);
  }

  // Vec(0) = node m's lanes of group g, its operands fetched into Vec(1)-Vec(3).
  void op(const ir::Node& m, int g) {
    const Vec out(0), a(1), b(2), c(3), t(4), u(5);
    for (size_t q = 0; q < m.inputs.size(); ++q) fetch(Vec(static_cast<int>(q) + 1), m.inputs[q], g);
    const DType type = dtype(m.outputs[0]);
    switch (m.op) {
      case ir::Op::add: vaddps(out, a, b); break;
      case ir::Op::sub: vsubps(out, a, b); break;
      case ir::Op::mul: vmulps(out, a, b); break;
      case ir::Op::div: vdivps(out, a, b); break;
      case ir::Op::neg: vpxord(out, a, k(0x80000000u)); break;
      case ir::Op::sqrt: vsqrtps(out, a); break;
      case ir::Op::rsqrt:
        vsqrtps(a, a);
        vmovaps(out, k(1.0f));
        vdivps(out, out, a);
        break;
      case ir::Op::max:
      case ir::Op::min:  // a NaN a as it is; else a > b (a < b) ? a : b
        if constexpr (kWide) {
          vcmpps(k1, a, b, m.op == ir::Op::max ? kGt : kLt);
          vblendmps(out | k1, b, a);
        } else {
          vcmpps(t, a, b, m.op == ir::Op::max ? kGt : kLt);
          vblendvps(out, b, a, t);
        }
        keep_nan(out, a, u);
        break;
      case ir::Op::exp:
        vmovaps(out, a);
        exp_f32();
        break;
      case ir::Op::logistic:  // x != x ? x : 1 / (1 + exp(-x))
        vpxord(out, a, k(0x80000000u));
        exp_f32();
        vmovaps(t, k(1.0f));
        vaddps(out, t, out);
        vdivps(out, t, out);
        keep_nan(out, a, t);
        break;
      case ir::Op::compare: compare(m); return;
      case ir::Op::select: blend(out, c, b, a); return;
      case ir::Op::convert_element_type: {
        const DType in = dtype(m.inputs[0]);
        if (in == DType::pred) vpandd(out, a, k(1.0f));
        else if (in == DType::i32 && type == DType::f32) vcvtdq2ps(out, a);
        else vmovaps(out, a);
        break;
      }
      default: ASSERT(false);
    }
    if (type == DType::bf16) round_bf16(out);
  }

  void compare(const ir::Node& m) {
    const Vec out(0), a(1), b(2);
    const std::string& dir = m.attrs.str("direction");
    if (floating(dtype(m.inputs[0]))) {
      const uint8_t p = dir == "eq" ? kEq : dir == "ne" ? kNe : dir == "lt" ? kLt : dir == "le" ? kLe : dir == "gt" ? kGt : kGe;
      return compare_floats(out, a, b, p);
    }
    // i32: eq and gt, the rest from them (swapped operands, or the complement)
    const bool swap = dir == "lt" || dir == "ge";
    const Vec& x = swap ? b : a;
    const Vec& y = swap ? a : b;
    const bool equal = dir == "eq" || dir == "ne";
    if constexpr (kWide) {
      if (equal) vpcmpeqd(k1, x, y);
      else vpcmpgtd(k1, x, y);
      vpmovm2d(out, k1);
    } else {
      if (equal) vpcmpeqd(out, x, y);
      else vpcmpgtd(out, x, y);
    }
    if (dir == "ne" || dir == "le" || dir == "ge") vpxord(out, out, k(~0u));
  }
};

struct Compiled {
  std::weak_ptr<const ir::Graph> body;  // expired when the body is gone: its address may then hold another
  std::array<FusedLoop, 3> loop{};      // per Isa
  std::array<bool, 3> tried{};
};

template <class Vec>
FusedLoop compile(const ir::Graph& body) {
  static std::map<std::string, std::unique_ptr<Compiler<Vec>>> by_text;  // one loop per distinct body
  if (body.nodes.size() + body.params.size() > static_cast<size_t>(ir::kMaxFusionValues)) return nullptr;
  for (const ir::Node& m : body.nodes)
    if (!compilable(body, m)) return nullptr;
  for (ir::ValueId r : body.results)
    if (!held(body.type(r).dtype)) return nullptr;
  std::unique_ptr<Compiler<Vec>>& code = by_text[ir::print(body)];
  if (!code) code = std::make_unique<Compiler<Vec>>(body);
  return code->template getCode<FusedLoop>();
}

}  // namespace

bool gathered(const ir::Graph& body, const ir::Node& m) {
  return m.op == ir::Op::iota ||
         (m.op == ir::Op::broadcast_in_dim && body.type(m.inputs[0]).num_elements() != 1);
}

FusedLoop fused_loop(const std::shared_ptr<ir::Graph>& body) {
  const Isa isa = kernel_isa();
  if (isa == Isa::baseline) return nullptr;
  static std::mutex mutex;
  static std::map<const ir::Graph*, Compiled> cache;
  std::lock_guard<std::mutex> lock(mutex);
  Compiled& c = cache[body.get()];
  if (c.body.expired()) c = Compiled{body, {}, {}};
  const auto i = static_cast<size_t>(isa);
  if (!c.tried[i]) {
    c.loop[i] = isa == Isa::x86_64_v4 ? compile<Xbyak::Zmm>(*body) : compile<Xbyak::Ymm>(*body);
    c.tried[i] = true;
  }
  return c.loop[i];
}

}  // namespace remat::exec
