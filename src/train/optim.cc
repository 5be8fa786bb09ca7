#include "shoal/train/optim.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numbers>

#include "shoal/graph/op_registry.h"
#include "shoal/runtime/kernel.h"
#include "shoal/runtime/parallel.h"

namespace shoal::train {
namespace {

using graph::Node;
using graph::OpDef;
using graph::TensorType;
using graph::Value;
using Types = std::vector<TensorType>;

// Inputs: p, g, then scalars, then state tensors shaped like p. Outputs: p
// and each state, same types.
OpDef update_def(const std::string& name, int scalars, int states, std::vector<std::string> attrs) {
  OpDef d;
  d.name = name;
  d.min_inputs = d.max_inputs = 2 + scalars + states;
  d.attrs = std::move(attrs);
  d.infer = [scalars, states, name](const Node&, const Types& in) -> Result<Types> {
    const TensorType& p = in[0];
    if (p.dtype != DType::kF32 && p.dtype != DType::kF64)
      return invalid_argument("{}: parameter must be f32 or f64, got {}", name, p.str());
    for (int i = 1; i < 2 + scalars + states; ++i) {
      bool scalar = i >= 2 && i < 2 + scalars;
      if (in[i].dtype != p.dtype)
        return invalid_argument("{}: input {} is {}, parameter is {}", name, i, in[i].str(),
                                p.str());
      if (scalar ? num_elements(in[i].shape) != 1 : in[i].shape != p.shape)
        return invalid_argument("{}: input {} has shape {}, expected {}", name, i, in[i].str(),
                                scalar ? "a scalar" : p.str());
    }
    return Types(static_cast<std::size_t>(1 + states), p);
  };
  // No grad rule: update ops end the graph and are not differentiable.
  return d;
}

template <typename F>
Status dispatch(DType t, F&& f) {
  if (t == DType::kF32) return f(float{});
  if (t == DType::kF64) return f(double{});
  return internal_error("update kernel called with dtype {}", dtype_name(t));
}

template <typename T>
double sq_norm(const T* x, std::int64_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > runtime::kParallelGrain) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

class SgdKernel final : public runtime::Kernel {
 public:
  explicit SgdKernel(const Node& n)
      : mu_(n.attrs.get_float_or("momentum", 0.0)),
        wd_(n.attrs.get_float_or("weight_decay", 0.0)),
        nesterov_(n.attrs.get_int_or("nesterov", 0) != 0),
        has_buf_(n.inputs.size() == 4) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    return dispatch(in[0].dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* p = in[0].data<T>();
      const T* g = in[1].data<T>();
      const T lr = in[2].data<T>()[0], wd = static_cast<T>(wd_), mu = static_cast<T>(mu_);
      T* po = out[0].data<T>();
      const std::int64_t n = in[0].numel();
      if (!has_buf_) {
        runtime::simd_loop(n, [&](std::int64_t i) { po[i] = p[i] - lr * (g[i] + wd * p[i]); });
        return ok_status();
      }
      const T* buf = in[3].data<T>();
      T* bo = out[1].data<T>();
      const bool nest = nesterov_;
      runtime::simd_loop(n, [&](std::int64_t i) {
        T d = g[i] + wd * p[i];
        T b = mu * buf[i] + d;
        bo[i] = b;
        po[i] = p[i] - lr * (nest ? d + mu * b : b);
      });
      return ok_status();
    });
  }

  bool in_place_safe() const override { return true; }

 private:
  double mu_, wd_;
  bool nesterov_, has_buf_;
};

