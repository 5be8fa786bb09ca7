// oneDNN f32 kernels against the f64 reference kernels on the same data:
// forward and both convolution gradients, pooling, matmul and linear with
// fused bias/ReLU, including odd sizes, strides, dilation and groups.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <dnnl.hpp>
#include <tuple>

#include "shoal/graph/builder.h"
#include "shoal/runtime/backend.h"
#include "shoal/runtime/kernel.h"
#include "shoal/tensor/philox.h"

namespace shoal::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::Value;
using Fn = std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>;

// Runs fn in f32 (oneDNN) and f64 (reference) and compares all outputs.
void compare(const std::string& what, const std::vector<Shape>& shapes, const Fn& fn,
             bool fuse = true, std::map<std::string, std::string> expect_impl = {}) {
  SCOPED_TRACE(what);
  PhiloxRng rng(99, 3);
  std::vector<Tensor> data;
  for (const Shape& s : shapes) {
    Tensor t = Tensor::empty(s, DType::kF64);
    rng.fill_normal(t, 0, 1);
    data.push_back(t);
  }
  std::vector<std::vector<Tensor>> results;
  for (DType dt : {DType::kF32, DType::kF64}) {
    Graph g;
    Builder b(g);
    std::vector<Value> xs;
    for (std::size_t i = 0; i < shapes.size(); ++i)
      xs.push_back(b.input("in" + std::to_string(i), dt, shapes[i]));
    for (Value v : fn(b, xs)) g.mark_output(v);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    CompileOptions o;
    o.fuse = fuse;
    auto exe = (*make_backend("cpu"))->compile(g, o);
    ASSERT_TRUE(exe.ok()) << exe.status().to_string();
    if (dt == DType::kF32) {
      for (const auto& [op, impl] : expect_impl) EXPECT_EQ((*exe)->kernel_impls()[op], impl) << op;
    }
    Executor ex(**exe);
    std::map<std::string, Tensor> feeds;
    for (std::size_t i = 0; i < shapes.size(); ++i)
      feeds["in" + std::to_string(i)] = data[i].cast(dt);
    auto out = ex.run(feeds);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    results.push_back(*out);
  }
  for (std::size_t k = 0; k < results[0].size(); ++k) {
    const Tensor& a = results[0][k];
    const Tensor& r = results[1][k];
    ASSERT_EQ(a.shape(), r.shape());
    double scale = 1e-30;
    for (std::int64_t i = 0; i < r.numel(); ++i) scale = std::max(scale, std::abs(r.get(i)));
    for (std::int64_t i = 0; i < r.numel(); ++i)
      ASSERT_NEAR(a.get(i), r.get(i), 1e-4 * scale + 1e-5)
          << what << " output " << k << " element " << i;
  }
}

TEST(OneDnn, Matmul) {
  compare("2d", {{33, 17}, {17, 9}},
          [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1])}; }, true,
          {{"matmul", "onednn"}});
  compare("transposed", {{17, 33}, {9, 17}},
          [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1], true, true)}; });
  compare("batched", {{3, 5, 7}, {3, 7, 2}},
          [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1])}; });
  compare("broadcast batch (reference path)", {{2, 1, 5, 7}, {3, 7, 2}},
          [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1])}; });
}

// On more than one thread a weight gradient's long shared dimension, or a
// batched matmul's first batch dimension, is cut into one piece per thread
// (onednn_matmul.cc). Cuts that do not divide evenly, at 2 and 3 threads.
TEST(OneDnn, MatmulCutAcrossThreads) {
  const int before = omp_get_max_threads();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    const std::string at = " at " + std::to_string(threads) + " threads";
    compare("A^T B, 1031 rows" + at, {{1031, 7}, {1031, 5}},
            [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1], true)}; }, true,
            {{"matmul", "onednn:split-k"}});
    compare("batched, 5 of them" + at, {{5, 2, 6, 4}, {5, 2, 4, 3}},
            [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1])}; }, true,
            {{"matmul", "onednn:split-batch"}});
    compare(
        "batched, B transposed" + at, {{4, 3, 5, 7}, {4, 3, 9, 7}},
        [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1], false, true)}; },
        true, {{"matmul", "onednn:split-batch"}});
    compare("A^T B^T: not cut" + at, {{1031, 7}, {5, 1031}},
            [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1], true, true)}; },
            true, {{"matmul", "onednn"}});
  }
  omp_set_num_threads(1);
  compare("one thread: not cut", {{1031, 7}, {1031, 5}},
          [](Builder& b, auto x) { return std::vector<Value>{b.matmul(x[0], x[1], true)}; }, true,
          {{"matmul", "onednn"}});
  omp_set_num_threads(before);
}

