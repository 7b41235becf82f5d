// The `zrt._zrt` extension behind the Python module (python/zrt/__init__.py, docs/python.md): reading
// any tensor of a checkpoint at any world size, writing a checkpoint from numpy arrays, verify, plan.
// Errors are raised as zrt.Error with zrt's message (which names the file, tensor or rank).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sstream>

#include "tools/lib/ckpt_commands.h"
#include "tools/lib/plan.h"
#include "zrt/checkpoint/interchange/interchange.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/checkpoint/catalog.h"

namespace py = pybind11;

namespace {

PyObject* g_error = nullptr;  // zrt.Error

[[noreturn]] void Raise(const zrt::Status& s) {
  PyErr_SetString(g_error, std::string(s.message()).c_str());
  throw py::error_already_set();
}
template <typename T>
T Value(zrt::Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}
void Check(const zrt::Status& s) {
  if (!s.ok()) Raise(s);
}

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path) {
    const std::string dir = Value(zrt::tools::ResolveCheckpointDir(path));
    reader_ = Value(zrt::ckpt::TensorReader::Open(dir));
  }
  const zrt::ckpt::Manifest& m() const { return reader_->manifest(); }

  py::list Groups() const {
    py::list out;
    for (const auto& ge : m().groups) {
      py::list tensors;
      for (const auto& te : ge.tensors) {
        py::dict t;
        t["name"] = te.name;
        t["shape"] = py::tuple(py::cast(te.shape));
        t["dtype"] = std::string(zrt::DTypeName(te.dtype));
        tensors.append(t);
      }
      py::dict g;
      g["name"] = ge.name;
      g["lr"] = ge.lr;
      g["weight_decay"] = ge.weight_decay;
      g["kinds"] = ge.kinds;
      std::vector<std::string> stored;  // how each kind is stored: "f32", "bf16", "q8", "q4" (read() gives f32 either way)
      for (size_t k = 0; k < ge.kinds.size(); ++k) stored.emplace_back(zrt::PrecisionName(ge.stored_as(k)));
      g["stored"] = stored;
      g["tensors"] = tensors;
      out.append(g);
    }
    return out;
  }

  // Rows [start, stop) of the first dimension (all of it by default), as float32 in the tensor's shape.
  py::array_t<float> Read(const std::string& name, const std::string& kind, py::object start, py::object stop) {
    const auto [ge, te] = Value(reader_->Find(name));
    std::vector<int64_t> shape = te->shape;
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const int64_t inner = rows == 0 ? 0 : te->numel / rows;
    int64_t r0 = start.is_none() ? 0 : start.cast<int64_t>(), r1 = stop.is_none() ? rows : stop.cast<int64_t>();
    if (r0 < 0) r0 += rows;
    if (r1 < 0) r1 += rows;
    r0 = std::clamp<int64_t>(r0, 0, rows);
    r1 = std::clamp<int64_t>(r1, r0, rows);
    if (!shape.empty()) shape[0] = r1 - r0;
    py::array_t<float> out(shape);
    float* dst = out.mutable_data();
    zrt::Status s;
    {
      py::gil_scoped_release unlocked;
      s = reader_->Read(name, kind, r0 * inner, (r1 - r0) * inner, dst);
    }
    Check(s);
    return out;
  }

  std::unique_ptr<zrt::ckpt::TensorReader> reader_;
};

