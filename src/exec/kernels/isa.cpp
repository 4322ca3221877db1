// Which instruction set the cloned kernels run (REMAT_WIDEST_CLONES in kernels.h).
#include "exec/kernels/kernels.h"

#include <algorithm>
#include <vector>

namespace remat::exec {
namespace {

std::vector<Isa> supported() {
  std::vector<Isa> isas{Isa::baseline};
#if REMAT_HAS_ISA_CLONES
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isas.push_back(Isa::avx2);
  if (__builtin_cpu_supports("x86-64-v4")) isas.push_back(Isa::x86_64_v4);
#endif
  return isas;
}

Isa& chosen() {
  static Isa isa = available_isas().back();  // the widest
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  return isa == Isa::baseline ? "default" : isa == Isa::avx2 ? "avx2" : "x86-64-v4";
}

std::span<const Isa> available_isas() {
  static const std::vector<Isa> isas = supported();
  return isas;
}

Isa kernel_isa() { return chosen(); }

IsaOverride::IsaOverride(Isa isa) : before_(kernel_isa()) {
  const std::span<const Isa> ok = available_isas();
  CHECK(std::find(ok.begin(), ok.end(), isa) != ok.end(),
        "IsaOverride: this build or CPU cannot run the {} kernels; pick one of available_isas()", isa_name(isa));
  chosen() = isa;
}

IsaOverride::~IsaOverride() { chosen() = before_; }

}  // namespace remat::exec
