// shoal.Trainer: the options of `shoal train` as keyword arguments, the
// same library calls (dist::Job::join, train::Trainer), metrics as dicts,
// weights as {name: ndarray}. The GIL is released while it trains, and a
// script started by `shoal run -n N`, torchrun, mpirun or srun joins its
// job exactly as `shoal train` does.
#include "shoal/train/trainer.h"

#include <pybind11/stl.h>

#include <variant>

#include "python/python.h"
#include "shoal/dist/job.h"
#include "shoal/onnx/import.h"
#include "shoal/train/sources.h"

namespace shoal::python {

namespace {

struct Options {
  train::TrainOptions t;
  dist::JoinOptions j;
  std::string wire, overlap = "auto";  // wire "": f32, bf16 under precision="bf16"
};

using Field = std::variant<int train::TrainOptions::*, std::int64_t train::TrainOptions::*,
                           double train::TrainOptions::*, bool train::TrainOptions::*,
                           std::string train::TrainOptions::*, std::uint64_t train::TrainOptions::*,
                           std::string dist::JoinOptions::*, int dist::JoinOptions::*,
                           double dp::DpOptions::*, int dp::DpOptions::*, int dist::Layout::*,
                           int train::GptConfig::*, std::int64_t train::GptConfig::*,
                           bool train::GptConfig::*, std::string Options::*>;

// Keyword -> field: the CLI's flags with '_' for '-' (`checkpoints` and
// `plot` are the positive forms of --no-checkpoints and --no-plot).
const std::vector<std::pair<const char*, Field>>& fields() {
  using T = train::TrainOptions;
  static const std::vector<std::pair<const char*, Field>> f = {
      {"epochs", &T::epochs},
      {"batch", &T::batch},
      {"optimizer", &T::optimizer},
      {"lr", &T::lr},
      {"momentum", &T::momentum},
      {"weight_decay", &T::weight_decay},
      {"trust", &T::trust},
      {"schedule", &T::schedule},
      {"warmup_epochs", &T::warmup_epochs},
      {"step_epochs", &T::step_epochs},
      {"gamma", &T::gamma},
      {"linear_scaling", &T::linear_scaling},
      {"threads", &T::threads},
      {"seed", &T::seed},
      {"out", &T::out},
      {"augment", &T::augment},
      {"deterministic", &T::deterministic},
      {"precision", &T::precision},
      {"recompute", &T::recompute},
      {"keep_checkpoints", &T::keep_checkpoints},
      {"checkpoint_every", &T::checkpoint_every},
      {"checkpoints", &T::checkpoints},
      {"resume", &T::resume},
      {"init_from", &T::init_from},
      {"max_steps", &T::max_steps},
      {"limit_train", &T::limit_train},
      {"limit_test", &T::limit_test},
      {"classes", &T::classes},
      {"eval_batch", &T::eval_batch},
      {"plot", &T::plot},
      {"quiet", &T::quiet},
      {"trace", &T::trace},
      {"dist", &dist::JoinOptions::dist},
      {"ps_mode", &dist::JoinOptions::ps_mode},
      {"staleness", &dist::JoinOptions::staleness},
      {"ps_compress", &dist::JoinOptions::ps_compress},
      {"bucket_mb", &dp::DpOptions::bucket_mb},
      {"first_bucket_mb", &dp::DpOptions::first_bucket_mb},
      {"zero", &dp::DpOptions::zero},
      {"tp", &dist::Layout::tp},
      {"dp", &dist::Layout::dp},
      {"micro_batches", &dist::Layout::micro_batches},
      {"layers", &train::GptConfig::layers},
      {"heads", &train::GptConfig::heads},
      {"dim", &train::GptConfig::dim},
      {"context", &train::GptConfig::context},
      {"tied", &train::GptConfig::tied},
      {"onnx_tied", &T::onnx_tied},
      {"wire", &Options::wire},
      {"overlap", &Options::overlap},
  };
  return f;
}

template <typename V>
V value_of(const char* key, py::handle v) {
  if constexpr (std::is_same_v<V, bool>) {
    if (!py::isinstance<py::bool_>(v))
      throw py::type_error(fmt::format("shoal.Trainer: {} takes True or False", key));
  } else if constexpr (std::is_integral_v<V>) {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
      throw py::type_error(fmt::format("shoal.Trainer: {} takes an int", key));
  }
  try {
    return v.cast<V>();
  } catch (const py::cast_error&) {
    throw py::type_error(fmt::format("shoal.Trainer: {} takes a {}, got {}", key,
                                     std::is_same_v<V, std::string> ? "str" : "number",
                                     std::string(py::str(v.get_type().attr("__name__")))));
  }
}

void set_option(Options& o, const std::string& key, py::handle v) {
  for (const auto& [name, field] : fields()) {
    if (key != name) continue;
    std::visit(
        [&](auto ptr) {
          using P = decltype(ptr);
          if constexpr (std::is_member_object_pointer_v<P>) {
            auto assign = [&](auto& obj) {
              using V = std::remove_reference_t<decltype(obj.*ptr)>;
              obj.*ptr = value_of<V>(name, v);
            };
            if constexpr (requires { o.t.*ptr; })
              assign(o.t);
            else if constexpr (requires { o.j.*ptr; })
              assign(o.j);
            else if constexpr (requires { o.j.dp.*ptr; })
              assign(o.j.dp);
            else if constexpr (requires { o.j.layout.*ptr; })
              assign(o.j.layout);
            else if constexpr (requires { o.t.gpt.*ptr; })
              assign(o.t.gpt);
            else
              assign(o);
          }
        },
        field);
    return;
  }
  std::vector<std::string> names;
  for (const auto& f : fields()) names.push_back(f.first);
  throw py::type_error(
      fmt::format("shoal.Trainer: unknown option '{}' (options: {})", key, fmt::join(names, ", ")));
}

// data=: a name or path (as --data), or arrays (x_train, y_train, x_test,
// y_test) as a tuple, list or dict.
void set_data(Options& o, py::handle data) {
  if (py::isinstance<py::str>(data)) {
    o.t.data = data.cast<std::string>();
    return;
  }
  std::vector<py::object> a;
  if (py::isinstance<py::dict>(data)) {
    auto d = data.cast<py::dict>();
    for (const char* k : {"x_train", "y_train", "x_test", "y_test"}) {
      if (!d.contains(k))
        throw py::value_error(
            fmt::format("shoal.Trainer: data dict has no '{}' (needs x_train, "
                        "y_train, x_test, y_test)",
                        k));
      a.push_back(d[k]);
    }
  } else if (py::isinstance<py::sequence>(data) && py::len(data) == 4) {
    for (auto v : data) a.push_back(py::reinterpret_borrow<py::object>(v));
  } else {
    throw py::type_error(
        "shoal.Trainer: data is a name or path (as --data), or (x_train, y_train, x_test, "
        "y_test) arrays as a tuple or dict");
  }
  std::vector<Tensor> t;
  const char* names[] = {"x_train", "y_train", "x_test", "y_test"};
  for (std::size_t i = 0; i < a.size(); ++i)
    t.push_back(from_array_like(a[i], fmt::format("shoal.Trainer: data's {}", names[i])));
  auto s = check(train::make_splits(t[0], t[1], t[2], t[3], "arrays"));
  o.t.data = fmt::format("arrays{}", shape_str(s.train.images.shape()));
  o.t.dataset = std::make_shared<const train::DataSplits>(std::move(s));
}

py::dict epoch_dict(const train::EpochMetrics& e) {
  py::dict d;
  d["epoch"] = e.epoch;
  d["step"] = e.step;
  d["partial"] = e.partial;
  d["train_loss"] = e.train_loss;
  d["train_acc"] = e.train_acc;
  d["test_loss"] = e.test_loss;
  d["test_acc"] = e.test_acc;
  d["images_per_s"] = e.images_per_s;
  d["train_seconds"] = e.train_seconds;
  d["wall_seconds"] = e.wall_seconds;
  d["model_flops_per_s"] = e.model_flops_per_s;
  d["mfu"] = e.mfu;
  return d;
}

class PyTrainer {
 public:
  PyTrainer(py::object model, py::object data, py::kwargs kw) {
    if (py::isinstance<onnx::Model>(model))
      o_.t.model = model.cast<const onnx::Model&>().path();
    else
      o_.t.model = value_of<std::string>("model", model);
    set_data(o_, data);
    for (auto [k, v] : kw) set_option(o_, k.cast<std::string>(), v);
    auto wire = dp::wire_for(o_.wire, o_.t.precision, o_.j.dp.zero);
    if (!wire.ok()) throw py::value_error("shoal.Trainer: wire: " + wire.status().message());
    o_.j.dp.wire = *wire;
    o_.j.dp.overlap = check(dp::parse_overlap(o_.overlap));
    check(train::validate(o_.t));
    // Joining waits for the other ranks; errors are raised once the GIL is back.
    Status st = without_gil([&]() -> Status {
      SHOAL_ASSIGN_OR_RETURN(job_, dist::Job::join(o_.t, o_.j));
      SHOAL_ASSIGN_OR_RETURN(trainer_, train::Trainer::create(o_.t));
      return ok_status();
    });
    check(st);
  }