// A checkpoint from numpy arrays: `params` name -> array (float32 or anything that casts to it), in
// registration order; `optimizer` kind -> name -> array (every kind for every tensor, or none).
std::string Write(const std::string& root, const py::dict& params, int world_size, int stage, const py::dict& optimizer, int64_t step,
                  const std::string& trainer_state, const std::map<std::string, std::string>& groups,
                  const std::map<std::string, std::string>& dtypes, const std::string& model_dtype, double lr, double weight_decay) {
  std::vector<zrt::ckpt::FullTensor> tensors;
  std::vector<py::array_t<float, py::array::c_style | py::array::forcecast>> data;
  std::map<std::string, std::vector<py::array_t<float, py::array::c_style | py::array::forcecast>>> state;
  std::vector<std::string> kinds = {"master"};
  for (auto item : optimizer) kinds.push_back(py::cast<std::string>(item.first));
  const zrt::DType default_dtype = Value(zrt::ParseDType(model_dtype));
  for (auto item : params) {
    const std::string name = py::cast<std::string>(item.first);
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(item.second);
    if (!a) throw py::type_error("params['" + name + "'] is not an array of numbers");
    zrt::ckpt::FullTensor t;
    t.name = name;
    for (py::ssize_t d = 0; d < a.ndim(); ++d) t.shape.push_back(a.shape(d));
    t.group = groups.count(name) ? groups.at(name) : "default";
    t.model_dtype = dtypes.count(name) ? Value(zrt::ParseDType(dtypes.at(name))) : default_dtype;
    t.lr = lr;
    t.weight_decay = weight_decay;
    for (size_t k = 1; k < kinds.size(); ++k) {
      py::dict per = optimizer[py::str(kinds[k])].cast<py::dict>();
      if (!per.contains(name)) Raise(zrt::InvalidArgumentError("optimizer['", kinds[k], "'] has no '", name, "'"));
      auto s = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(per[py::str(name)]);
      if (!s || s.size() != a.size()) Raise(zrt::InvalidArgumentError("optimizer['", kinds[k], "']['", name, "'] does not have its parameter's size"));
      state[kinds[k]].push_back(s);
    }
    tensors.push_back(std::move(t));
    data.push_back(a);
  }
  zrt::ckpt::Manifest base;
  base.step = step;
  base.zrt_version = "python";
  base.trainer_state = nlohmann::json::parse(trainer_state.empty() ? "{}" : trainer_state, nullptr, false);
  if (base.trainer_state.is_discarded()) Raise(zrt::InvalidArgumentError("trainer_state is not JSON"));
  std::map<std::string, std::vector<std::string>> group_kinds;
  for (const auto& t : tensors) group_kinds[t.group] = kinds;
  auto read = [&](size_t t, const std::string& kind, int64_t offset, int64_t count, float* out) -> zrt::Status {
    const float* src = kind == "master" ? data[t].data() : state.at(kind)[t].data();
    std::copy_n(src + offset, count, out);
    return zrt::Status();
  };
  zrt::ckpt::ImportOptions o;
  o.world_size = world_size;
  o.stage = stage;
  zrt::Status s;
  {
    py::gil_scoped_release unlocked;
    s = zrt::ckpt::WriteCheckpointFromFull(root, tensors, group_kinds, base, read, o, nullptr);
  }
  Check(s);
  return Value(zrt::tools::ResolveCheckpointDir(root));
}

py::tuple Verify(const std::string& path) {
  const std::string dir = Value(zrt::tools::ResolveCheckpointDir(path));
  std::vector<std::string> problems;
  zrt::Status s;
  {
    py::gil_scoped_release unlocked;
    s = zrt::ckpt::CheckComplete(dir, zrt::ckpt::VerifyLevel::kFull, &problems);
  }
  if (!s.ok() && problems.empty()) problems.push_back(std::string(s.message()));
  return py::make_tuple(problems.empty(), problems);
}

std::string Plan(const zrt::tools::PlanInput& in) {
  std::ostringstream os;
  const zrt::Status s = zrt::tools::Plan(in, true, os);
  // Not fitting is an answer, not an error: the JSON says so.
  if (!s.ok() && os.str().empty()) Raise(s);
  return os.str();
}

}  // namespace