TEST(OneDnn, LinearWithFusedBiasAndRelu) {
  compare("linear", {{31, 13}, {11, 13}, {11}},
          [](Builder& b, auto x) { return std::vector<Value>{b.relu(b.linear(x[0], x[1], x[2]))}; },
          true, {{"linear", "onednn"}, {"relu", ""}});  // relu fused into linear's post-op
  compare("linear no bias", {{1, 3}, {5, 3}},
          [](Builder& b, auto x) { return std::vector<Value>{b.linear(x[0], x[1])}; });
}

TEST(OneDnn, ConvForwardAndGradients) {
  struct C {
    Shape x, w;
    std::vector<std::int64_t> st, pd, dl;
    std::int64_t groups;
  };
  for (C c : {C{{4, 3, 13, 11}, {8, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
              C{{2, 8, 9, 9}, {16, 8, 5, 5}, {2, 2}, {2, 2}, {1, 1}, 1},
              C{{2, 6, 10, 7}, {9, 2, 3, 3}, {1, 2}, {1, 0}, {2, 1}, 3},
              C{{3, 1, 28, 28}, {32, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
              // 1x1 maps: matmuls with the one tap that reads the input
              // (conv_point.cc); channels of 16 take the blocked layout.
              C{{8, 32, 1, 1}, {48, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
              C{{5, 7, 1, 1}, {3, 7, 5, 3}, {2, 1}, {2, 1}, {1, 1}, 1},
              C{{4, 6, 1, 1}, {5, 6, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1}}) {
    Shape ys = {c.x[0], c.w[0], 0, 0};
    compare(
        "conv " + shape_str(c.x) + shape_str(c.w), {c.x, c.w, {c.w[0]}},
        [&](Builder& b, auto x) {
          Value y = b.relu(b.conv2d(x[0], x[1], x[2], c.st, c.pd, c.dl, c.groups));
          graph::Attrs a{
              {"stride", c.st}, {"padding", c.pd}, {"dilation", c.dl}, {"groups", c.groups}};
          Value dy = b.mul(y, y);  // any tensor of y's shape
          graph::Attrs ai = a, aw = a;
          ai.set("input_shape", c.x);
          aw.set("weight_shape", c.w);
          return std::vector<Value>{y, b.op("conv2d_grad_input", {dy, x[1]}, ai),
                                    b.op("conv2d_grad_weight", {x[0], dy}, aw)};
        },
        true,
        {{"conv2d", "onednn"}, {"conv2d_grad_input", "onednn"}, {"conv2d_grad_weight", "onednn"}});
  }
}

// A convolution whose stride is its kernel, of fewer than 16 channels in
// or out (an imported 3-D transposed convolution's 2x2/2 to 6 channels):
// its input gradient runs as direct loops (conv_patch.cc), rows and
// columns no patch reaches left zero; with 16 both ways, or 1x1 (a matmul),
// oneDNN's.
TEST(OneDnn, InputGradientOfAStrideOfItsKernelIsDirectForFewChannels) {
  struct C {
    Shape x, w;
    std::string impl;
  };
  for (const C& c :
       {C{{3, 6, 9, 11}, {5, 6, 2, 3}, "patch"}, C{{2, 3, 8, 6}, {8, 3, 2, 2}, "patch"},
        C{{2, 16, 4, 4}, {16, 16, 2, 2}, "onednn"}, C{{2, 24, 5, 5}, {8, 24, 1, 1}, "onednn"}}) {
    const std::vector<std::int64_t> st = {c.w[2], c.w[3]}, zero = {0, 0}, one = {1, 1};
    compare("stride of the kernel " + shape_str(c.x) + shape_str(c.w), {c.x, c.w},
            [&](Builder& b, auto x) {
              Value y = b.conv2d(x[0], x[1], {}, st, zero, one, 1);
              graph::Attrs a{{"stride", st}, {"padding", zero}, {"dilation", one}, {"groups", 1}};
              a.set("input_shape", c.x);
              return std::vector<Value>{y, b.op("conv2d_grad_input", {b.mul(y, y), x[1]}, a)};
            },
            true, {{"conv2d", "onednn"}, {"conv2d_grad_input", c.impl}});
  }
}

// A depthwise convolution (ReLU, bias), its input and weight gradients
// against the f64 reference, each pass run by the kernel named `impl`.
void compare_depthwise(const Shape& x, std::int64_t k, std::int64_t st, std::int64_t pd,
                       std::int64_t dl, const std::string& impl) {
  const std::int64_t ch = x[1];
  Shape w = {ch, 1, k, k};
  std::vector<std::int64_t> stv = {st, st}, pdv = {pd, pd}, dlv = {dl, dl};
  compare("depthwise " + shape_str(x) + shape_str(w), {x, w, {ch}},
          [&](Builder& b, auto v) {
            Value y = b.relu(b.conv2d(v[0], v[1], v[2], stv, pdv, dlv, ch));
            graph::Attrs a{{"stride", stv}, {"padding", pdv}, {"dilation", dlv}, {"groups", ch}};
            Value dy = b.mul(y, y);
            graph::Attrs ai = a, aw = a;
            ai.set("input_shape", x);
            aw.set("weight_shape", w);
            return std::vector<Value>{y, b.op("conv2d_grad_input", {dy, v[1]}, ai),
                                      b.op("conv2d_grad_weight", {v[0], dy}, aw)};
          },
          true, {{"conv2d", impl}, {"conv2d_grad_input", impl}, {"conv2d_grad_weight", impl}});
}

// Depthwise convolutions over small maps where oneDNN's JIT depthwise kernels
// decline (padding past the input: mnasnet's 5x5 stages over 2x2 and 4x4
// maps) run as direct loops (conv_depthwise.cc), in both layouts (32 and 16
// channels take the blocked one).
TEST(OneDnn, DepthwiseConvOverSmallMapsIsDirect) {
  // Where oneDNN has a JIT depthwise kernel for a pass it keeps it (which
  // shapes depends on the ISA); the direct loops are checked on all of them.
  ASSERT_EQ(setenv("SHOAL_DEPTHWISE", "direct", 1), 0);
  struct C {
    Shape x;
    std::int64_t k, st, pd, dl;
  };
  for (C c :
       {C{{8, 32, 2, 2}, 5, 1, 2, 1}, C{{8, 32, 2, 2}, 5, 2, 2, 1}, C{{3, 6, 4, 4}, 3, 1, 1, 1},
        C{{3, 16, 4, 3}, 3, 2, 2, 2}, C{{2, 5, 7, 6}, 3, 1, 0, 1}, C{{64, 288, 2, 2}, 5, 2, 2, 1},
        C{{5, 40, 4, 4}, 5, 1, 2, 1}, C{{4, 24, 8, 8}, 5, 2, 2, 1}})
    compare_depthwise(c.x, c.k, c.st, c.pd, c.dl, "depthwise-small");
  unsetenv("SHOAL_DEPTHWISE");
}

// Depthwise convolutions over 1x1 maps (mobilenet_v3_small's last 5x5
// stages): a per-channel scale by the one tap that reads the input
// (conv_point.cc), against the f64 reference; 32 channels take the blocked
// layout, 6 do not; with a stride.
TEST(OneDnn, DepthwiseConvOverOneByOneMapsIsAChannelScale) {
  compare_depthwise({8, 32, 1, 1}, 5, 1, 2, 1, "depthwise-point");
  compare_depthwise({5, 6, 1, 1}, 3, 2, 1, 1, "depthwise-point");
}

TEST(OneDnn, Pooling) {
  compare("max", {{2, 3, 9, 8}},
          [](Builder& b, auto x) {
            return std::vector<Value>{b.max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1})};
          },
          true, {{"max_pool2d", "onednn"}});
  compare("max uneven", {{2, 3, 5, 5}}, [](Builder& b, auto x) {
    return std::vector<Value>{b.max_pool2d(x[0], {2, 2}, {2, 2})};
  });
  // The plain layout's gradient searches 16 outputs of a row at once: rows
  // of 20 and 37 outputs (a full block and a partial one), overlapping
  // windows.
  compare("max wide", {{2, 3, 9, 40}}, [](Builder& b, auto x) {
    return std::vector<Value>{b.max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1})};
  });
  compare("max overlapping", {{2, 2, 7, 37}}, [](Builder& b, auto x) {
    return std::vector<Value>{b.max_pool2d(x[0], {3, 2}, {1, 1}, {1, 1})};
  });
}

// Max pooling's gradient where windows tie (inputs of three values): the
// first maximum in scan order takes the gradient, in the f32 kernel (16
// outputs at once) as in the f64 reference.
TEST(OneDnn, MaxPoolingGradientGoesToTheFirstOfTiedMaxima) {
  PhiloxRng rng(3, 1);
  Tensor x = Tensor::empty({2, 3, 8, 41}, DType::kF64),
         dy = Tensor::empty({2, 3, 8, 41}, DType::kF64);
  rng.fill_normal(x, 0, 1);
  rng.fill_normal(dy, 0, 1);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.set(i, std::floor(std::abs(x.get(i)) * 1.5));
  auto grad = [&](DType t) {
    Graph g;
    Builder b(g);
    Value xv = b.input("x", t, x.shape()), dv = b.input("dy", t, dy.shape());
    g.mark_output(b.op("max_pool2d_grad", {xv, dv},
                       {{"kernel", std::vector<std::int64_t>{3, 3}},
                        {"stride", std::vector<std::int64_t>{1, 1}},
                        {"padding", std::vector<std::int64_t>{1, 1}}}));
    auto exe = (*make_backend("cpu"))->compile(std::move(g), {});
    EXPECT_TRUE(exe.ok()) << exe.status().to_string();
    EXPECT_TRUE((*exe)->bind("x", x.cast(t)).ok());
    EXPECT_TRUE((*exe)->bind("dy", dy.cast(t)).ok());
    EXPECT_TRUE((*exe)->run().ok());
    return (*exe)->output(0).cast(DType::kF64);
  };
  const Tensor want = grad(DType::kF64), got = grad(DType::kF32);
  for (std::int64_t i = 0; i < want.numel(); ++i)
    ASSERT_NEAR(got.get(i), want.get(i), 1e-5) << "element " << i;
  compare("avg", {{2, 3, 9, 8}}, [](Builder& b, auto x) {
    return std::vector<Value>{b.avg_pool2d(x[0], {3, 2}, {2, 1}, {1, 1})};
  });
}

// A oneDNN primitive executed without its destination makes oneDNN's C++
// API throw dnnl::error; the executor's kernel boundary must turn that into
// a Status that names the node, not let the exception escape Executable::run.
class ThrowingEltwise final : public Kernel {
 public:
  explicit ThrowingEltwise(const Shape& s) {
    dnnl::engine e(dnnl::engine::kind::cpu, 0);
    dnnl::memory::desc md(dnnl::memory::dims(s.begin(), s.end()), dnnl::memory::data_type::f32,
                          dnnl::memory::format_tag::ab);
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_relu,
                                  md);
    pd_ = dnnl::eltwise_forward::primitive_desc(d, e);
    prim_ = dnnl::eltwise_forward(pd_);
    src_ = dnnl::memory(md, e);
  }
  Status run(const KernelContext&, std::span<const Tensor>, std::span<Tensor>) override {
    dnnl::stream s(pd_.get_engine());
    prim_.execute(s, {{DNNL_ARG_SRC, src_}});  // no DNNL_ARG_DST: oneDNN refuses
    return ok_status();
  }
  const char* impl() const override { return "onednn"; }

 private:
  dnnl::eltwise_forward::primitive_desc pd_;
  dnnl::eltwise_forward prim_;
  dnnl::memory src_;
};

TEST(OneDnn, AFailingPrimitiveIsAStatusNamingTheNodeNotAnException) {
  KernelRegistry& reg = KernelRegistry::cpu();
  const KernelFactory saved = *reg.find("relu");
  reg.add("relu",
          [](const graph::Node&,
             const std::vector<graph::TensorType>& in) -> Result<std::unique_ptr<Kernel>> {
            return std::unique_ptr<Kernel>(std::make_unique<ThrowingEltwise>(in[0].shape));
          });
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF32, {3, 5});
  g.mark_output(b.op("relu", {x}, {}, "act"));
  CompileOptions o;
  o.fuse = false;
  auto exe = (*make_backend("cpu"))->compile(g, o);
  reg.add("relu", saved);
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  Executor ex(**exe);
  Result<std::vector<Tensor>> out = Status();
  EXPECT_NO_THROW(out = ex.run({{"x", Tensor::empty({3, 5}, DType::kF32)}}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("'act' (relu)"), std::string::npos)
      << out.status().to_string();
  EXPECT_NE(out.status().message().find("onednn kernel threw"), std::string::npos)
      << out.status().to_string();
}

}  // namespace
}  // namespace shoal::runtime