// LARS: local_lr = eta * |p| / (|g| + wd |p| + eps) (1 where a norm is 0 or
// adaptation is off); buf = mu buf + local_lr (g + wd p); p -= lr buf.
class LarsKernel final : public runtime::Kernel {
 public:
  explicit LarsKernel(const Node& n)
      : mu_(n.attrs.get_float_or("momentum", 0.9)),
        wd_(n.attrs.get_float_or("weight_decay", 0.0)),
        eta_(n.attrs.get_float_or("trust", 0.001)),
        eps_(n.attrs.get_float_or("eps", 1e-9)),
        adapt_(n.attrs.get_int_or("adapt", 1) != 0) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    return dispatch(in[0].dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* p = in[0].data<T>();
      const T* g = in[1].data<T>();
      const T* buf = in[3].data<T>();
      const T lr = in[2].data<T>()[0];
      const std::int64_t n = in[0].numel();
      double local = 1.0, wd = adapt_ ? wd_ : 0.0;
      if (adapt_) {
        double pn = std::sqrt(sq_norm(p, n)), gn = std::sqrt(sq_norm(g, n));
        if (pn > 0 && gn > 0) local = eta_ * pn / (gn + wd * pn + eps_);
      }
      const T tl = static_cast<T>(local), tw = static_cast<T>(wd), mu = static_cast<T>(mu_);
      T* po = out[0].data<T>();
      T* bo = out[1].data<T>();
      runtime::simd_loop(n, [&](std::int64_t i) {
        T b = mu * buf[i] + tl * (g[i] + tw * p[i]);
        bo[i] = b;
        po[i] = p[i] - lr * b;
      });
      return ok_status();
    });
  }

  bool in_place_safe() const override { return true; }

 private:
  double mu_, wd_, eta_, eps_;
  bool adapt_;
};

// Adam / AdamW / LAMB over inputs (p, g, lr, t, m, v).
class AdamKernel final : public runtime::Kernel {
 public:
  explicit AdamKernel(const Node& n)
      : b1_(n.attrs.get_float_or("beta1", 0.9)),
        b2_(n.attrs.get_float_or("beta2", 0.999)),
        eps_(n.attrs.get_float_or("eps", 1e-8)),
        wd_(n.attrs.get_float_or("weight_decay", 0.0)),
        decoupled_(n.attrs.get_int_or("decoupled", 0) != 0),
        lamb_(n.attrs.get_int_or("lamb", 0) != 0),
        adapt_(n.attrs.get_int_or("adapt", 1) != 0) {}
  Status run(const runtime::KernelContext&, std::span<const Tensor> in,
             std::span<Tensor> out) override {
    return dispatch(in[0].dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* p = in[0].data<T>();
      const T* g = in[1].data<T>();
      const T* m = in[4].data<T>();
      const T* v = in[5].data<T>();
      T* po = out[0].data<T>();
      T* mo = out[1].data<T>();
      T* vo = out[2].data<T>();
      const T lr = in[2].data<T>()[0];
      const double t = static_cast<double>(in[3].data<T>()[0]);
      const std::int64_t n = in[0].numel();
      const T b1 = static_cast<T>(b1_), b2 = static_cast<T>(b2_), eps = static_cast<T>(eps_);
      const T c1 = static_cast<T>(1.0 / (1.0 - std::pow(b1_, t)));
      const T c2 = static_cast<T>(1.0 / (1.0 - std::pow(b2_, t)));
      const bool lamb = lamb_;
      const T wd_l2 = static_cast<T>(decoupled_ || lamb ? 0.0 : wd_);
      const T wd_dec = static_cast<T>(lamb && !adapt_ ? 0.0 : (decoupled_ || lamb ? wd_ : 0.0));
      if (!lamb) {
        runtime::simd_loop(n, [&](std::int64_t i) {
          T gi = g[i] + wd_l2 * p[i];
          T mi = b1 * m[i] + (T(1) - b1) * gi;
          T vi = b2 * v[i] + (T(1) - b2) * gi * gi;
          mo[i] = mi;
          vo[i] = vi;
          po[i] = p[i] - lr * (mi * c1 / (std::sqrt(vi * c2) + eps) + wd_dec * p[i]);
        });
        return ok_status();
      }
      // LAMB: r = m_hat / (sqrt(v_hat) + eps) + wd p; p -= lr * (|p| / |r|) * r.
      double rn = 0, pn = 0;
#pragma omp parallel for reduction(+ : rn, pn) if (n > runtime::kParallelGrain) schedule(static)
      for (std::int64_t i = 0; i < n; ++i) {
        T mi = b1 * m[i] + (T(1) - b1) * g[i];
        T vi = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
        mo[i] = mi;
        vo[i] = vi;
        T r = mi * c1 / (std::sqrt(vi * c2) + eps) + wd_dec * p[i];
        rn += static_cast<double>(r) * r;
        pn += static_cast<double>(p[i]) * p[i];
      }
      double trust = 1.0;
      if (adapt_ && pn > 0 && rn > 0) trust = std::sqrt(pn) / std::sqrt(rn);
      const T step = static_cast<T>(trust) * lr;
      runtime::simd_loop(n, [&](std::int64_t i) {
        T r = mo[i] * c1 / (std::sqrt(vo[i] * c2) + eps) + wd_dec * p[i];
        po[i] = p[i] - step * r;
      });
      return ok_status();
    });
  }

  bool in_place_safe() const override { return true; }

 private:
  double b1_, b2_, eps_, wd_;
  bool decoupled_, lamb_, adapt_;
};

