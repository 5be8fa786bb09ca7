#include "shoal/train/model.h"

#include <algorithm>
#include <cmath>

#include "shoal/tensor/philox.h"

namespace shoal::train {

using graph::Value;

Value ModelContext::param(const std::string& name, Shape shape, const std::string& init,
                          double fan_in, double fan_out) {
  auto it = pvals_.find(name);
  if (it != pvals_.end()) return it->second;
  Value v = b_.input("param/" + name, DType::kF32, shape);
  params_.push_back({name, std::move(shape), init, fan_in, fan_out, {}, 0});
  pvals_[name] = v;
  return v;
}

Value ModelContext::buffer(const std::string& name, Shape shape, double init) {
  buffers_.push_back({name, shape, init, {}, false});
  return b_.input("buf/" + name, DType::kF32, std::move(shape));
}

Value ModelContext::normal_param(const std::string& name, Shape shape, double stddev) {
  if (auto it = pvals_.find(name); it != pvals_.end()) return it->second;
  Value v = param(name, std::move(shape), "normal", 1, 1);
  params_.back().stddev = stddev;  // the spec param() just added
  return v;
}

Value ModelContext::given_param(const std::string& name, const Tensor& value) {
  auto it = pvals_.find(name);
  if (it != pvals_.end()) return it->second;
  Value v = b_.input("param/" + name, DType::kF32, value.shape());
  params_.push_back({name, value.shape(), "given", 1, 1, value.cast(DType::kF32), 0});
  pvals_[name] = v;
  return v;
}

Value ModelContext::given_buffer(const std::string& name, const Tensor& value) {
  buffers_.push_back({name, value.shape(), 0, value.cast(DType::kF32), true});
  return b_.input("buf/" + name, DType::kF32, value.shape());
}

Value ModelContext::conv(Value x, std::int64_t cin, std::int64_t cout, std::int64_t k,
                         std::int64_t stride, std::int64_t pad, const std::string& name,
                         bool bias) {
  double fan_in = static_cast<double>(cin * k * k), fan_out = static_cast<double>(cout * k * k);
  Value w = param(name + ".weight", {cout, cin, k, k}, "kaiming", fan_in, fan_out);
  Value bv = bias ? param(name + ".bias", {cout}, "zeros", fan_in, fan_out) : Value{};
  return b_.conv2d(x, w, bv, {stride, stride}, {pad, pad});
}

Value ModelContext::batch_norm(Value x, std::int64_t c, const std::string& name) {
  Value gamma = param(name + ".weight", {c}, "ones", 1, 1);
  Value beta = param(name + ".bias", {c}, "zeros", 1, 1);
  Value rm = buffer(name + ".running_mean", {c}, 0.0);
  Value rv = buffer(name + ".running_var", {c}, 1.0);
  auto outs = b_.batch_norm(x, gamma, beta, rm, rv, training_);
  if (!b_.ok()) return {};
  if (training_) {
    // PyTorch's convention: running = (1 - m) running + m batch, with the
    // unbiased batch variance.
    const Shape& s = b_.shape(x);
    double n = static_cast<double>(s[0] * (s.size() > 2 ? s[2] * s[3] : 1));
    double m = bn_momentum, unbias = n > 1 ? n / (n - 1) : 1.0;
    Value keep = b_.scalar(1.0 - m);
    updates_.push_back(
        {name + ".running_mean", b_.add(b_.mul(rm, keep), b_.mul(outs[1], b_.scalar(m)))});
    updates_.push_back(
        {name + ".running_var", b_.add(b_.mul(rv, keep), b_.mul(outs[2], b_.scalar(m * unbias)))});
  }
  return outs[0];
}

Value ModelContext::dense(Value x, std::int64_t in, std::int64_t out, const std::string& name,
                          const std::string& init) {
  Value w =
      param(name + ".weight", {out, in}, init, static_cast<double>(in), static_cast<double>(out));
  Value bv =
      param(name + ".bias", {out}, "zeros", static_cast<double>(in), static_cast<double>(out));
  return b_.linear(x, w, bv);
}

// model_onnx.cc
Result<Model> onnx_model(const std::string& path, int classes, bool tied);

namespace {

Value mlp(ModelContext& m, Value x, int classes) {
  auto& b = m.b();
  std::int64_t in = 1;
  for (std::size_t i = 1; i < b.shape(x).size(); ++i) in *= b.shape(x)[i];
  Value h = b.flatten(x);
  h = b.relu(m.dense(h, in, 512, "fc1"));
  h = b.relu(m.dense(h, 512, 256, "fc2"));
  return m.dense(h, 256, classes, "fc3", "xavier");
}

Value cnn(ModelContext& m, Value x, int classes) {
  auto& b = m.b();
  std::int64_t cin = b.shape(x)[1];
  Value h = x;
  std::int64_t c = cin;
  int i = 1;
  for (std::int64_t cout : {32, 64}) {
    std::string n = "block" + std::to_string(i++);
    h = m.conv(h, c, cout, 3, 1, 1, n + ".conv", false);
    h = b.relu(m.batch_norm(h, cout, n + ".bn"));
    h = b.max_pool2d(h, {2, 2}, {2, 2});
    c = cout;
  }
  const Shape& s = b.shape(h);
  std::int64_t flat = s[1] * s[2] * s[3];
  h = b.relu(m.dense(b.flatten(h), flat, 128, "fc1"));
  return m.dense(h, 128, classes, "fc2", "xavier");
}

// ResNet-20 (He et al. 2016, CIFAR variant): 3 stages of 3 basic blocks
// with 16, 32, 64 channels; projection (1x1 conv + BN) shortcuts where the
// shape changes.
Value resnet(ModelContext& m, Value x, int classes) {
  auto& b = m.b();
  std::int64_t cin = b.shape(x)[1];
  Value h = b.relu(m.batch_norm(m.conv(x, cin, 16, 3, 1, 1, "stem.conv", false), 16, "stem.bn"));
  std::int64_t c = 16;
  int stage = 0;
  for (std::int64_t width : {16, 32, 64}) {
    for (int blk = 0; blk < 3; ++blk) {
      std::string n = "layer" + std::to_string(stage + 1) + "." + std::to_string(blk);
      std::int64_t stride = (blk == 0 && stage > 0) ? 2 : 1;
      Value y = b.relu(
          m.batch_norm(m.conv(h, c, width, 3, stride, 1, n + ".conv1", false), width, n + ".bn1"));
      y = m.batch_norm(m.conv(y, width, width, 3, 1, 1, n + ".conv2", false), width, n + ".bn2");
      Value sc = h;
      if (stride != 1 || c != width)
        sc = m.batch_norm(m.conv(h, c, width, 1, stride, 0, n + ".down", false), width,
                          n + ".down_bn");
      h = b.relu(b.add(y, sc));
      c = width;
    }
    ++stage;
  }
  return m.dense(b.global_avg_pool(h), c, classes, "fc", "xavier");
}

}  // namespace

std::vector<std::string> model_names() { return {"mlp", "cnn", "resnet", "gpt"}; }

bool is_onnx_path(const std::string& name) { return name.size() > 5 && name.ends_with(".onnx"); }

bool is_model_name(const std::string& name) {
  auto names = model_names();
  return std::find(names.begin(), names.end(), name) != names.end() || name == "resnet20" ||
         is_onnx_path(name);
}

// A convolutional model's forward, refusing samples that are not images.
template <typename F>
std::function<Value(ModelContext&, Value)> on_images(const std::string& name, F f) {
  return [name, f](ModelContext& c, Value x) -> Value {
    const Shape& s = c.b().shape(x);
    if (s.size() != 4) {
      c.b().fail(invalid_argument("--model {} takes images [C, H, W]; the data's samples are {}",
                                  name, shape_str(Shape(s.begin() + 1, s.end()))));
      return {};
    }
    return f(c, x);
  };
}

Result<Model> make_model(const std::string& name, int classes, const GptConfig& gpt,
                         bool onnx_tied) {
  if (name == "gpt") return gpt_model(gpt, classes);
  Model m;
  m.name = name;
  if (name == "mlp") {
    m.forward = [classes](ModelContext& c, Value x) { return mlp(c, x, classes); };
  } else if (name == "cnn") {
    m.forward = on_images(name, [classes](ModelContext& c, Value x) { return cnn(c, x, classes); });
  } else if (name == "resnet" || name == "resnet20") {
    m.name = "resnet";
    m.forward =
        on_images(m.name, [classes](ModelContext& c, Value x) { return resnet(c, x, classes); });
  } else if (is_onnx_path(name)) {
    return onnx_model(name, classes, onnx_tied);
  } else {
    return invalid_argument("model '{}' is not one of {}, nor a .onnx file", name,
                            fmt::join(model_names(), ", "));
  }
  return m;
}

std::map<std::string, Tensor> init_params(const std::vector<ParamSpec>& specs, std::uint64_t seed) {
  std::map<std::string, Tensor> out;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& s = specs[i];
    Tensor t = Tensor::empty(s.shape, DType::kF32);
    PhiloxRng rng(seed, 1000 + i);
    if (s.init == "kaiming") {
      rng.fill_normal(t, 0, std::sqrt(2.0 / s.fan_in));
    } else if (s.init == "xavier") {
      double a = std::sqrt(6.0 / (s.fan_in + s.fan_out));
      rng.fill_uniform(t, -a, a);
    } else if (s.init == "normal") {
      rng.fill_normal(t, 0, s.stddev);
    } else if (s.init == "ones") {
      t = Tensor::full(s.shape, DType::kF32, 1.0);
    } else if (s.init == "given") {
      t = s.value.cast(DType::kF32);  // a copy: the spec keeps the imported value
    }                                 // zeros: empty() is zero-filled
    out[s.name] = t;
  }
  return out;
}

std::map<std::string, Tensor> init_buffers(const std::vector<BufferSpec>& specs) {
  std::map<std::string, Tensor> out;
  for (const auto& s : specs)
    out[s.name] = s.given ? s.value.cast(DType::kF32) : Tensor::full(s.shape, DType::kF32, s.init);
  return out;
}

}  // namespace shoal::train