PYBIND11_MODULE(_zrt, m) {
  m.doc() = "zrt checkpoints from Python (docs/python.md)";
  g_error = PyErr_NewException("zrt.Error", PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::handle(g_error);
  py::class_<Checkpoint>(m, "Checkpoint")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def_property_readonly("dir", [](const Checkpoint& c) { return c.reader_->dir(); })
      .def_property_readonly("step", [](const Checkpoint& c) { return c.m().step; })
      .def_property_readonly("world_size", [](const Checkpoint& c) { return c.m().world_size; })
      .def_property_readonly("stage", [](const Checkpoint& c) { return c.m().stage; })
      .def_property_readonly("loss_scale", [](const Checkpoint& c) { return c.m().loss_scale; })
      .def_property_readonly("trainer_state_json", [](const Checkpoint& c) { return c.m().trainer_state.dump(); })
      .def_property_readonly("engine_state_json", [](const Checkpoint& c) { return c.m().engine_state.dump(); })
      .def_property_readonly("groups", &Checkpoint::Groups)
      .def("read", &Checkpoint::Read, py::arg("name"), py::arg("kind") = "master", py::arg("start") = py::none(),
           py::arg("stop") = py::none());
  m.def("write", &Write, py::arg("root"), py::arg("params"), py::arg("world_size") = 1, py::arg("stage") = 3,
        py::arg("optimizer") = py::dict(), py::arg("step") = 0, py::arg("trainer_state") = "", py::arg("groups") = std::map<std::string, std::string>{},
        py::arg("dtypes") = std::map<std::string, std::string>{}, py::arg("model_dtype") = "f32", py::arg("lr") = 0.0,
        py::arg("weight_decay") = 0.0);
  m.def("verify", &Verify, py::arg("path"));
  py::class_<zrt::tools::PlanInput>(m, "PlanInput")
      .def(py::init<>())
      .def_readwrite("params", &zrt::tools::PlanInput::params)
      .def_readwrite("largest_layer", &zrt::tools::PlanInput::largest_layer)
      .def_readwrite("arch", &zrt::tools::PlanInput::arch)
      .def_readwrite("kv_heads", &zrt::tools::PlanInput::kv_heads)
      .def_readwrite("ffn", &zrt::tools::PlanInput::ffn)
      .def_readwrite("gpus_per_node", &zrt::tools::PlanInput::gpus_per_node)
      .def_readwrite("offload_params", &zrt::tools::PlanInput::offload_params)
      .def_readwrite("recompute", &zrt::tools::PlanInput::recompute)
      .def_readwrite("flash_attention", &zrt::tools::PlanInput::flash_attention)
      .def_readwrite("fp32_grads", &zrt::tools::PlanInput::fp32_grads)
      .def_readwrite("prefetch_depth", &zrt::tools::PlanInput::prefetch_depth)
      .def_readwrite("bucket_bytes", &zrt::tools::PlanInput::bucket_bytes)
      .def_readwrite("cpu_mem_gib", &zrt::tools::PlanInput::cpu_mem_gib)
      .def_readwrite("layers", &zrt::tools::PlanInput::layers)
      .def_readwrite("hidden", &zrt::tools::PlanInput::hidden)
      .def_readwrite("heads", &zrt::tools::PlanInput::heads)
      .def_readwrite("vocab", &zrt::tools::PlanInput::vocab)
      .def_readwrite("seq", &zrt::tools::PlanInput::seq)
      .def_readwrite("batch", &zrt::tools::PlanInput::batch)
      .def_readwrite("gpus", &zrt::tools::PlanInput::gpus)
      .def_readwrite("stage", &zrt::tools::PlanInput::stage)
      .def_readwrite("shard_group", &zrt::tools::PlanInput::shard_group)
      .def_readwrite("tp", &zrt::tools::PlanInput::tp)
      .def_readwrite("pp", &zrt::tools::PlanInput::pp)
      .def_readwrite("intra_gbps", &zrt::tools::PlanInput::intra_gbps)
      .def_readwrite("inter_gbps", &zrt::tools::PlanInput::inter_gbps)
      .def_readwrite("offload", &zrt::tools::PlanInput::offload)
      .def_readwrite("param_bytes", &zrt::tools::PlanInput::param_bytes)
      .def_readwrite("gpu_mem_gib", &zrt::tools::PlanInput::gpu_mem_gib)
      .def_readwrite("step_seconds", &zrt::tools::PlanInput::step_seconds)
      .def_readwrite("tokens", &zrt::tools::PlanInput::tokens)
      .def_readwrite("tflops", &zrt::tools::PlanInput::tflops)
      .def_readwrite("power_watts", &zrt::tools::PlanInput::power_watts)
      .def_readwrite("moments", &zrt::tools::PlanInput::moments)
      .def_readwrite("master", &zrt::tools::PlanInput::master)
      .def_readwrite("q8_block", &zrt::tools::PlanInput::q8_block)
      .def_readwrite("mttf_hours", &zrt::tools::PlanInput::mttf_hours)
      .def_readwrite("mtbf_hours", &zrt::tools::PlanInput::mtbf_hours)
      .def_readwrite("node_loss", &zrt::tools::PlanInput::node_loss)
      .def_readwrite("tier_miss", &zrt::tools::PlanInput::tier_miss)
      .def_readwrite("relaunch", &zrt::tools::PlanInput::relaunch)
      .def_readwrite("snapshot_gbps", &zrt::tools::PlanInput::snapshot_gbps)
      .def_readwrite("disk_write_gbps", &zrt::tools::PlanInput::disk_write_gbps)
      .def_readwrite("disk_read_gbps", &zrt::tools::PlanInput::disk_read_gbps)
      .def_readwrite("peer_gbps", &zrt::tools::PlanInput::peer_gbps)
      .def_readwrite("from_bench", &zrt::tools::PlanInput::from_bench)
      .def_readwrite("save_slowdown", &zrt::tools::PlanInput::save_slowdown)
      .def_readwrite("save_stall", &zrt::tools::PlanInput::save_stall)
      .def_readwrite("disk_write", &zrt::tools::PlanInput::disk_write)
      .def_readwrite("replica_write", &zrt::tools::PlanInput::replica_write)
      .def_readwrite("restart_disk", &zrt::tools::PlanInput::restart_disk)
      .def_readwrite("restart_memory", &zrt::tools::PlanInput::restart_memory)
      .def_readwrite("restart_replica", &zrt::tools::PlanInput::restart_replica);
  m.def("plan_json", &Plan, py::arg("input"));
}
