#include "exec/executable.h"

#include "ir/cost.h"

#include "exec/kernels/kernels.h"

#include <chrono>
#include <cstring>
#include <functional>

namespace remat::exec {

using ir::Graph;
using ir::Node;
using ir::Op;

struct Executable::Frame {
  std::vector<Array> values;                 // by value id
  std::vector<Array> ins, outs, body_args, body_slices;  // scratch, reused
  std::vector<int> first_write, last_read;   // by buffer, for the measured peak (top graph only)
};

namespace {

// Copies the body's carry results into the outer carry buffers. A carry result that is another carry's
// buffer (carries passed on in a different order) is staged first, so no carry is overwritten before read.
void copy_carries(const Backend& backend, const Graph& body, const std::vector<Array>& values, std::span<Array> outs,
                  size_t nh) {
  bool crossed = false;
  for (size_t k = 0; k < nh; ++k)
    for (size_t j = 0; j < nh; ++j)
      crossed = crossed || (j != k && values[static_cast<size_t>(body.results[k])].bytes() == outs[j].bytes());
  if (!crossed) {
    for (size_t k = 0; k < nh; ++k) backend.copy(values[static_cast<size_t>(body.results[k])], outs[k]);
    return;
  }
  std::vector<Array> staged;
  for (size_t k = 0; k < nh; ++k) staged.push_back(values[static_cast<size_t>(body.results[k])].clone());
  for (size_t k = 0; k < nh; ++k) backend.copy(staged[k], outs[k]);
}

}  // namespace

Executable::Executable(Graph graph, plan::Plan plan, Options options, const Executable* arenas_of)
    : graph_(std::move(graph)), plan_(std::move(plan)), options_(options), backend_(*options_.backend) {
  if (options_.separate_buffers) {
    allocate_separately(graph_, plan_);
    for (const auto& [p, buffers] : separate_)
      for (const Array& a : buffers) owned_bytes_ += a.bytes() ? a.type().bytes() : 0;
  } else {  // faulted in here, once, so a step never takes a page fault in the arenas
    auto arena = [&](Array Executable::*which, bool host, int64_t bytes) {
      const Array* other = arenas_of != nullptr ? &(arenas_of->*which) : nullptr;
      if (other != nullptr && other->bytes() != nullptr && other->type().bytes() >= bytes) {
        ++shared_arenas_;
        return *other;
      }
      owned_bytes_ += std::max<int64_t>(bytes, 1);
      return backend_.allocate(host, bytes);
    };
    device_ = arena(&Executable::device_, false, plan_.arena[0]);
    host_ = arena(&Executable::host_, true, plan_.arena[1]);
  }
  check_workspace(graph_, plan_);
  if (options_.poison) {
    std::function<void(const plan::Plan&)> index = [&](const plan::Plan& p) {
      std::vector<std::vector<int>>& ends = ends_at_[&p];
      ends.resize(p.schedule.size());
      for (size_t b = 0; b < p.buffers.size(); ++b)  // results end past the schedule: never poisoned
        if (p.buffers[b].end < static_cast<int>(p.schedule.size())) ends[static_cast<size_t>(p.buffers[b].end)].push_back(static_cast<int>(b));
      for (const auto& [node, body] : p.bodies) index(body);
    };
    index(plan_);
  }
  for (ir::ValueId r : graph_.results) result_types_.push_back(std::make_shared<const ir::Type>(graph_.type(r)));
}

// One allocation per buffer, of the bytes its values use (not the 64-byte rounding; a workspace: the bytes
// the backend asked for), so the first byte past them is ASan's redzone. A scan's sub-arena is not allocated: its body's
// buffers are, one by one.
void Executable::allocate_separately(const Graph& g, const plan::Plan& p) {
  std::vector<Array>& mine = separate_[&p];
  std::vector<int64_t> used(p.buffers.size(), 0);
  for (size_t v = 0; v < p.buffer_of.size(); ++v)
    if (const int b = p.buffer_of[v]; b >= 0)
      used[static_cast<size_t>(b)] = std::max(used[static_cast<size_t>(b)], p.within[v] + g.types[v].bytes());
  for (size_t b = 0; b < p.buffers.size(); ++b)
    mine.push_back(p.buffers[b].workspace ? Array::exact(p.buffers[b].requested)
                   : p.buffers[b].value < 0 ? Array()
                                            : Array::exact(used[b]));
  for (const auto& [node, body] : p.bodies) allocate_separately(*g.nodes[static_cast<size_t>(node)].body, body);
}

std::byte* Executable::buffer_bytes(const plan::Plan& p, size_t b, int64_t device_base, int64_t host_base) const {
  if (options_.separate_buffers) return separate_.at(&p)[b].bytes();
  const plan::Buffer& x = p.buffers[b];
  return x.space == plan::Space::device ? device_.bytes() + device_base + x.offset : host_.bytes() + host_base + x.offset;
}

Executable::~Executable() = default;

// Every kernel gets the workspace the backend says it needs: a plan made without the backend's answer
// (plan::Options::workspace) is refused here, not by a kernel mid-run.
void Executable::check_workspace(const Graph& g, const plan::Plan& p) const {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (ir::is_region(n.op)) {  // run by the executor; a fusion's body is its kernel's, checked as a kernel
      if (auto it = p.bodies.find(static_cast<int>(i)); it != p.bodies.end()) check_workspace(*n.body, it->second);
      continue;
    }
    std::vector<ir::Type> in;
    for (ir::ValueId v : n.inputs) in.push_back(g.type(v));
    const int64_t need = backend_.workspace_bytes(n, in);
    auto it = p.workspace_buffer.find(static_cast<int>(i));
    const int64_t have = it == p.workspace_buffer.end() ? 0 : p.buffers[static_cast<size_t>(it->second)].requested;
    CHECK(need <= have, "{}: its kernel needs {} B of workspace and the plan has {} B; plan the graph with "
          "{{.workspace = exec::workspace_of(backend)}}", ir::describe_node(g, i), need, have);
  }
}

