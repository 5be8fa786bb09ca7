// Gradient check for every op: autodiff against central finite differences
// in f64, on shapes with odd sizes and size-1 dimensions. The loss is
// sum(op(x) * r) with a random r, so every output element matters.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "shoal/graph/builder.h"
#include "shoal/graph/op_registry.h"
#include "shoal/graph/passes.h"
#include "shoal/runtime/backend.h"
#include "shoal/tensor/philox.h"

namespace shoal::graph {
namespace {

enum class Init { kNormal, kPositive, kAwayFromZero, kLabels };

struct In {
  Shape shape;
  DType dtype = DType::kF64;
  Init init = Init::kNormal;
  std::int64_t label_max = 0;  // for kLabels
  bool grad = true;            // false: a buffer (batch norm running stats)
};

using OpFn = std::function<Value(Builder&, const std::vector<Value>&)>;

constexpr std::uint64_t kSeed = 20261123;

// Returns the worst |analytic - numeric| / (1 + |numeric|) over sampled elements.
void gradcheck(const std::string& what, const std::vector<In>& ins, const OpFn& fn,
               double tol = 1e-5, double eps = 1e-6) {
  SCOPED_TRACE(what + " (seed " + std::to_string(kSeed) + ")");
  Graph g;
  Builder b(g);
  std::vector<Value> xs, wrt;
  std::vector<int> wrt_idx;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    xs.push_back(b.input("in" + std::to_string(i), ins[i].dtype, ins[i].shape));
    if (is_floating(ins[i].dtype) && ins[i].init != Init::kLabels && ins[i].grad) {
      wrt.push_back(xs.back());
      wrt_idx.push_back(static_cast<int>(i));
    }
  }
  Value y = fn(b, xs);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  PhiloxRng rng(kSeed, 7);
  Tensor r = Tensor::empty(b.shape(y), b.type(y).dtype);
  rng.fill_normal(r, 0, 1);
  Value loss = b.reduce_sum(b.mul(y, b.constant(r)), {});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto grads = autodiff(g, loss, wrt);
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  g.mark_output(loss);
  for (Value v : *grads) g.mark_output(v);
  ASSERT_TRUE(verify(g).ok()) << verify(g).to_string();
  auto backend = runtime::make_backend("cpu");
  runtime::CompileOptions opts;
  opts.fuse = false;
  auto exe = (*backend)->compile(g, opts);
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();

  std::vector<Tensor> feeds;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    Tensor t = Tensor::empty(ins[i].shape, ins[i].dtype);
    if (ins[i].init == Init::kLabels) {
      for (std::int64_t k = 0; k < t.numel(); ++k)
        t.set(k, static_cast<double>(rng.next_block()[0] %
                                     static_cast<std::uint32_t>(ins[i].label_max)));
    } else {
      rng.fill_normal(t, 0, 1);
      for (std::int64_t k = 0; k < t.numel(); ++k) {
        double v = t.get(k);
        if (ins[i].init == Init::kPositive) t.set(k, 0.5 + std::abs(v));
        if (ins[i].init == Init::kAwayFromZero) t.set(k, v >= 0 ? v + 0.2 : v - 0.2);
      }
    }
    feeds.push_back(t);
    ASSERT_TRUE((*exe)->bind("in" + std::to_string(i), t).ok());
  }
  auto run_loss = [&]() {
    (*exe)->set_step(0);
    Status st = (*exe)->run();
    EXPECT_TRUE(st.ok()) << st.to_string();
    return (*exe)->output(0).get(0);
  };
  run_loss();
  std::vector<Tensor> analytic;
  for (std::size_t k = 0; k < wrt.size(); ++k)
    analytic.push_back((*exe)->output(static_cast<int>(k) + 1).clone());
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    Tensor& x = feeds[static_cast<std::size_t>(wrt_idx[k])];
    std::int64_t n = x.numel();
    std::int64_t stride = std::max<std::int64_t>(1, n / 48);  // sample at most ~48 elements
    for (std::int64_t e = 0; e < n; e += stride) {
      double orig = x.get(e);
      x.set(e, orig + eps);
      double lp = run_loss();
      x.set(e, orig - eps);
      double lm = run_loss();
      x.set(e, orig);
      double num = (lp - lm) / (2 * eps);
      double ana = analytic[k].get(e);
      ASSERT_NEAR(ana, num, tol * (1 + std::abs(num)))
          << what << ": input " << wrt_idx[k] << " element " << e << " of " << shape_str(x.shape());
    }
  }
}