template <typename K>
runtime::KernelFactory factory() {
  return [](const Node& n, const Types&) -> Result<std::unique_ptr<runtime::Kernel>> {
    return std::unique_ptr<runtime::Kernel>(std::make_unique<K>(n));
  };
}

}  // namespace

void register_optimizer_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& ops = graph::OpRegistry::global();
    OpDef sgd = update_def("sgd_update", 1, 1, {"momentum", "nesterov", "weight_decay"});
    sgd.min_inputs = 3;  // without a momentum buffer
    sgd.infer = [](const Node& n, const Types& in) -> Result<Types> {
      // Same checks with or without the buffer.
      OpDef d = update_def("sgd_update", 1, static_cast<int>(in.size()) - 3, {});
      return d.infer(n, in);
    };
    ops.add(sgd);
    ops.add(update_def("lars_update", 1, 1, {"momentum", "weight_decay", "trust", "eps", "adapt"}));
    ops.add(update_def("adam_update", 2, 2,
                       {"beta1", "beta2", "eps", "weight_decay", "decoupled", "lamb", "adapt"}));
    auto& k = runtime::KernelRegistry::cpu();
    k.add("sgd_update", factory<SgdKernel>());
    k.add("lars_update", factory<LarsKernel>());
    k.add("adam_update", factory<AdamKernel>());
  });
}

bool is_layerwise(const std::string& name) { return name == "lars" || name == "lamb"; }

Status validate(const OptimizerOptions& o) {
  static const std::vector<std::string> names = {"sgd",   "momentum", "nesterov", "adam",
                                                 "adamw", "lars",     "lamb"};
  if (std::find(names.begin(), names.end(), o.name) == names.end())
    return invalid_argument("optimizer '{}' is not one of {}", o.name, fmt::join(names, ", "));
  if (!(o.momentum >= 0 && o.momentum < 1))
    return invalid_argument("momentum {} must be in [0, 1)", o.momentum);
  if (!(o.weight_decay >= 0))
    return invalid_argument("weight_decay {} must be >= 0", o.weight_decay);
  if (!(o.beta1 >= 0 && o.beta1 < 1))
    return invalid_argument("beta1 {} must be in [0, 1)", o.beta1);
  if (!(o.beta2 >= 0 && o.beta2 < 1))
    return invalid_argument("beta2 {} must be in [0, 1)", o.beta2);
  if (!(o.eps > 0)) return invalid_argument("eps {} must be > 0", o.eps);
  if (!(o.trust > 0)) return invalid_argument("trust {} must be > 0", o.trust);
  return ok_status();
}