std::vector<Array>& Executable::own_arguments(const std::map<int, Array>& shared) {
  ASSERT(arguments_.empty());
  const Graph& g = graph_;
  std::vector<int64_t> offset(g.params.size(), -1);
  int64_t bytes = 0;
  for (size_t i = 0; i < g.params.size(); ++i)
    if (!shared.contains(static_cast<int>(i))) offset[i] = bytes, bytes += (g.type(g.params[i]).bytes() + 63) / 64 * 64;
  if (bytes > 0) {
    arguments_block_ = backend_.allocate(false, bytes);
    owned_bytes_ += bytes;
  }
  for (size_t i = 0; i < g.params.size(); ++i) {
    if (offset[i] >= 0) {
      arguments_.push_back(arguments_block_.view(g.type(g.params[i]), offset[i]));
      continue;
    }
    const Array& a = shared.at(static_cast<int>(i));
    CHECK(a.type() == g.type(g.params[i]), "graph @{}: shared argument {} (%{}) is {} but the graph expects {}", g.name,
          i, g.param_names[i], ir::type_str(a.type()), ir::type_str(g.type(g.params[i])));
    arguments_.push_back(a);
  }
  return arguments_;
}

Executable::Frame& Executable::frame_for(const Graph& g) {
  auto it = frames_.find(&g);
  if (it == frames_.end()) {
    auto f = std::make_unique<Frame>();
    f->values.resize(g.types.size());
    it = frames_.emplace(&g, std::move(f)).first;
  }
  return *it->second;
}

const std::vector<Array>& Executable::run(std::span<const Array> args) {
  const Graph& g = graph_;
  CHECK(args.size() == g.params.size(), "graph @{} takes {} arguments, got {}", g.name, g.params.size(), args.size());
  for (size_t i = 0; i < args.size(); ++i)
    CHECK(args[i].type() == g.type(g.params[i]), "graph @{}: argument {} (%{}) is {} but the graph expects {}", g.name,
          i, g.param_names[i], ir::type_str(args[i].type()), ir::type_str(g.type(g.params[i])));
  if (options_.poison) {  // nothing is live before the run
    for (Array* arena : {&device_, &host_})
      if (arena->bytes() != nullptr) std::memset(arena->bytes(), 0xFF, static_cast<size_t>(arena->type().bytes()));
    for (auto& [p, buffers] : separate_)
      for (Array& a : buffers)
        if (a.bytes() != nullptr) std::memset(a.bytes(), 0xFF, static_cast<size_t>(a.type().bytes()));
  }
  Frame& f = frame_for(g);
  f.first_write.assign(plan_.buffers.size(), -1);
  f.last_read.assign(plan_.buffers.size(), -1);
  run_graph(g, plan_, 0, 0, f, args, {}, true);
  backend_.synchronize();
  results_.clear();
  for (size_t r = 0; r < g.results.size(); ++r) {
    const int p = plan_.donated_param[r];
    results_.push_back(p >= 0 ? args[static_cast<size_t>(p)]
                              : f.values[static_cast<size_t>(g.results[r])].with_type(result_types_[r]));
  }
  // The measured peak: buffers live from their first write to their last read (results: to the end).
  const int end = static_cast<int>(plan_.schedule.size());
  for (ir::ValueId r : g.results)
    if (int b = plan_.buffer_of[static_cast<size_t>(plan_.root[static_cast<size_t>(r)])]; b >= 0) f.last_read[static_cast<size_t>(b)] = end;
  for (int sp = 0; sp < 2; ++sp) {
    std::vector<int64_t>& live = live_[sp];
    live.assign(static_cast<size_t>(end + 1), 0);
    for (size_t b = 0; b < plan_.buffers.size(); ++b) {
      const plan::Buffer& x = plan_.buffers[b];
      if (static_cast<int>(x.space) != sp || f.first_write[b] < 0) continue;
      for (int s = f.first_write[b]; s <= std::max(f.first_write[b], f.last_read[b]); ++s) live[static_cast<size_t>(s)] += x.bytes;
    }
    measured_[sp] = *std::max_element(live.begin(), live.end());
  }
  return results_;
}

