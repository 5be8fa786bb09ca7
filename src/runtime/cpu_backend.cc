// The CPU backend: compiles a graph (fusion and constant folding in
// compile_passes.cc, DCE), makes one kernel per node, plans all
// intermediate buffers into one arena and runs nodes in topological order.
// Async kernels are waited on before their first consumer. Steady-state
// runs allocate nothing. Its trace is written by chrome_trace.cc.
#include <cblas.h>
#include <omp.h>
#include <xmmintrin.h>

#include <chrono>
#include <fstream>
#include <set>

#include "runtime/cpu/kernels_internal.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/graph/op_registry.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/tensor/safetensors.h"

namespace shoal::runtime {

using graph::Graph;
using graph::Node;
using graph::Value;

KernelRegistry& KernelRegistry::cpu() {
  static KernelRegistry* reg = [] {
    auto* r = new KernelRegistry();  // NOLINT(cppcoreguidelines-owning-memory): process lifetime
    cpu::register_elementwise(*r);
    cpu::register_reduce(*r);
    cpu::register_softmax(*r);
    cpu::register_shape_ops(*r);
    cpu::register_nn(*r);
    cpu::register_norms(*r);
    cpu::register_onednn(*r);
    cpu::register_bf16_writers(*r);
    cpu::register_gelu(*r);
    cpu::register_softmax_bf16(*r);
    return r;
  }();
  return *reg;
}

void KernelRegistry::add(const std::string& op, KernelFactory f) { f_[op] = std::move(f); }
const KernelFactory* KernelRegistry::find(const std::string& op) const {
  auto it = f_.find(op);
  return it == f_.end() ? nullptr : &it->second;
}

int num_cores() { return omp_get_num_procs(); }

Result<std::unique_ptr<Kernel>> make_kernel(const KernelFactory& f, const Node& node,
                                            const std::vector<graph::TensorType>& inputs) {
  try {
    return f(node, inputs);
  } catch (const std::exception& e) {
    return internal_error("{}: building its kernel threw: {}", node.label(), e.what());
  }
}

Status run_kernel(Kernel& k, const KernelContext& ctx, std::span<const Tensor> in,
                  std::span<Tensor> out) {
  try {
    return k.run(ctx, in, out);
  } catch (const std::exception& e) {
    return internal_error("{}: its {} kernel threw: {}", ctx.node.label(), k.impl(), e.what());
  }
}

void set_num_threads(int n) {
  if (n <= 0) n = num_cores();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  // Flush denormals to zero (FTZ) and read them as zero (DAZ) on every
  // OpenMP thread: gradients decay into the denormal range late in
  // training, where each x86 operation on one costs ~100 cycles (measured:
  // a CNN epoch ran 1.45x slower in epoch 2 than in epoch 1 without this).
  // oneDNN and TensorFlow run with the same setting.
#pragma omp parallel num_threads(n)
  _mm_setcsr(_mm_getcsr() | 0x8040);
}
int num_threads() { return omp_get_max_threads(); }

namespace {

double now_us() { return trace_clock_us(); }

struct Step {
  int node;
  std::unique_ptr<Kernel> kernel;
  std::vector<Tensor> in, out;
  std::vector<int> wait_for;  // indices into steps_ of async producers
  const char* op_name;
  bool serial = false;  // built and run on one thread (cpu::runs_serial)
};

class CpuExecutable final : public Executable {
 public:
  static Result<std::unique_ptr<Executable>> create(Graph g, const CompileOptions& o) {
    auto exe = std::unique_ptr<CpuExecutable>(new CpuExecutable());
    exe->opts_ = o;
    SHOAL_RETURN_IF_ERROR(exe->compile(std::move(g)));
    return std::unique_ptr<Executable>(std::move(exe));
  }

  Status bind(const std::string& name, const Tensor& t) override {
    auto it = input_ids_.find(name);
    if (it == input_ids_.end()) return not_found("bind: graph has no input named '{}'", name);
    const Node& n = g_.node(it->second);
    const graph::TensorType& want = n.outputs[0];
    if (!t.defined() || t.dtype() != want.dtype || t.shape() != want.shape)
      return invalid_argument("bind: input '{}' expects {} but got {}{}", name, want.str(),
                              t.defined() ? dtype_name(t.dtype()) : "undefined",
                              t.defined() ? shape_str(t.shape()) : "");
    Tensor c = t.contiguous();
    for (int out : bound_outputs_)
      if (overlaps(outputs_[static_cast<std::size_t>(out)], c))
        SHOAL_RETURN_IF_ERROR(check_in_place(out, n.id, name));
    values_[Value{n.id, 0}] = c;
    for (auto [s, slot] : input_uses_[n.id]) steps_[s].in[slot] = c;
    for (auto [i, _] : output_of_input_[n.id]) outputs_[i] = c;
    bound_.insert(n.id);
    return ok_status();
  }