Shape rnd_shape(PhiloxRng& rng, int rank) {
  static const std::int64_t dims[] = {1, 2, 3, 5, 7};
  Shape s;
  for (int i = 0; i < rank; ++i) s.push_back(dims[rng.next_block()[0] % 5]);
  return s;
}

TEST(GradCheck, UnaryOps) {
  struct U {
    const char* op;
    Init init;
  };
  PhiloxRng rng(kSeed, 1);
  for (U u :
       {U{"neg", Init::kNormal}, U{"exp", Init::kNormal}, U{"log", Init::kPositive},
        U{"sqrt", Init::kPositive}, U{"rsqrt", Init::kPositive}, U{"abs", Init::kAwayFromZero},
        U{"relu", Init::kAwayFromZero}, U{"gelu", Init::kNormal}, U{"tanh", Init::kNormal},
        U{"sigmoid", Init::kNormal}, U{"erf", Init::kNormal}}) {
    for (int rank : {0, 1, 3}) {
      Shape s = rnd_shape(rng, rank);
      gradcheck(std::string(u.op) + shape_str(s), {{s, DType::kF64, u.init}},
                [&](Builder& b, const std::vector<Value>& x) { return b.op(u.op, {x[0]}); });
    }
  }
}

TEST(GradCheck, BinaryOpsWithBroadcasting) {
  std::vector<std::pair<Shape, Shape>> shapes = {{{3, 5}, {3, 5}}, {{3, 5}, {5}},
                                                 {{1, 5}, {3, 1}}, {{2, 3, 7}, {}},
                                                 {{}, {2, 1, 3}},  {{4, 1, 3}, {1, 2, 1}}};
  for (const char* op : {"add", "sub", "mul", "div", "pow"}) {
    for (const auto& [sa, sb] : shapes) {
      Init ia = std::string(op) == "pow" ? Init::kPositive : Init::kNormal;
      Init ib = std::string(op) == "div" ? Init::kAwayFromZero : Init::kNormal;
      gradcheck(std::string(op) + shape_str(sa) + shape_str(sb),
                {{sa, DType::kF64, ia}, {sb, DType::kF64, ib}},
                [&](Builder& b, const std::vector<Value>& x) {
                  return b.op(op, {x[0], x[1]});
                });
    }
  }
}

TEST(GradCheck, Where) {
  gradcheck("where", {{{3, 4}, DType::kF64}, {{3, 4}}, {{4}}},
            [](Builder& b, const std::vector<Value>& x) {
              Value cond = b.op("step", {x[0]});  // data-dependent but piecewise constant
              return b.where(cond, x[1], x[2]);
            });
}

TEST(GradCheck, Cast) {
  gradcheck(
      "cast f64->f32->f64", {{{3, 5}}},
      [](Builder& b, const std::vector<Value>& x) {
        return b.cast(b.cast(x[0], DType::kF32), DType::kF64);
      },
      2e-3, 1e-2);
}