void Executable::run_graph(const Graph& g, const plan::Plan& p, int64_t device_base, int64_t host_base, Frame& f,
                           std::span<const Array> args, std::span<const Array> slices, bool top) {
  for (size_t i = 0; i < args.size(); ++i) f.values[static_cast<size_t>(g.params[i])] = args[i];
  std::vector<Array>& vals = f.values;
  // A value's storage: its planned arena slot, or (donated results) its argument's buffer.
  auto storage = [&](ir::ValueId v) -> Array {
    const int b = p.buffer_of[static_cast<size_t>(v)];
    if (b == plan::kInSlice) {  // a stacked result, or a value it was written in place over: its slice of the output
      for (size_t r = 0; r < g.results.size(); ++r)
        if (p.in_slice[r] && p.root[static_cast<size_t>(g.results[r])] == p.root[static_cast<size_t>(v)])
          return slices[r].view(&g.type(v));
      ASSERT(false);
    }
    if (b == -1) {  // donated: the argument's buffer
      for (size_t r = 0; r < g.results.size(); ++r)
        if (g.results[r] == v && p.donated_param[r] >= 0) return args[static_cast<size_t>(p.donated_param[r])];
      ASSERT(false);
    }
    if (options_.separate_buffers)
      return separate_.at(&p)[static_cast<size_t>(b)].view(&g.type(v), p.within[static_cast<size_t>(v)]);
    const plan::Buffer& x = p.buffers[static_cast<size_t>(b)];
    return (x.space == plan::Space::device ? device_ : host_)
        .view(&g.type(v), (x.space == plan::Space::device ? device_base : host_base) + x.offset +
                              p.within[static_cast<size_t>(v)]);
  };
  for (size_t s = 0; s < p.schedule.size(); ++s) {
    const int i = p.schedule[s];
    const Node& n = g.nodes[static_cast<size_t>(i)];
    f.ins.clear();
    f.outs.clear();
    for (ir::ValueId v : n.inputs) f.ins.push_back(vals[static_cast<size_t>(v)]);
    const bool alias = ir::is_view(n.op);  // the kernel makes the output a view of the operand
    for (ir::ValueId v : n.outputs) f.outs.push_back(alias ? Array::unallocated(&g.type(v)) : storage(v));
    if (top) {
      for (ir::ValueId v : n.inputs)
        if (int b = p.buffer_of[static_cast<size_t>(v)]; b >= 0) f.last_read[static_cast<size_t>(b)] = static_cast<int>(s);
      for (ir::ValueId v : n.outputs)
        if (int b = p.buffer_of[static_cast<size_t>(v)]; b >= 0 && f.first_write[static_cast<size_t>(b)] < 0)
          f.first_write[static_cast<size_t>(b)] = static_cast<int>(s);
      for (const auto* m : {&p.body_buffer, &p.body_host_buffer, &p.workspace_buffer})
        if (auto it = m->find(i); it != m->end()) {
          f.first_write[static_cast<size_t>(it->second)] = static_cast<int>(s);
          f.last_read[static_cast<size_t>(it->second)] = static_cast<int>(s);
        }
    }
    try {
      if (n.op == Op::scan) {
        const plan::Plan& bp = p.bodies.at(i);
        auto sub = [&](const std::map<int, int>& m, int64_t base) {
          auto it = m.find(i);
          return it == m.end() ? base : base + p.buffers[static_cast<size_t>(it->second)].offset;
        };
        const int64_t body_device = sub(p.body_buffer, device_base), body_host = sub(p.body_host_buffer, host_base);
        const Graph& body = *n.body;
        Frame& bf = frame_for(body);
        const ir::ScanAttrs scan = ir::scan_attrs(n.attrs);
        const int64_t length = scan.length;
        const size_t nc = static_cast<size_t>(scan.num_consts), nh = static_cast<size_t>(scan.num_carry);
        for (size_t k = 0; k < nh; ++k)  // a carry planned over its initial value is already there
          if (f.ins[nc + k].bytes() != f.outs[k].bytes()) backend_.copy(f.ins[nc + k], f.outs[k]);
        for (int64_t step = 0; step < length; ++step) {
          const int64_t t = scan.reverse ? length - 1 - step : step;
          f.body_args.clear();
          for (size_t q = 0; q < f.ins.size(); ++q)
            f.body_args.push_back(q < nc        ? f.ins[q]
                                  : q < nc + nh ? f.outs[q - nc]
                                                : f.ins[q].slice0(t, &body.type(body.params[q])));
          f.body_slices.assign(nh, Array());
          for (size_t k = nh; k < n.outputs.size(); ++k)
            f.body_slices.push_back(f.outs[k].slice0(t, &body.type(body.results[k])));
          run_graph(body, bp, body_device, body_host, bf, f.body_args, f.body_slices, false);
          // ys first: a y may be a carry param, which is the outer carry buffer the carries overwrite next.
          for (size_t k = nh; k < n.outputs.size(); ++k) {
            if (bp.in_slice[k]) continue;  // made there
            const Array& r = bf.values[static_cast<size_t>(body.results[k])];
            backend_.copy(r, f.outs[k], t * r.type().bytes());
          }
          copy_carries(backend_, body, bf.values, f.outs, nh);
        }
      } else {
        std::span<std::byte> workspace;
        if (auto it = p.workspace_buffer.find(i); it != p.workspace_buffer.end())
          workspace = {buffer_bytes(p, static_cast<size_t>(it->second), device_base, host_base),
                       static_cast<size_t>(p.buffers[static_cast<size_t>(it->second)].requested)};
        call_kernel(g, n, f.ins, f.outs, workspace);
      }
    } catch (const Error& e) {
      CHECK(false, "{}: {}", ir::describe_node(g, static_cast<size_t>(i)), e.what());
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) vals[static_cast<size_t>(n.outputs[k])] = f.outs[k];
    if (options_.poison)
      for (int b : ends_at_.at(&p)[s]) poison(p, static_cast<size_t>(b), device_base, host_base);
  }
}