  Status bind_output(int i, const Tensor& t) override {
    if (i < 0 || i >= static_cast<int>(outputs_.size()))
      return invalid_argument("bind_output: graph has {} outputs, no output {}", outputs_.size(),
                              i);
    const Value v = g_.outputs()[static_cast<std::size_t>(i)];
    auto sit = step_of_.find(v.node);
    if (sit == step_of_.end())
      return invalid_argument("bind_output: output {} is not computed by a node", i);
    const graph::TensorType& want = g_.type(v);
    if (!t.defined() || t.dtype() != want.dtype || t.shape() != want.shape || !t.is_contiguous())
      return invalid_argument("bind_output: output {} ({}) needs a contiguous {}", i,
                              g_.node(v.node).label(), want.str());
    Step& s = steps_[static_cast<std::size_t>(sit->second)];
    if (s.kernel->is_async())
      return invalid_argument("bind_output: output {} comes from an async node", i);
    // Check against every bound input it overlaps before changing anything.
    Tensor old = outputs_[static_cast<std::size_t>(i)];
    outputs_[static_cast<std::size_t>(i)] = t;
    for (const auto& [name, id] : input_ids_) {
      auto vit = values_.find(Value{id, 0});
      if (vit == values_.end() || !overlaps(vit->second, t)) continue;
      Status st = check_in_place(i, id, name);
      if (!st.ok()) {
        outputs_[static_cast<std::size_t>(i)] = old;
        return st;
      }
    }
    place(v, t);
    bound_outputs_.insert(i);
    return ok_status();
  }

  Status run() override {
    if (bound_.size() != input_ids_.size()) {
      for (const auto& [name, id] : input_ids_)
        if (!bound_.count(id)) return failed_precondition("run: input '{}' is not bound", name);
    }
    // Outputs planned outside the arena that no bind_output took.
    for (auto it = unbacked_.begin(); it != unbacked_.end(); it = unbacked_.begin()) {
      const graph::TensorType& t = g_.type(*it);
      place(*it, Tensor::empty(t.shape, t.dtype));
    }
    std::fill(pending_.begin(), pending_.end(), false);
    trace_.clear();
    Deadline dl = Deadline::after_seconds(opts_.async_wait_seconds);
    held_written_ = false;
    for (std::size_t i = 0; i < steps_.size(); ++i) {
      Step& s = steps_[i];
      if (static_cast<int>(i) == hold_at_) {  // every collective lands first (hold_writes)
        for (std::size_t p = 0; p < i; ++p) SHOAL_RETURN_IF_ERROR(finish(static_cast<int>(p), dl));
        held_written_ = true;
      }
      for (int p : s.wait_for) SHOAL_RETURN_IF_ERROR(finish(p, dl));
      const Node& n = g_.node(s.node);
      double t0 = tracing_ ? now_us() : 0;
      KernelContext ctx{n, step_};
      Status st;
      {
        cpu::SerialScope one(s.serial);
        st = run_kernel(*s.kernel, ctx, s.in, s.out);
      }
      if (!st.ok()) return st.with_context(fmt::format("running {}", n.label()));
      if (s.kernel->is_async()) pending_[i] = true;
      if (tracing_)
        trace_.push_back(TraceEvent{s.op_name, s.node, 0, t0, now_us() - t0, s.kernel->impl()});
    }
    for (std::size_t i = 0; i < steps_.size(); ++i)
      if (pending_[i]) SHOAL_RETURN_IF_ERROR(finish(static_cast<int>(i), dl));
    ++step_;
    return ok_status();
  }