  py::list fit(std::optional<int> epochs) {
    if (epochs) {  // `epochs` more from here, as Keras's fit counts
      const std::int64_t spe = trainer_->steps_per_epoch();
      check(trainer_->set_epochs(static_cast<int>((trainer_->global_step() + spe - 1) / spe) +
                                 *epochs));
    }
    std::size_t before = trainer_->history().size();
    check(without_gil([&] { return trainer_->run(); }));
    py::list out;
    for (std::size_t i = before; i < trainer_->history().size(); ++i)
      out.append(epoch_dict(trainer_->history()[i]));
    return out;
  }

  py::dict evaluate() {
    train::EvalResult r = check(without_gil([&] { return trainer_->evaluate(); }));
    py::dict d;
    d["loss"] = r.loss;
    d["accuracy"] = r.accuracy;
    d["samples"] = r.samples;
    return d;
  }

  py::dict state_dict() {
    py::dict d;
    for (const auto& [n, t] : trainer_->params()) d[py::str(n)] = copy_to_numpy(t);
    auto bufs = check(without_gil([&] { return trainer_->buffers(); }));
    for (const auto& [n, t] : bufs) d[py::str(n)] = copy_to_numpy(t);
    return d;
  }

  void load_state_dict(const py::dict& d) {
    train::WeightsFile w;
    w.path = "state_dict";
    for (auto [k, v] : d)
      w.tensors[k.cast<std::string>()] =
          from_array_like(v, fmt::format("load_state_dict: '{}'", k.cast<std::string>()));
    check(without_gil([&] { return trainer_->load_weights(w); }));
  }

