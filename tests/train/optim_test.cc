#include "shoal/train/optim.h"

#include <gtest/gtest.h>

#include <cmath>

#include "shoal/runtime/backend.h"
#include "shoal/tensor/philox.h"

namespace shoal::train {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;

// Reference in double, written from the papers / PyTorch's documented
// update rules, one parameter, element by element.
struct Ref {
  OptimizerOptions o;
  bool adapt;
  std::vector<double> p, s1, s2;
  void step(const std::vector<double>& g, double lr, int t) {
    std::size_t n = p.size();
    if (s1.empty()) s1.assign(n, 0), s2.assign(n, 0);
    double wd = o.weight_decay;
    auto norm = [](const std::vector<double>& x) {
      double s = 0;
      for (double v : x) s += v * v;
      return std::sqrt(s);
    };
    if (o.name == "sgd") {
      for (std::size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    } else if (o.name == "momentum" || o.name == "nesterov") {
      for (std::size_t i = 0; i < n; ++i) {
        double d = g[i] + wd * p[i];
        s1[i] = o.momentum * s1[i] + d;
        p[i] -= lr * (o.name == "nesterov" ? d + o.momentum * s1[i] : s1[i]);
      }
    } else if (o.name == "lars") {
      double w = adapt ? wd : 0, local = 1;
      double pn = norm(p), gn = norm(g);
      if (adapt && pn > 0 && gn > 0) local = o.trust * pn / (gn + w * pn + 1e-9);
      for (std::size_t i = 0; i < n; ++i) {
        s1[i] = o.momentum * s1[i] + local * (g[i] + w * p[i]);
        p[i] -= lr * s1[i];
      }
    } else {
      bool lamb = o.name == "lamb", dec = o.name == "adamw";
      std::vector<double> r(n);
      for (std::size_t i = 0; i < n; ++i) {
        double gi = g[i] + (lamb || dec ? 0 : wd * p[i]);
        s1[i] = o.beta1 * s1[i] + (1 - o.beta1) * gi;
        s2[i] = o.beta2 * s2[i] + (1 - o.beta2) * gi * gi;
        double mh = s1[i] / (1 - std::pow(o.beta1, t)), vh = s2[i] / (1 - std::pow(o.beta2, t));
        r[i] = mh / (std::sqrt(vh) + o.eps) + ((dec || (lamb && adapt)) ? wd * p[i] : 0.0);
      }
      double trust = 1;
      if (lamb && adapt && norm(p) > 0 && norm(r) > 0) trust = norm(p) / norm(r);
      for (std::size_t i = 0; i < n; ++i) p[i] -= lr * trust * r[i];
    }
  }
};

// in_place: the new parameter and state are written over the bound old
// ones (Executable::bind_output), as the trainer does.
void check(const std::string& name, const Shape& shape, bool in_place = false) {
  Graph g;
  Builder b(g);
  Value p = b.input("p", DType::kF32, shape);
  Value gr = b.input("g", DType::kF32, shape);
  OptimizerOptions o;
  o.name = name;
  o.weight_decay = 0.01;
  o.trust = 0.02;
  auto og = append_optimizer(b, o, {{"w", p, gr}});
  ASSERT_TRUE(og.ok()) << og.status().to_string();
  g.mark_output(og->new_params[0]);
  for (auto& s : og->state) g.mark_output(s.output);
  auto be = runtime::make_backend("cpu");
  auto exe = (*be)->compile(g, {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  runtime::Executor ex(**exe);

  std::int64_t n = num_elements(shape);
  Tensor pt = Tensor::empty(shape, DType::kF32);
  PhiloxRng rng(7, 1);
  rng.fill_normal(pt, 0, 1);
  Ref ref{o, shape.size() > 1, {}, {}, {}};
  for (std::int64_t i = 0; i < n; ++i) ref.p.push_back(pt.data<float>()[i]);
  std::map<std::string, Tensor> feeds{{"p", pt}};
  for (auto& s : og->state) feeds[s.name] = Tensor::zeros(shape, DType::kF32);
  if (in_place) {
    for (auto& [k, v] : feeds) ASSERT_TRUE((*exe)->bind(k, v).ok());
    Status st = (*exe)->bind_output(0, pt);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (std::size_t k = 0; k < og->state.size(); ++k) {
      st = (*exe)->bind_output(static_cast<int>(k + 1), feeds[og->state[k].name]);
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  }
  for (int t = 1; t <= 4; ++t) {
    Tensor gt = Tensor::empty(shape, DType::kF32);
    rng.fill_normal(gt, 0.1, 1);
    double lr = 0.05 * t;
    if (in_place) {
      std::vector<double> gd;
      for (std::int64_t i = 0; i < n; ++i) gd.push_back(gt.data<float>()[i]);
      ref.step(gd, static_cast<float>(lr), t);
      ASSERT_TRUE((*exe)->bind("g", gt).ok());
      ASSERT_TRUE((*exe)->bind("lr", Tensor::scalar(lr)).ok());
      if (og->step.valid()) {
        ASSERT_TRUE((*exe)->bind("opt_step", Tensor::scalar(t)).ok());
      }
      ASSERT_TRUE((*exe)->run().ok());
      ASSERT_EQ((*exe)->output(0).raw_data(), pt.raw_data());
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(pt.data<float>()[i], ref.p[static_cast<std::size_t>(i)],
                    2e-5 * (1 + std::abs(ref.p[static_cast<std::size_t>(i)])))
            << name << " in place, step " << t << " element " << i;
      continue;
    }
    feeds["g"] = gt;
    feeds["lr"] = Tensor::scalar(lr);
    if (og->step.valid()) feeds["opt_step"] = Tensor::scalar(t);
    std::vector<double> gd;
    for (std::int64_t i = 0; i < n; ++i) gd.push_back(gt.data<float>()[i]);
    ref.step(gd, static_cast<float>(lr), t);
    auto out = ex.run(feeds);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    feeds["p"] = (*out)[0];
    for (std::size_t k = 0; k < og->state.size(); ++k) feeds[og->state[k].name] = (*out)[k + 1];
    for (std::int64_t i = 0; i < n; ++i)
      ASSERT_NEAR((*out)[0].data<float>()[i], ref.p[static_cast<std::size_t>(i)],
                  2e-5 * (1 + std::abs(ref.p[static_cast<std::size_t>(i)])))
          << name << " step " << t << " element " << i;
  }
}

TEST(Optimizers, MatchReferenceOnMatrixAndVector) {
  for (const char* name : {"sgd", "momentum", "nesterov", "lars", "adam", "adamw", "lamb"}) {
    SCOPED_TRACE(name);
    check(name, {7, 13});
    check(name, {5});         // 1-D: no trust ratio / decay for lars and lamb
    check(name, {300, 301});  // large enough for the OpenMP path
  }
}

TEST(Optimizers, UpdateInPlaceOverBoundParameters) {
  for (const char* name : {"sgd", "momentum", "nesterov", "lars", "adam", "adamw", "lamb"}) {
    SCOPED_TRACE(name);
    check(name, {7, 13}, true);
    check(name, {300, 301}, true);
  }
}

TEST(Optimizers, BadOptionsAreNamed) {
  OptimizerOptions o;
  o.name = "adagrad";
  EXPECT_NE(validate(o).message().find("adagrad"), std::string::npos);
  o.name = "momentum";
  o.momentum = 1.5;
  EXPECT_NE(validate(o).message().find("momentum"), std::string::npos);
}

TEST(LrSchedule, WarmupStepCosine) {
  LrSchedule s;
  s.base = 1.0;
  s.warmup = 4;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(100), 1.0);
  s.kind = "step";
  s.step_size = 10;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(s.at(4 + 9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4 + 10), 0.5);
  EXPECT_DOUBLE_EQ(s.at(4 + 25), 0.25);
  s.kind = "cosine";
  s.total = 104;
  EXPECT_NEAR(s.at(4 + 50), 0.5, 1e-12);
  EXPECT_NEAR(s.at(104), 0.0, 1e-12);
  s.kind = "linear-ish";
  EXPECT_FALSE(validate(s).ok());
}

}  // namespace
}  // namespace shoal::train