  const Tensor& output(int i) const override { return outputs_.at(static_cast<std::size_t>(i)); }
  int num_outputs() const override { return static_cast<int>(outputs_.size()); }
  std::size_t arena_bytes() const override { return plan_.arena_bytes; }
  std::size_t naive_bytes() const override { return plan_.naive_bytes; }
  const Graph& graph() const override { return g_; }
  void enable_trace(bool on) override {
    tracing_ = on;
    if (on) trace_.reserve(steps_.size() * 64);
  }
  const std::vector<TraceEvent>& trace() const override { return trace_; }
  std::uint64_t steps() const override { return step_; }
  void set_step(std::uint64_t s) override { step_ = s; }
  Status hold_writes(const std::vector<int>& outs) override {
    int first = -1;
    for (int i : outs) {
      if (i < 0 || i >= static_cast<int>(outputs_.size()))
        return invalid_argument("hold_writes: graph has {} outputs, no output {}", outputs_.size(),
                                i);
      auto it = step_of_.find(g_.outputs()[static_cast<std::size_t>(i)].node);
      if (it != step_of_.end() && (first < 0 || it->second < first)) first = it->second;
    }
    for (std::size_t j = first < 0 ? steps_.size() : static_cast<std::size_t>(first);
         j < steps_.size(); ++j)
      if (steps_[j].kernel->is_async())
        return failed_precondition(
            "hold_writes: {} starts a collective after {} writes a held output",
            g_.node(steps_[j].node).label(),
            g_.node(steps_[static_cast<std::size_t>(first)].node).label());
    hold_at_ = first;
    return ok_status();
  }
  bool held_written() const override { return held_written_; }

  std::map<std::string, std::string> kernel_impls() const override {
    std::map<std::string, std::string> m;
    for (const Step& s : steps_) {
      std::string& v = m[s.op_name];
      std::string impl = s.kernel->impl();
      if (v.find(impl) == std::string::npos) v += v.empty() ? impl : "+" + impl;
    }
    return m;
  }

 private:
  Status finish(int i, Deadline dl) {
    if (!pending_[i]) return ok_status();
    pending_[i] = false;
    double t0 = tracing_ ? now_us() : 0;
    Status st = steps_[i].kernel->wait(dl);
    if (tracing_) {
      trace_.push_back(TraceEvent{"wait", steps_[i].node, 0, t0, now_us() - t0});
      std::chrono::steady_clock::time_point ws, we;
      if (steps_[i].kernel->work_interval(&ws, &we))
        trace_.push_back(TraceEvent{steps_[i].op_name, steps_[i].node, 1, trace_clock_us(ws),
                                    trace_clock_us(we) - trace_clock_us(ws)});
    }
    if (st.ok()) return st;
    return st.with_context(fmt::format("waiting for {}", g_.node(steps_[i].node).label()));
  }