  void save_checkpoint() {
    check(without_gil([&] { return trainer_->checkpoint(); }));
  }

  py::list history() const {
    py::list out;
    for (const auto& e : trainer_->history()) out.append(epoch_dict(e));
    return out;
  }

  int rank() const { return o_.t.rank; }
  int world() const { return o_.t.world; }
  std::int64_t step() const { return trainer_->global_step(); }
  std::int64_t steps_per_epoch() const { return trainer_->steps_per_epoch(); }
  std::string run_dir() const { return trainer_->run_dir(); }

 private:
  Options o_;
  std::unique_ptr<dist::Job> job_;  // outlives the trainer (declared first)
  std::unique_ptr<train::Trainer> trainer_;
};

}  // namespace

void bind_trainer(py::module_& m) {
  py::class_<PyTrainer>(m, "Trainer",
                        "Trains a model: Trainer(model, data='fashion-mnist', **options). model is "
                        "'mlp', 'cnn', 'resnet', a path to an .onnx file or a shoal.onnx.Model; "
                        "data is what `shoal train --data` takes or (x_train, y_train, x_test, "
                        "y_test) NumPy arrays; options are `shoal train`'s flags with '_' for "
                        "'-' (epochs=5, batch=64, optimizer='momentum', lr=0.05, ...). Under "
                        "`shoal run -n N`, torchrun, mpirun or srun each process joins the job "
                        "and trains data-parallel.")
      .def(py::init<py::object, py::object, py::kwargs>(), py::arg("model"),
           py::arg("data") = "fashion-mnist")
      .def("fit", &PyTrainer::fit, py::arg("epochs") = py::none(),
           "Trains to the `epochs` option, or `epochs` more when given; returns the new epochs' "
           "metrics as dicts")
      .def("evaluate", &PyTrainer::evaluate, "Loss and accuracy on the test split")
      .def("state_dict", &PyTrainer::state_dict,
           "Parameters and batch-norm buffers as {name: ndarray} (copies)")
      .def("load_state_dict", &PyTrainer::load_state_dict, py::arg("tensors"),
           "Loads {name: ndarray} (Shoal or PyTorch names); every tensor the model needs must be "
           "there with its shape")
      .def("save_checkpoint", &PyTrainer::save_checkpoint)
      .def_property_readonly("history", &PyTrainer::history)
      .def_property_readonly("rank", &PyTrainer::rank)
      .def_property_readonly("world", &PyTrainer::world)
      .def_property_readonly("step", &PyTrainer::step)
      .def_property_readonly("steps_per_epoch", &PyTrainer::steps_per_epoch)
      .def_property_readonly("run_dir", &PyTrainer::run_dir);
}

}  // namespace shoal::python