Result<OptimizerGraph> append_optimizer(graph::Builder& b, const OptimizerOptions& o,
                                        const std::vector<ParamRef>& params) {
  SHOAL_RETURN_IF_ERROR(validate(o));
  register_optimizer_ops();
  OptimizerGraph og;
  DType dt = params.empty() ? DType::kF32 : b.dtype_of(params[0].param);
  og.lr = b.input("lr", dt, {});
  bool adam = o.name == "adam" || o.name == "adamw" || o.name == "lamb";
  if (adam) og.step = b.input("opt_step", dt, {});
  for (const ParamRef& pr : params) {
    const Shape& s = b.shape(pr.param);
    bool adapt = s.size() > 1;
    auto state = [&](const std::string& slot) {
      std::string name = fmt::format("opt/{}/{}", pr.name, slot);
      Value in = b.input(name, dt, s);
      og.state.push_back({name, in, {}});
      return in;
    };
    std::vector<Value> outs;
    std::string node_name = "update/" + pr.name;
    if (o.name == "sgd") {
      outs = b.op_multi("sgd_update", {pr.param, pr.grad, og.lr},
                        {{"weight_decay", o.weight_decay}}, node_name);
    } else if (o.name == "momentum" || o.name == "nesterov") {
      Value buf = state("momentum");
      outs = b.op_multi("sgd_update", {pr.param, pr.grad, og.lr, buf},
                        {{"momentum", o.momentum},
                         {"weight_decay", o.weight_decay},
                         {"nesterov", std::int64_t{o.name == "nesterov"}}},
                        node_name);
    } else if (o.name == "lars") {
      Value buf = state("momentum");
      outs = b.op_multi("lars_update", {pr.param, pr.grad, og.lr, buf},
                        {{"momentum", o.momentum},
                         {"weight_decay", o.weight_decay},
                         {"trust", o.trust},
                         {"adapt", std::int64_t{adapt}}},
                        node_name);
    } else {
      Value m = state("m");
      Value v = state("v");
      outs = b.op_multi("adam_update", {pr.param, pr.grad, og.lr, og.step, m, v},
                        {{"beta1", o.beta1},
                         {"beta2", o.beta2},
                         {"eps", o.eps},
                         {"weight_decay", o.weight_decay},
                         {"decoupled", std::int64_t{o.name == "adamw"}},
                         {"lamb", std::int64_t{o.name == "lamb"}},
                         {"adapt", std::int64_t{adapt}}},
                        node_name);
    }
    if (!b.ok()) return b.status().with_context(fmt::format("optimizer for '{}'", pr.name));
    og.new_params.push_back(outs[0]);
    std::size_t first = og.state.size() - (outs.size() - 1);
    for (std::size_t i = 1; i < outs.size(); ++i) og.state[first + i - 1].output = outs[i];
  }
  return og;
}

double LrSchedule::at(std::int64_t step) const {
  if (warmup > 0 && step < warmup)
    return base * static_cast<double>(step + 1) / static_cast<double>(warmup);
  std::int64_t s = step - warmup;
  if (kind == "step")
    return base * std::pow(gamma, static_cast<double>(s / std::max<std::int64_t>(step_size, 1)));
  if (kind == "cosine") {
    std::int64_t span = std::max<std::int64_t>(total - warmup, 1);
    double f = std::min(1.0, static_cast<double>(s) / static_cast<double>(span));
    return base * 0.5 * (1.0 + std::cos(std::numbers::pi * f));
  }
  return base;
}

Status validate(const LrSchedule& s) {
  if (s.kind != "constant" && s.kind != "step" && s.kind != "cosine")
    return invalid_argument("lr schedule '{}' is not one of constant, step, cosine", s.kind);
  if (!(s.base > 0)) return invalid_argument("lr {} must be > 0", s.base);
  if (s.warmup < 0) return invalid_argument("warmup {} must be >= 0", s.warmup);
  if (s.kind == "step" && s.step_size < 1)
    return invalid_argument("lr step size {} must be >= 1", s.step_size);
  if (s.kind == "step" && !(s.gamma > 0))
    return invalid_argument("lr gamma {} must be > 0", s.gamma);
  return ok_status();
}

}  // namespace shoal::train