  Status compile(Graph g) {
    if (g.outputs().empty()) return invalid_argument("compile: graph has no outputs");
    SHOAL_RETURN_IF_ERROR(graph::verify(g));
    // Dead readers (what a graph pass left behind) must not count as uses
    // that keep a fusion from happening.
    graph::eliminate_dead_code(g);
    if (opts_.fuse) {
      fuse_activations(g);
      fuse_residual_norms(g);
      fuse_slice_scatters(g);
      fuse_pool_relu_grads(g);
    }
    if (opts_.constant_fold) SHOAL_RETURN_IF_ERROR(constant_fold(g).status());
    graph::eliminate_dead_code(g);
    SHOAL_ASSIGN_OR_RETURN(bool blocked, env::get_bool("SHOAL_BLOCKED_LAYOUT", true));
    if (opts_.blocked_layouts && blocked) SHOAL_RETURN_IF_ERROR(assign_blocked_layouts(g).status());
    SHOAL_ASSIGN_OR_RETURN(std::vector<int> order0, g.topo_order());
    g_ = std::move(g);

    // Kernels first: async ones change the order and lifetimes.
    std::map<int, std::unique_ptr<Kernel>> kernels;
    std::set<int> urgent, serial;
    for (int id : order0) {
      const Node& n = g_.node(id);
      if (n.op == "input" || n.op == "constant") continue;
      const KernelFactory* f = KernelRegistry::cpu().find(n.op);
      if (f == nullptr) return unimplemented("compile: no CPU kernel for {}", n.label());
      std::vector<graph::TensorType> in;
      for (const Value& v : n.inputs) in.push_back(g_.type(v));
      const bool one = cpu::runs_serial(g_, n);
      cpu::SerialScope scope(one);  // oneDNN sizes its work split when built
      auto k = make_kernel(*f, n, in);
      if (!k.ok()) return k.status().with_context(fmt::format("compile: {}", n.label()));
      if ((*k)->is_async()) urgent.insert(id);
      if (one && !(*k)->is_async()) serial.insert(id);
      kernels[id] = std::move(k).value();
    }
    // An async node (a collective) runs as soon as its inputs exist, ahead
    // of independent compute, and its consumers (which wait for it) run only
    // when nothing else is ready, so its work overlaps the rest of the
    // graph. Without the second rule a consumer with a smaller id than some
    // backward node (the layout pass appends nodes) waited mid-backward:
    // 0.34-0.39 ms exposed per CNN step on 2 ranks.
    std::set<int> deferred;
    for (int id : order0)
      for (const Value& v : g_.node(id).inputs)
        if (urgent.count(v.node)) deferred.insert(id);
    SHOAL_ASSIGN_OR_RETURN(std::vector<int> order, g_.topo_order(urgent, deferred));
    for (int id : order) {
      const Node& n = g_.node(id);
      if (n.op == "input") {
        input_ids_[n.name] = id;
        continue;
      }
      if (n.op == "constant") {
        values_[Value{id, 0}] = n.constant;
        continue;
      }
      Step s;
      s.node = id;
      s.kernel = std::move(kernels.at(id));
      s.op_name = n.op.c_str();
      s.serial = serial.count(id) != 0;
      step_of_[id] = static_cast<int>(steps_.size());
      steps_.push_back(std::move(s));
    }
    // Positions in `order` for lifetime extension of async inputs/outputs.
    std::map<int, int> pos;
    for (std::size_t i = 0; i < order.size(); ++i) pos[order[i]] = static_cast<int>(i);
    std::map<Value, int> extend;
    for (Step& s : steps_) {
      const Node& n = g_.node(s.node);
      for (const Value& v : n.inputs) {
        auto it = step_of_.find(v.node);
        if (it == step_of_.end() || !steps_[it->second].kernel->is_async()) continue;
        if (std::find(s.wait_for.begin(), s.wait_for.end(), it->second) == s.wait_for.end())
          s.wait_for.push_back(it->second);
      }
    }
    for (Step& s : steps_) {
      if (!s.kernel->is_async()) continue;
      // Inputs stay untouched until the first consumer has waited.
      int first_wait = static_cast<int>(order.size());
      for (Step& t : steps_)
        if (std::find(t.wait_for.begin(), t.wait_for.end(), step_of_[s.node]) != t.wait_for.end())
          first_wait = std::min(first_wait, pos[t.node]);
      for (const Value& v : g_.node(s.node).inputs) extend[v] = std::max(extend[v], first_wait);
      for (std::size_t i = 0; i < g_.node(s.node).outputs.size(); ++i)
        extend[Value{s.node, static_cast<int>(i)}] =
            std::max(extend[Value{s.node, static_cast<int>(i)}], first_wait);
    }
    const std::vector<graph::Pack> pk = packs(order, pos);
    unbacked_ = outside_arena(pk);
    plan_ = graph::plan_memory(g_, order, extend, 64, pk, unbacked_);
    if (opts_.arena_allocator) {
      SHOAL_ASSIGN_OR_RETURN(arena_, opts_.arena_allocator(plan_.arena_bytes));
      if (arena_ == nullptr || arena_->size() < plan_.arena_bytes ||
          reinterpret_cast<std::uintptr_t>(arena_->data()) % 64 != 0)
        return internal_error("the arena allocator gave {} bytes at {}, not {} 64-byte aligned",
                              arena_ ? arena_->size() : 0, arena_ ? arena_->data() : nullptr,
                              plan_.arena_bytes);
    } else {
      arena_ = Storage::allocate(plan_.arena_bytes);
    }
    for (const auto& [v, off] : plan_.offset) {
      const graph::TensorType& t = g_.type(v);
      values_[v] = Tensor::from_storage(arena_, t.shape, t.dtype,
                                        static_cast<std::int64_t>(off / dtype_size(t.dtype)));
    }
    for (const Value& v : unbacked_) values_[v] = Tensor();  // bind_output or run() backs it
    for (std::size_t si = 0; si < steps_.size(); ++si) {
      Step& s = steps_[si];
      const Node& n = g_.node(s.node);
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        const Value& v = n.inputs[i];
        if (g_.node(v.node).op == "input") {
          input_uses_[v.node].emplace_back(static_cast<int>(si), static_cast<int>(i));
          s.in.emplace_back();
        } else {
          s.in.push_back(values_.at(v));
        }
      }
      for (std::size_t i = 0; i < n.outputs.size(); ++i)
        s.out.push_back(values_.at(Value{s.node, static_cast<int>(i)}));
    }
    for (std::size_t i = 0; i < g_.outputs().size(); ++i) {
      Value v = g_.outputs()[i];
      if (g_.node(v.node).op == "input") {
        output_of_input_[v.node].emplace_back(static_cast<int>(i), 0);
        outputs_.emplace_back();
      } else {
        outputs_.push_back(values_.at(v));
      }
    }
    pending_.assign(steps_.size(), false);
    SHOAL_LOG_DEBUG("compiled {} nodes, arena {} bytes (without reuse {})", steps_.size(),
                    plan_.arena_bytes, plan_.naive_bytes);
    return ok_status();
  }

