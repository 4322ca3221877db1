// A steady-state training step on the arena executor allocates nothing: every heap allocation made while
// it runs — operator new and the C allocator (malloc, calloc, realloc, aligned_alloc, posix_memalign,
// memalign, valloc: interposed here and forwarded to glibc's own) — is counted, after a first step has
// made the caches (oneDNN primitives and memory objects, kernel scratch, per-graph frames). Allocations made inside libdnnl are
// counted apart: oneDNN 2.6 builds an argument map inside every primitive execution, which no caller
// can avoid; the engine's own code must make none.
// Not in sanitizer builds: ASan owns operator new there (and counting its allocations means nothing).
#ifndef __SANITIZE_ADDRESS__

#include "exec/executable.h"
#include "support/models.h"
#include "compile/compile.h"
#include "train/step.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <dlfcn.h>
#include <sys/resource.h>

namespace {
std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0}, library_allocations{0};

bool from_onednn(void* caller) {
  Dl_info info;
  return dladdr(caller, &info) != 0 && info.dli_fname != nullptr && std::strstr(info.dli_fname, "libdnnl") != nullptr;
}

void count(void* caller) {
  if (counting.load(std::memory_order_relaxed))
    (from_onednn(caller) ? library_allocations : allocations).fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

// glibc's allocator under its own names: what the interposed functions below forward to.
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void* __libc_valloc(std::size_t);

void* malloc(std::size_t n) {
  count(__builtin_return_address(0));
  return __libc_malloc(n);
}
void* calloc(std::size_t k, std::size_t n) {
  count(__builtin_return_address(0));
  return __libc_calloc(k, n);
}
void* realloc(void* p, std::size_t n) {
  count(__builtin_return_address(0));
  return __libc_realloc(p, n);
}
void* aligned_alloc(std::size_t align, std::size_t n) {
  count(__builtin_return_address(0));
  return __libc_memalign(align, n);
}
void* memalign(std::size_t align, std::size_t n) {
  count(__builtin_return_address(0));
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, std::size_t align, std::size_t n) {
  count(__builtin_return_address(0));
  *out = __libc_memalign(align, n);
  return *out == nullptr ? ENOMEM : 0;
}
void* valloc(std::size_t n) {
  count(__builtin_return_address(0));
  return __libc_valloc(n);
}
}

namespace {
void* counted_new(std::size_t n, void* caller) {
  count(caller);
  if (void* p = __libc_malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_new(n, __builtin_return_address(0)); }
void* operator new[](std::size_t n) { return counted_new(n, __builtin_return_address(0)); }
// These operator new allocate with malloc, so free is the matching release; g++ 12 at -O1 inlines a delete after
// a new into one function and warns that new's result reaches free.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace remat {
namespace {

// A planned training step of the small model (2 microbatches) on the arguments it owns (as `remat train`
// runs it), after a first step has built the caches (oneDNN primitives, per-graph frames).
struct WarmStep {
  nn::ModelConfig c;
  ir::Signature signature;
  std::unique_ptr<exec::Executable> step;

  WarmStep(const std::string& policy, train::StepShape shape) : c(testing_support::small_model(2, true, policy)) {
    compile::Compiled s = compile::compile({.model = c, .shape = shape});
    signature = s.signature;
    step = std::make_unique<exec::Executable>(std::move(s.program), std::move(s.plan));
    std::vector<exec::Array>& args = step->own_arguments();
    std::vector<exec::Array> params;
    for (size_t i = 0; i < signature.args.size(); ++i)
      if (signature.args[i].role == ir::Role::parameter) params.push_back(args[i]);
    nn::init_params(c, 1, params);
    step->run();
  }
};

TEST(ZeroAllocation, SteadyStateTrainingStep) {
  for (const char* policy : {"full", "minimal_offloaded"}) {
    WarmStep w(policy, {2, 16, 2});
    exec::Executable& step = *w.step;
    allocations = 0;
    library_allocations = 0;
    counting = true;
    const std::vector<exec::Array>& out = step.run();
    counting = false;
    EXPECT_EQ(allocations.load(), 0) << policy << ": heap allocations by the engine during a steady-state step";
    std::printf("%s: %lld allocations inside oneDNN's primitive execute during the step, 0 elsewhere\n", policy,
                static_cast<long long>(library_allocations.load()));
    EXPECT_TRUE(std::isfinite(out[static_cast<size_t>(w.signature.result("loss"))].get(0)));
  }
}

// A matmul of 2048 rows packs its rhs (dot_general.cpp) through a reorder made once: no allocation either.
TEST(ZeroAllocation, SteadyStateMatmulWithAPackedRhs) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    ir::Graph g;
    ir::Builder b(g);
    b.result(ir::dot_general(b.param("x", {dtype, {2048, 96}}), b.param("w", {dtype, {96, 160}}), {{1}, {0}, {}, {}}));
    exec::Executable e(g.clone(), plan::build(g, {.workspace = exec::workspace_of(exec::cpu())}));
    e.own_arguments();
    e.run();
    allocations = 0;
    counting = true;
    e.run();
    counting = false;
    EXPECT_EQ(allocations.load(), 0) << dtype_name(dtype) << ": heap allocations by the engine during a matmul";
  }
}

// The arenas are faulted in when the executable is made: steady-state steps (the 2nd on) take no minor
// page fault at all, in any thread of the process (getrusage counts them all).
TEST(ZeroAllocation, SteadyStateStepsTakeNoPageFault) {
  WarmStep w("minimal_offloaded", {4, 32, 2});
  exec::Executable& step = *w.step;
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  for (int k = 0; k < 3; ++k) step.run();
  getrusage(RUSAGE_SELF, &after);
  EXPECT_EQ(after.ru_minflt - before.ru_minflt, 0) << "minor page faults in 3 steady-state steps";
  EXPECT_EQ(after.ru_majflt - before.ru_majflt, 0);
}

}  // namespace
}  // namespace remat

#endif  // __SANITIZE_ADDRESS__