TEST(GradCheck, Matmul) {
  struct M {
    Shape a, b;
    bool ta, tb;
  };
  for (M m : {M{{3, 5}, {5, 7}, false, false}, M{{5, 3}, {5, 7}, true, false},
              M{{3, 5}, {7, 5}, false, true}, M{{5, 3}, {7, 5}, true, true},
              M{{2, 3, 5}, {2, 5, 1}, false, false}, M{{2, 1, 3, 5}, {3, 5, 2}, false, false},
              M{{1, 4}, {4, 1}, false, false}}) {
    gradcheck("matmul " + shape_str(m.a) + shape_str(m.b) + (m.ta ? "T" : "") + (m.tb ? "T" : ""),
              {{m.a}, {m.b}}, [&](Builder& b, const std::vector<Value>& x) {
                return b.matmul(x[0], x[1], m.ta, m.tb);
              });
  }
}

TEST(GradCheck, Linear) {
  gradcheck("linear+bias", {{{5, 3}}, {{7, 3}}, {{7}}},
            [](Builder& b, const std::vector<Value>& x) { return b.linear(x[0], x[1], x[2]); });
  gradcheck("linear no bias", {{{1, 4}}, {{1, 4}}},
            [](Builder& b, const std::vector<Value>& x) { return b.linear(x[0], x[1]); });
  gradcheck("linear fused relu", {{{5, 3}}, {{7, 3}}, {{7}, DType::kF64, Init::kAwayFromZero}},
            [](Builder& b, const std::vector<Value>& x) {
              return b.op("linear", {x[0], x[1], x[2]}, {{"activation", std::string("relu")}});
            });
}