  static bool is_view(const std::string& op) { return op == "reshape" || op == "flatten"; }

  // Packs for the nodes whose kernels want their inputs back to back with
  // outputs in place (gradient buckets), where that cannot change a result:
  // every input is an arena value computed here, used once in the pack, not
  // a graph output, and read by no node after this one.
  std::vector<graph::Pack> packs(const std::vector<int>& order, const std::map<int, int>& pos) {
    std::vector<graph::Pack> out;
    std::set<Value> taken, graph_out(g_.outputs().begin(), g_.outputs().end());
    std::map<Value, int> last_read;
    for (int id : order)
      for (const Value& v : g_.node(id).inputs) last_read[v] = std::max(last_read[v], pos.at(id));
    // Reshapes (an output over its input: no copy) after the other packs
    // (gradient buckets), which then keep the values they want.
    std::vector<const Step*> wanting;
    for (bool views : {false, true})
      for (const Step& s : steps_)
        if (s.kernel->wants_packed_inputs() && is_view(g_.node(s.node).op) == views)
          wanting.push_back(&s);
    for (const Step* sp : wanting) {
      const Step& s = *sp;
      const Node& n = g_.node(s.node);
      const bool view = is_view(n.op);
      bool ok = n.outputs.size() == n.inputs.size();
      std::set<Value> mine;
      for (std::size_t i = 0; ok && i < n.inputs.size(); ++i) {
        const Value v = n.inputs[i];
        const std::string& op = g_.node(v.node).op;
        const graph::TensorType& t = g_.type(v);
        const bool fits = view ? t.dtype == n.outputs[i].dtype &&
                                     num_elements(t.shape) == num_elements(n.outputs[i].shape)
                               : t == n.outputs[i];
        ok = op != "input" && op != "constant" && !taken.count(v) &&
             !taken.count(Value{n.id, static_cast<int>(i)}) && mine.insert(v).second &&
             !graph_out.count(v) && last_read[v] == pos.at(s.node) && fits;
      }
      if (!ok) continue;
      graph::Pack p;
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        p.members.push_back(n.inputs[i]);
        p.aliases.push_back(Value{n.id, static_cast<int>(i)});
        taken.insert(n.inputs[i]);
        taken.insert(p.aliases.back());  // in this pack's bytes: no other pack's member
      }
      out.push_back(std::move(p));
    }
    return out;
  }

  // CompileOptions::outputs_bound_later that can live outside the arena:
  // computed by a synchronous node here, in no pack.
  std::set<Value> outside_arena(const std::vector<graph::Pack>& pk) const {
    std::set<Value> in_pack, out;
    for (const graph::Pack& p : pk) {
      in_pack.insert(p.members.begin(), p.members.end());
      in_pack.insert(p.aliases.begin(), p.aliases.end());
    }
    for (int i : opts_.outputs_bound_later) {
      if (i < 0 || i >= static_cast<int>(g_.outputs().size())) continue;
      const Value v = g_.outputs()[static_cast<std::size_t>(i)];
      auto s = step_of_.find(v.node);
      if (s == step_of_.end() || steps_[static_cast<std::size_t>(s->second)].kernel->is_async() ||
          in_pack.count(v))
        continue;
      out.insert(v);
    }
    return out;
  }