void Executable::call_kernel(const Graph& g, const Node& n, std::span<const Array> in, std::span<Array> out,
                             std::span<std::byte> workspace) {
  const KernelContext ctx{options_, workspace};
  const Kernel kernel = backend_.kernel(n.op);
  if (options_.profile == nullptr) return kernel(n, in, out, ctx);
  const auto t0 = std::chrono::steady_clock::now();
  kernel(n, in, out, ctx);
  backend_.synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  if (options_.profile->record) {
    auto since = [](auto t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); };
    double bytes = 0;  // a view moves nothing
    for (const Array& a : in) bytes += ir::is_view(n.op) ? 0 : static_cast<double>(a.type().bytes());
    for (const Array& a : out) bytes += ir::is_view(n.op) ? 0 : static_cast<double>(a.type().bytes());
    Profile::Call& c = options_.profile->timeline.emplace_back(Profile::Call{&n, since(t0), since(t1), bytes, ir::flops(g, n), {}});
    if (ir::op_traits(n.op).cls == ir::OpClass::contraction)  // what matmul_floor times
      for (const Array& a : in) c.operands.push_back(a.type());
  }
  ir::for_each_op_run(g, n, [&](const Graph&, const Node& m, int64_t runs) { options_.profile->runs_by_origin[m.origin] += runs; });
}

void Executable::poison(const plan::Plan& p, size_t b, int64_t device_base, int64_t host_base) {
  if (options_.separate_buffers && separate_.at(&p)[b].bytes() == nullptr) return;  // a sub-arena: not allocated
  const int64_t bytes = options_.separate_buffers ? separate_.at(&p)[b].type().bytes() : p.buffers[b].bytes;
  std::memset(buffer_bytes(p, b, device_base, host_base), 0xFF, static_cast<size_t>(bytes));
}

}  // namespace remat::exec