TEST(GradCheck, Conv2d) {
  struct C {
    Shape x, w;
    std::vector<std::int64_t> stride, pad, dil;
    std::int64_t groups;
    bool bias;
  };
  for (C c : {C{{2, 3, 5, 5}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
              C{{1, 2, 7, 6}, {3, 2, 3, 2}, {2, 1}, {0, 1}, {1, 1}, 1, false},
              C{{2, 4, 6, 5}, {6, 2, 3, 3}, {1, 2}, {2, 1}, {2, 1}, 2, true},
              C{{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true}}) {
    std::vector<In> ins = {{c.x}, {c.w}};
    if (c.bias) ins.push_back({{c.w[0]}});
    gradcheck("conv2d " + shape_str(c.x) + shape_str(c.w), ins,
              [&](Builder& b, const std::vector<Value>& x) {
                return b.conv2d(x[0], x[1], c.bias ? x[2] : Value{}, c.stride, c.pad, c.dil,
                                c.groups);
              });
  }
}

// conv2d_grad_input as the transposed convolution: odd sizes, strides with
// output padding, dilation, groups, with and without bias.
TEST(GradCheck, ConvTranspose2d) {
  struct C {
    Shape x, w;
    std::vector<std::int64_t> stride, pad, out_pad, dil;
    std::int64_t groups;
    bool bias;
  };
  for (C c : {C{{2, 3, 4, 5}, {3, 2, 3, 3}, {1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true},
              C{{1, 2, 3, 3}, {2, 3, 3, 2}, {2, 2}, {1, 0}, {1, 1}, {1, 1}, 1, false},
              C{{2, 4, 3, 4}, {4, 1, 2, 3}, {2, 1}, {0, 1}, {0, 0}, {2, 1}, 2, true},
              C{{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1}, {0, 0}, {0, 0}, {1, 1}, 1, true}}) {
    std::vector<In> ins = {{c.x}, {c.w}};
    if (c.bias) ins.push_back({{c.w[1] * c.groups}});
    gradcheck("conv_transpose2d " + shape_str(c.x) + shape_str(c.w), ins,
              [&](Builder& b, const std::vector<Value>& x) {
                return b.conv_transpose2d(x[0], x[1], c.bias ? x[2] : Value{}, c.stride, c.pad,
                                          c.out_pad, c.dil, c.groups);
              });
  }
}

TEST(GradCheck, Pooling) {
  gradcheck("max_pool2d", {{{2, 3, 5, 6}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.max_pool2d(x[0], {2, 3}, {2, 2}, {1, 1});
  });
  // Non-overlapping windows take the scatter fast path; 5x7 leaves an
  // uncovered edge that must get zero gradient.
  gradcheck("max_pool2d 2x2/2", {{{2, 3, 5, 7}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.max_pool2d(x[0], {2, 2}, {2, 2});
  });
  gradcheck("max_pool2d overlap", {{{1, 2, 7, 7}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.max_pool2d(x[0], {3, 3}, {1, 2});
  });
  gradcheck("avg_pool2d", {{{2, 3, 5, 6}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.avg_pool2d(x[0], {2, 3}, {2, 2}, {1, 1});
  });
  gradcheck("avg_pool2d 1x1", {{{1, 1, 3, 1}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.avg_pool2d(x[0], {1, 1}, {1, 1});
  });
  gradcheck("global_avg_pool", {{{2, 3, 5, 1}}},
            [](Builder& b, const std::vector<Value>& x) { return b.global_avg_pool(x[0]); });
}

// relu: with the ReLU after it fused (fuse_activations sets the attribute
// on the step graph; built with it here, its gradient rule runs).
TEST(GradCheck, BatchNorm) {
  for (bool training : {true, false}) {
    for (bool relu : {false, true}) {
      for (Shape s : {Shape{4, 3, 5, 2}, Shape{7, 5}}) {
        gradcheck(std::string("batch_norm ") + (training ? "train " : "eval ") +
                      (relu ? "+ relu " : "") + shape_str(s),
                  // Running stats are buffers, as in PyTorch: no gradient flows to them.
                  {{s},
                   {{s[1]}},
                   {{s[1]}},
                   {{s[1]}, DType::kF64, Init::kNormal, 0, false},
                   {{s[1]}, DType::kF64, Init::kPositive, 0, false}},
                  [&](Builder& b, const std::vector<Value>& x) {
                    if (!relu) return b.batch_norm(x[0], x[1], x[2], x[3], x[4], training)[0];
                    const Attrs a = {{"training", std::int64_t{training ? 1 : 0}},
                                     {"eps", 1e-5},
                                     {"activation", std::string("relu")}};
                    return b.op_multi("batch_norm", x, a)[0];
                  });
      }
    }
  }
}

TEST(GradCheck, LayerNorm) {
  for (Shape s : {Shape{3, 7}, Shape{2, 1, 5}, Shape{4}}) {
    gradcheck(
        "layer_norm " + shape_str(s), {{s}, {{s.back()}}, {{s.back()}}},
        [](Builder& b, const std::vector<Value>& x) { return b.layer_norm(x[0], x[1], x[2]); });
  }
}

// The fused residual add + layer norm (runtime::fuse_residual_norms): with
// the sum read again (its gradient joins layer norm's in layer_norm_grad's
// fourth input) and without (three inputs).
TEST(GradCheck, AddLayerNorm) {
  for (Shape s : {Shape{3, 7}, Shape{2, 1, 5}}) {
    const std::vector<In> ins = {{s}, {s}, {{s.back()}}, {{s.back()}}};
    for (bool sum_read : {true, false})
      gradcheck("add_layer_norm " + shape_str(s) + (sum_read ? " (sum read)" : ""), ins,
                [sum_read](Builder& b, const std::vector<Value>& x) {
                  auto o = b.op_multi("add_layer_norm", x, {{"eps", 1e-5}});
                  return sum_read ? b.add(o[0], b.mul(o[1], o[1])) : o[0];
                });
  }
}

TEST(GradCheck, Dropout) {
  gradcheck("dropout", {{{5, 7}}},
            [](Builder& b, const std::vector<Value>& x) { return b.dropout(x[0], 0.3, 42); });
}

TEST(GradCheck, SoftmaxFamilyAndLosses) {
  for (std::int64_t axis : {-1, 0, 1}) {
    gradcheck("softmax axis " + std::to_string(axis), {{{3, 5, 2}}},
              [&](Builder& b, const std::vector<Value>& x) { return b.softmax(x[0], axis); });
    gradcheck("log_softmax axis " + std::to_string(axis), {{{3, 5, 2}}},
              [&](Builder& b, const std::vector<Value>& x) { return b.log_softmax(x[0], axis); });
  }
  // Attention's form: scaled, causal on square and wide matrices, and
  // scaled alone (one fused op forward and one backward).
  for (Shape s : {Shape{2, 3, 4, 4}, Shape{2, 3, 5}, Shape{3, 6}}) {
    for (bool causal : {true, false}) {
      gradcheck("attention_softmax " + shape_str(s) + (causal ? " causal" : ""), {{s}},
                [&](Builder& b, const std::vector<Value>& x) {
                  return b.attention_softmax(x[0], 0.37, causal);
                });
    }
  }
  for (DType lt : {DType::kI32, DType::kI64}) {
    gradcheck("cross_entropy", {{{5, 7}}, {{5}, lt, Init::kLabels, 7}},
              [](Builder& b, const std::vector<Value>& x) { return b.cross_entropy(x[0], x[1]); });
  }
  gradcheck("mse", {{{3, 1, 4}}, {{3, 1, 4}}},
            [](Builder& b, const std::vector<Value>& x) { return b.mse(x[0], x[1]); });
}

TEST(GradCheck, Reductions) {
  std::vector<std::pair<std::vector<std::int64_t>, bool>> cfgs = {
      {{}, false}, {{0}, false}, {{1}, true}, {{0, 2}, false}, {{-1}, true}};
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max"}) {
    for (const auto& [axes, keep] : cfgs) {
      gradcheck(std::string(op), {{{3, 5, 2}}}, [&](Builder& b, const std::vector<Value>& x) {
        return b.op(op, {x[0]}, {{"axes", axes}, {"keepdims", std::int64_t{keep}}});
      });
    }
  }
}

TEST(GradCheck, ShapeOps) {
  gradcheck("broadcast", {{{3, 1}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.broadcast(x[0], {2, 3, 5});
  });
  gradcheck("sum_to", {{{2, 3, 5}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.sum_to(x[0], {3, 1});
  });
  gradcheck("reshape", {{{2, 3, 5}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.reshape(x[0], {5, -1});
  });
  gradcheck("flatten", {{{2, 3, 1, 5}}},
            [](Builder& b, const std::vector<Value>& x) { return b.flatten(x[0]); });
  gradcheck("transpose", {{{2, 3, 5}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.transpose(x[0], {2, 0, 1});
  });
  gradcheck("concat", {{{2, 3}}, {{2, 1}}, {{2, 5}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.concat({x[0], x[1], x[2]}, 1);
  });
  gradcheck("slice", {{{7, 3}}},
            [](Builder& b, const std::vector<Value>& x) { return b.slice(x[0], 0, 1, 6, 2); });
  gradcheck("slice_scatter", {{{3, 3}}}, [](Builder& b, const std::vector<Value>& x) {
    return b.op("slice_scatter", {x[0]},
                {{"axis", std::int64_t{0}},
                 {"start", std::int64_t{1}},
                 {"end", std::int64_t{6}},
                 {"step", std::int64_t{2}},
                 {"shape", Shape{7, 3}}});
  });
  // Overlapping pieces (rows 2 and 4 take two) and an uncovered row (5).
  gradcheck("slice_scatter_sum", {{{3, 3}}, {{2, 3}}, {{1, 3}}},
            [](Builder& b, const std::vector<Value>& x) {
              return b.op("slice_scatter_sum", {x[0], x[1], x[2]},
                          {{"axis", std::int64_t{0}},
                           {"shape", Shape{7, 3}},
                           {"starts", std::vector<std::int64_t>{0, 2, 6}},
                           {"ends", std::vector<std::int64_t>{5, 5, 7}},
                           {"steps", std::vector<std::int64_t>{2, 2, 1}}});
            });
  gradcheck("embedding", {{{7, 3}}, {{2, 5}, DType::kI64, Init::kLabels, 7}},
            [](Builder& b, const std::vector<Value>& x) { return b.embedding(x[0], x[1]); });
  // A vocabulary shard (tensor parallelism): rows 3..9 of a 12-id
  // vocabulary; the other ids read zeros and send their gradient nowhere.
  gradcheck("embedding shard", {{{7, 3}}, {{3, 5}, DType::kI64, Init::kLabels, 12}},
            [](Builder& b, const std::vector<Value>& x) {
              return b.op("embedding", {x[0], x[1]},
                          {{"offset", std::int64_t{3}}, {"vocab", std::int64_t{12}}});
            });
}

// A vocabulary shard's lookup reads its rows of the whole table and zeros
// for the ids other shards hold (the gradient check above cannot tell a
// wrong row from a right one: it checks the backward against the forward).
TEST(Embedding, AVocabularyShardReadsItsRowsAndZerosElsewhere) {
  Graph g;
  Builder b(g);
  std::vector<float> whole(12 * 2);
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = 1.0f + static_cast<float>(i);
  // Rows 3..9 of the 12-row table, looked up at ids 0, 3, 9, 11, 5.
  Tensor shard =
      Tensor::from_vector(std::vector<float>(whole.begin() + 6, whole.begin() + 20), {7, 2});
  Value t = b.input("t", DType::kF32, {7, 2});
  Value ids = b.input("ids", DType::kI64, {5});
  g.mark_output(
      b.op("embedding", {t, ids}, {{"offset", std::int64_t{3}}, {"vocab", std::int64_t{12}}}));
  auto exe = (*runtime::make_backend("cpu"))->compile(g, {});
  ASSERT_TRUE(exe.ok()) << exe.status().to_string();
  Tensor id = Tensor::from_vector(std::vector<std::int64_t>{0, 3, 9, 11, 5}, {5});
  ASSERT_TRUE((*exe)->bind("t", shard).ok());
  ASSERT_TRUE((*exe)->bind("ids", id).ok());
  ASSERT_TRUE((*exe)->run().ok());
  const float* y = (*exe)->output(0).data<float>();
  const std::vector<float> want = {0,         0, whole[6], whole[7],  whole[18],
                                   whole[19], 0, 0,        whole[10], whole[11]};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y[i], want[i]) << "element " << i;
  // An id outside the vocabulary is still an error, naming it.
  Tensor bad = Tensor::from_vector(std::vector<std::int64_t>{12, 0, 0, 0, 0}, {5});
  ASSERT_TRUE((*exe)->bind("ids", bad).ok());
  const Status st = (*exe)->run();
  EXPECT_NE(st.message().find("id 12 at position 0 is outside the vocabulary's 12 rows"),
            std::string::npos)
      << st.to_string();
}

TEST(GradCheck, EveryRegisteredOpIsCoveredOrAHelper) {
  // Ops whose gradient rule is checked above, and backward helpers that are
  // differentiated only as part of their forward op.
  std::set<std::string> checked = {"neg",
                                   "exp",
                                   "log",
                                   "sqrt",
                                   "rsqrt",
                                   "abs",
                                   "relu",
                                   "gelu",
                                   "tanh",
                                   "sigmoid",
                                   "erf",
                                   "add",
                                   "sub",
                                   "mul",
                                   "div",
                                   "pow",
                                   "where",
                                   "cast",
                                   "matmul",
                                   "linear",
                                   "conv2d",
                                   "conv2d_grad_input",  // = conv_transpose2d
                                   "max_pool2d",
                                   "avg_pool2d",
                                   "global_avg_pool",
                                   "batch_norm",
                                   "layer_norm",
                                   "add_layer_norm",
                                   "dropout",
                                   "softmax",
                                   "log_softmax",
                                   "cross_entropy",
                                   "mse",
                                   "reduce_sum",
                                   "reduce_mean",
                                   "reduce_max",
                                   "broadcast",
                                   "sum_to",
                                   "reshape",
                                   "flatten",
                                   "transpose",
                                   "concat",
                                   "slice",
                                   "slice_scatter",
                                   "slice_scatter_sum",
                                   "embedding"};
  std::set<std::string> helpers = {"input",
                                   "constant",
                                   "step",
                                   "sign",
                                   "equal",
                                   "gelu_grad",
                                   "layout",     // inserted by the backend after autodiff
                                   "relu_grad",  // checked through relu and SecondOrderThroughRelu
                                   "one_hot",
                                   "conv2d_grad_weight",
                                   "max_pool2d_grad",
                                   "avg_pool2d_grad",
                                   "batch_norm_grad",
                                   "layer_norm_grad",
                                   "softmax_grad",  // checked through softmax
                                   "embedding_grad"};
  for (const std::string& op : OpRegistry::global().names())
    EXPECT_TRUE(checked.count(op) || helpers.count(op))
        << "op '" << op << "' has no gradient check";
}

// d/dx of the gradient of f (a scalar of x), built by applying autodiff
// twice, checked by central differences of the first-order gradient's sum.
// Returns the second-order values for analytic checks.
Tensor expect_second_order(Graph& g, Builder& b, Value x, Value f, Tensor xt) {
  auto g1 = autodiff(g, f, {x});
  EXPECT_TRUE(g1.ok());
  if (!g1.ok()) return {};
  Value s = b.reduce_sum((*g1)[0], {});
  auto g2 = autodiff(g, s, {x});
  EXPECT_TRUE(g2.ok()) << g2.status().to_string();
  if (!g2.ok()) return {};
  g.mark_output(s);
  g.mark_output((*g2)[0]);
  auto exe = (*runtime::make_backend("cpu"))->compile(g, {});
  EXPECT_TRUE(exe.ok()) << exe.status().to_string();
  if (!exe.ok()) return {};
  EXPECT_TRUE((*exe)->bind("x", xt).ok());
  EXPECT_TRUE((*exe)->run().ok());
  Tensor h = (*exe)->output(1).clone();
  for (std::int64_t i = 0; i < xt.numel(); ++i) {
    double o = xt.get(i), e = 1e-6;
    xt.set(i, o + e);
    EXPECT_TRUE((*exe)->run().ok());
    double p = (*exe)->output(0).get(0);
    xt.set(i, o - e);
    EXPECT_TRUE((*exe)->run().ok());
    double m = (*exe)->output(0).get(0);
    xt.set(i, o);
    EXPECT_NEAR(h.get(i), (p - m) / (2 * e), 1e-5) << "element " << i;
  }
  return h;
}

TEST(GradCheck, SecondOrder) {
  // sum(tanh(x) * x * x)
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF64, {5});
  Value f = b.reduce_sum(b.mul(b.tanh(x), b.mul(x, x)), {});
  expect_second_order(g, b, x, f, Tensor::from_vector<double>({-1.2, -0.3, 0.1, 0.7, 1.9}, {5}));
}

// Second order through ReLU: sum(relu(x) * x * x), whose second derivative
// is 6x where x > 0. Part of it flows through relu_grad's dy input, so its
// gradient rule is checked here; points stay away from the kink at 0.
TEST(GradCheck, SecondOrderThroughRelu) {
  Graph g;
  Builder b(g);
  Value x = b.input("x", DType::kF64, {6});
  Value f = b.reduce_sum(b.mul(b.op("relu", {x}), b.mul(x, x)), {});
  Tensor xt = Tensor::from_vector<double>({-1.2, -0.3, 0.1, 0.7, 1.9, -2.5}, {6});
  Tensor h = expect_second_order(g, b, x, f, xt);
  ASSERT_TRUE(h.defined());
  for (std::int64_t i = 0; i < 6; ++i)
    EXPECT_NEAR(h.get(i), xt.get(i) > 0 ? 6 * xt.get(i) : 0.0, 1e-9) << "analytic, element " << i;
}

}  // namespace
}  // namespace shoal::graph