  // Value v's storage becomes t wherever the steps and outputs hold it.
  void place(Value v, const Tensor& t) {
    steps_[static_cast<std::size_t>(step_of_.at(v.node))].out[static_cast<std::size_t>(v.index)] =
        t;
    values_[v] = t;
    for (std::size_t k = 0; k < g_.outputs().size(); ++k)
      if (g_.outputs()[k] == v) outputs_[k] = t;
    for (Step& r : steps_) {
      const Node& rn = g_.node(r.node);
      for (std::size_t k = 0; k < rn.inputs.size(); ++k)
        if (rn.inputs[k] == v) r.in[k] = t;
    }
    unbacked_.erase(v);
  }

  static bool overlaps(const Tensor& a, const Tensor& b) {
    if (!a.defined() || !b.defined()) return false;
    auto* pa = static_cast<const std::uint8_t*>(a.raw_data());
    auto* pb = static_cast<const std::uint8_t*>(b.raw_data());
    std::size_t na = static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype());
    std::size_t nb = static_cast<std::size_t>(b.numel()) * dtype_size(b.dtype());
    return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
  }

  // Output `out` (bound by bind_output) shares memory with input node
  // `input`: every other reader of that input must run before the writer,
  // and the writer may read it itself only if its kernel is in_place_safe.
  Status check_in_place(int out, int input, const std::string& name) const {
    const Value v = g_.outputs()[static_cast<std::size_t>(out)];
    const int w = step_of_.at(v.node);
    for (std::size_t si = 0; si < steps_.size(); ++si) {
      const Node& rn = g_.node(steps_[si].node);
      bool reads = false;
      for (const Value& in : rn.inputs) reads = reads || in.node == input;
      if (!reads) continue;
      if (static_cast<int>(si) == w) {
        if (!steps_[si].kernel->in_place_safe())
          return failed_precondition(
              "output {} cannot be written over input '{}': {} reads it and does not work in "
              "place",
              out, name, rn.label());
      } else if (static_cast<int>(si) > w) {
        return failed_precondition(
            "output {} cannot be written over input '{}': {} reads it after {} writes it", out,
            name, rn.label(), g_.node(v.node).label());
      }
    }
    return ok_status();
  }

  CompileOptions opts_;
  Graph g_;
  std::map<int, int> step_of_;   // node id -> index into steps_
  std::set<int> bound_outputs_;  // graph outputs given to bind_output
  int hold_at_ = -1;             // hold_writes: the first held writer's step
  bool held_written_ = false;    // the last run reached it
  std::set<Value> unbacked_;     // planned outside the arena, not yet given storage
  std::vector<Step> steps_;
  std::map<std::string, int> input_ids_;
  std::map<int, std::vector<std::pair<int, int>>> input_uses_;
  std::map<int, std::vector<std::pair<int, int>>> output_of_input_;
  std::set<int> bound_;
  std::map<Value, Tensor> values_;
  std::vector<Tensor> outputs_;
  graph::MemoryPlan plan_;
  std::shared_ptr<Storage> arena_;
  std::vector<bool> pending_;
  bool tracing_ = false;
  std::vector<TraceEvent> trace_;
  std::uint64_t step_ = 0;
};

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Result<std::unique_ptr<Executable>> compile(Graph g, const CompileOptions& o) override {
    return CpuExecutable::create(std::move(g), o);
  }
};

}  // namespace

Result<std::unique_ptr<Backend>> make_backend(const std::string& name) {
  if (name == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
  return invalid_argument("unknown backend '{}' (available: cpu)", name);
}

Result<std::vector<Tensor>> Executor::run(const std::map<std::string, Tensor>& feeds) {
  for (const auto& [name, t] : feeds) SHOAL_RETURN_IF_ERROR(exe_.bind(name, t));
  SHOAL_RETURN_IF_ERROR(exe_.run());
  std::vector<Tensor> out;
  for (int i = 0; i < exe_.num_outputs(); ++i) out.push_back(exe_.output(i).clone());
  return out;
}

std::vector<std::pair<std::string, std::string>> runtime_info() {
  std::vector<std::pair<std::string, std::string>> out;
  out.emplace_back("onednn", cpu::onednn_version());
  out.emplace_back("blas", fmt::format("OpenBLAS ({})", openblas_get_config()));
  out.emplace_back("threads", std::to_string(num_threads()));
  out.emplace_back("cores", std::to_string(num_cores()));
  const std::string isas = cpu::bf16_isas();
  out.emplace_back("bf16", isas.empty() ? "no (needs avx512_bf16 or amx_bf16)" : isas);
  return out;
}

}  // namespace shoal::runtime
