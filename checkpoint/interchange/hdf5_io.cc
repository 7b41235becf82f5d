#include "zrt/checkpoint/interchange/interchange.h"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>

#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/interchange/import_full.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/shard_writer.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/whole_group.h"
#include "zrt/core/device.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

namespace {

// Owned hid_t (files, groups, datasets, spaces, types, attributes, property lists).
class Hid {
 public:
  Hid() = default;
  explicit Hid(hid_t h, herr_t (*close)(hid_t)) : h_(h), close_(close) {}
  Hid(Hid&& o) noexcept : h_(std::exchange(o.h_, -1)), close_(o.close_) {}
  Hid& operator=(Hid&& o) noexcept {
    Reset();
    h_ = std::exchange(o.h_, -1);
    close_ = o.close_;
    return *this;
  }
  ~Hid() { Reset(); }
  hid_t get() const { return h_; }
  bool ok() const { return h_ >= 0; }
  void Reset() {
    if (h_ >= 0 && close_) close_(h_);
    h_ = -1;
  }

 private:
  hid_t h_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

Status H5Error(const std::string& what) { return IoError("HDF5: ", what); }

Status WriteAttr(hid_t obj, const char* name, hid_t mem_type, hid_t file_type, const void* value) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || H5Awrite(attr.get(), mem_type, value) < 0) return H5Error(std::string("writing attribute ") + name);
  return Status();
}
Status AttrInt(hid_t obj, const char* name, int64_t v) { return WriteAttr(obj, name, H5T_NATIVE_INT64, H5T_STD_I64LE, &v); }
Status AttrDouble(hid_t obj, const char* name, double v) { return WriteAttr(obj, name, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, &v); }
// Variable-length UTF-8: h5py reads it as str (a fixed-length ASCII string comes back as bytes).
Status AttrStr(hid_t obj, const char* name, const std::string& v) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const char* p = v.c_str();
  return WriteAttr(obj, name, type.get(), type.get(), &p);
}

bool HasAttr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

// An attribute, as untrusted input: it must hold exactly one value (a scalar dataspace, or a simple one
// of one element) of the expected class before anything is read into a buffer sized for one value.
Result<Hid> OpenScalarAttr(hid_t obj, const char* name, H5T_class_t want, const char* what) {
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) return DataLossError("attribute ", name, " unreadable");
  Hid space(H5Aget_space(a.get()), H5Sclose);
  const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (n != 1) return DataLossError("attribute ", name, " holds ", n, " values, not one ", what);
  Hid type(H5Aget_type(a.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != want) return DataLossError("attribute ", name, " is not ", what);
  return a;
}
Result<int64_t> ReadAttrInt(hid_t obj, const char* name) {
  ASSIGN_OR_RETURN(Hid a, OpenScalarAttr(obj, name, H5T_INTEGER, "an integer"));
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) return DataLossError("attribute ", name, " is not an integer");
  return v;
}
Result<double> ReadAttrDouble(hid_t obj, const char* name) {
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Hid type(H5Aget_type(a.get()), H5Tclose);
  const H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  ASSIGN_OR_RETURN(Hid checked, OpenScalarAttr(obj, name, cls == H5T_INTEGER ? H5T_INTEGER : H5T_FLOAT, "a number"));
  double v = 0;
  if (H5Aread(checked.get(), H5T_NATIVE_DOUBLE, &v) < 0 || !std::isfinite(v)) return DataLossError("attribute ", name, " is not a finite number");
  return v;
}
Result<std::string> ReadAttrStr(hid_t obj, const char* name) {
  ASSIGN_OR_RETURN(Hid a, OpenScalarAttr(obj, name, H5T_STRING, "a string"));
  Hid type(H5Aget_type(a.get()), H5Tclose);
  if (H5Tis_variable_str(type.get()) > 0) {
    char* s = nullptr;
    Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    if (H5Aread(a.get(), mem.get(), &s) < 0 || s == nullptr) return DataLossError("attribute ", name, " unreadable");
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  if (size == 0 || size > (size_t{1} << 26)) return DataLossError("attribute ", name, ": a string of ", size, " bytes");
  std::string out(size, '\0');
  if (H5Aread(a.get(), type.get(), out.data()) < 0) return DataLossError("attribute ", name, " unreadable");
  out.resize(strnlen(out.data(), out.size()));
  return out;
}

// A dataset, as untrusted input: a hard link to data stored in this file (no external link, external
// storage or virtual mapping), a float type or a 2-byte integer marked zrt_dtype = "bf16", and a
// simple dataspace whose size is checked for overflow. `shape` receives its dimensions.
struct DatasetInfo {
  std::vector<int64_t> shape;
  int64_t numel = 1;
  bool bf16_bits = false;  // a 2-byte integer holding bf16 bit patterns
};
Result<DatasetInfo> CheckDataset(hid_t loc, const std::string& path, hid_t ds, const std::string& where) {
  H5L_info_t li;
  if (H5Lget_info(loc, path.c_str(), &li, H5P_DEFAULT) < 0 || li.type != H5L_TYPE_HARD) {
    return InvalidArgumentError(where, ": ", path, " is a soft or external link (only datasets stored in the file are read)");
  }
  Hid dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!dcpl.ok() || H5Pget_external_count(dcpl.get()) != 0 || H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) {
    return InvalidArgumentError(where, ": ", path, " keeps its data in other files (external or virtual storage)");
  }
  DatasetInfo info;
  Hid type(H5Dget_type(ds), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  if (cls == H5T_INTEGER && size == 2) {
    // bf16 stored as its bit patterns: uint16 (zrt's export) or int16 (a torch tensor viewed as int16).
    if (!HasAttr(ds, "zrt_dtype")) return InvalidArgumentError(where, ": ", path, " holds 16-bit integers without zrt_dtype = \"bf16\"");
    ASSIGN_OR_RETURN(std::string d, ReadAttrStr(ds, "zrt_dtype"), where, ": ", path);
    if (d != "bf16") return InvalidArgumentError(where, ": ", path, ": zrt_dtype \"", d, "\" is not bf16");
    info.bf16_bits = true;
  } else if (cls != H5T_FLOAT || (size != 2 && size != 4 && size != 8)) {
    return InvalidArgumentError(where, ": dataset ", path, " is not floating point (float16/32/64, or bf16 bits)");
  }
  const int filters = H5Pget_nfilters(dcpl.get());
  Hid space(H5Dget_space(ds), H5Sclose);
  const H5S_class_t sc = space.ok() ? H5Sget_simple_extent_type(space.get()) : H5S_NO_CLASS;
  if (sc != H5S_SIMPLE && sc != H5S_SCALAR) return InvalidArgumentError(where, ": ", path, " has no elements to read (null dataspace)");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || rank > H5S_MAX_RANK) return DataLossError(where, ": ", path, ": bad rank ", rank);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) return DataLossError(where, ": ", path, ": bad dims");
  for (hsize_t d : dims) {
    if (d > static_cast<hsize_t>(kMaxNumel) || (d != 0 && info.numel > kMaxNumel / static_cast<int64_t>(d))) {
      return InvalidArgumentError(where, ": ", path, " has more than 2^48 elements");
    }
    info.shape.push_back(static_cast<int64_t>(d));
    info.numel *= static_cast<int64_t>(d);
  }
  // Unfiltered data takes its full size in the file: less means chunks never written (a sparse dataset
  // that would make us allocate what the file does not hold).
  const auto stored = static_cast<int64_t>(H5Dget_storage_size(ds));
  if (filters == 0 && info.numel > 0 && stored / static_cast<int64_t>(size) < info.numel) {
    return InvalidArgumentError(where, ": ", path, " stores ", stored, " bytes for ", info.numel, " elements of ", size,
                                " bytes (not fully written)");
  }
  return info;
}

}  // namespace

Status ExportHdf5(const std::string& dir, const std::string& out_path, const ExportOptions& o, const ProgressFn& progress) {
  if (o.dtype != DType::kF32 && o.dtype != DType::kBF16) return InvalidArgumentError("export: --dtype must be f32 or bf16");
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(dir), "export");
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(dir, VerifyLevel::kMetadata, &problems));
  if (!problems.empty()) return DataLossError("export: ", dir, " is not complete: ", problems.front());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors come back as Status, not printed
  const std::string tmp = out_path + ".tmp";
  Hid file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return IoError("export: cannot create ", tmp);
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  RETURN_IF_ERROR(AttrStr(file.get(), "zrt_format", "zrt-hdf5"));
  RETURN_IF_ERROR(AttrInt(file.get(), "version", 1));
  RETURN_IF_ERROR(AttrInt(file.get(), "step", m.step));
  RETURN_IF_ERROR(AttrInt(file.get(), "world_size", m.world_size));
  RETURN_IF_ERROR(AttrInt(file.get(), "stage", m.stage));
  RETURN_IF_ERROR(AttrDouble(file.get(), "loss_scale", m.loss_scale));
  RETURN_IF_ERROR(AttrStr(file.get(), "trainer_state", m.trainer_state.dump()));
  RETURN_IF_ERROR(AttrStr(file.get(), "engine_state", m.engine_state.dump()));
  int64_t order = 0, total = 0, done = 0;

  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
    std::vector<std::string> kinds = {"master"};
    if (o.all_states) {
      for (const std::string& k : ge.kinds) {
        if (k != "master") kinds.push_back(k);
      }
    }
    ASSIGN_OR_RETURN(WholeGroup l, LoadWholeGroup(dir, m, g, kinds), "export");
    if (total == 0) {  // progress in bytes written
      for (const GroupEntry& e : m.groups) {
        for (const TensorEntry& te : e.tensors) total += te.numel * (o.dtype == DType::kBF16 ? 2 : 4) * static_cast<int64_t>(o.all_states ? e.kinds.size() : 1);
      }
    }
    for (size_t t = 0; t < ge.tensors.size(); ++t, ++order) {
      const TensorEntry& te = ge.tensors[t];
      std::vector<hsize_t> dims(te.shape.begin(), te.shape.end());
      Hid space(dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
      const int64_t off = l.view.groups[0].layout.tensor_offset(static_cast<int64_t>(t));
      for (size_t k = 0; k < kinds.size(); ++k) {
        const std::string path = (kinds[k] == "master" ? "/params/" : "/optimizer/" + kinds[k] + "/") + te.name;
        const bool bf16 = o.dtype == DType::kBF16;
        Hid ds(H5Dcreate2(file.get(), path.c_str(), bf16 ? H5T_STD_U16LE : H5T_IEEE_F32LE, space.get(), lcpl.get(), H5P_DEFAULT,
                          H5P_DEFAULT),
               H5Dclose);
        if (!ds.ok()) return H5Error("creating " + path + " in " + tmp);
        const float* src = l.data[k].data() + off;
        herr_t rc;
        if (bf16) {
          std::vector<uint16_t> h(static_cast<size_t>(te.numel));
          for (size_t i = 0; i < h.size(); ++i) h[i] = FloatToBf16(src[i]);
          rc = H5Dwrite(ds.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, h.data());
          if (rc >= 0) RETURN_IF_ERROR(AttrStr(ds.get(), "zrt_dtype", "bf16"));
        } else {
          rc = H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, src);
        }
        if (rc < 0) return H5Error("writing " + path + " in " + tmp);
        RETURN_IF_ERROR(AttrStr(ds.get(), "group", ge.name));
        RETURN_IF_ERROR(AttrInt(ds.get(), "order", order));
        RETURN_IF_ERROR(AttrDouble(ds.get(), "lr", ge.lr));
        RETURN_IF_ERROR(AttrDouble(ds.get(), "weight_decay", ge.weight_decay));
        RETURN_IF_ERROR(AttrStr(ds.get(), "model_dtype", std::string(DTypeName(te.dtype))));
      }
      if (progress) progress(done += te.numel * (o.dtype == DType::kBF16 ? 2 : 4) * static_cast<int64_t>(kinds.size()), total);
    }
  }
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) return H5Error("flushing " + tmp);
  file.Reset();
  // Durable before it takes the final name, and the name durable after.
  RETURN_IF_ERROR(FsyncFile(tmp));
  const std::string parent = fs::path(out_path).has_parent_path() ? fs::path(out_path).parent_path().string() : ".";
  RETURN_IF_ERROR(FsyncDir(parent));
  RETURN_IF_ERROR(RenamePath(tmp, out_path));
  return FsyncDir(parent);
}

namespace {

struct InTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType model_dtype = DType::kF32;
  std::string group = "default";
  int64_t order = 0;
  double lr = 0, weight_decay = 0;
};

// Opens a dataset whose shape must be `shape` (an optimizer state has its parameter's).
Result<std::pair<Hid, DatasetInfo>> OpenShaped(hid_t file, const std::string& path, const std::vector<int64_t>& shape, const std::string& where) {
  Hid ds(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) return DataLossError(where, ": dataset ", path, " is missing");
  ASSIGN_OR_RETURN(DatasetInfo info, CheckDataset(file, path, ds.get(), where));
  if (info.shape != shape) {
    return InvalidArgumentError(where, ": ", path, " has shape ", TensorSpec{path, info.shape, DType::kF32}.ToString(),
                                ", its parameter ", TensorSpec{path, shape, DType::kF32}.ToString());
  }
  return std::pair<Hid, DatasetInfo>(std::move(ds), std::move(info));
}

// Reads a whole dataset as float; its shape must be `shape`.
Result<std::vector<float>> ReadTensor(hid_t file, const std::string& path, const std::vector<int64_t>& shape, const std::string& where) {
  ASSIGN_OR_RETURN(auto opened, OpenShaped(file, path, shape, where));
  const Hid& ds = opened.first;
  const DatasetInfo& info = opened.second;
  std::vector<float> out;
  try {  // the size comes from the file
    out.resize(static_cast<size_t>(info.numel));
  } catch (const std::exception&) {
    return OutOfMemoryError(where, ": no memory for the ", info.numel, " elements of ", path);
  }
  if (info.numel == 0) return out;
  herr_t rc = -1;
  if (!info.bf16_bits) {
    rc = H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());  // HDF5 converts
  } else {
    std::vector<uint16_t> h(out.size());
    rc = H5Dread(ds.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, h.data());  // int16 bits read as they are
    for (size_t i = 0; i < h.size(); ++i) out[i] = Bf16ToFloat(h[i]);
  }
  if (rc < 0) return IoError(where, ": reading ", path);
  return out;
}

// The parameters: every dataset directly under /params, with the attributes an export writes.
Result<std::vector<InTensor>> ReadParamList(hid_t params, const std::string& in_path) {
  std::vector<InTensor> tensors;
  H5G_info_t info;
  H5Gget_info(params, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[1024];
    if (H5Lget_name_by_idx(params, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof(name), H5P_DEFAULT) < 0) continue;
    H5L_info_t li;
    if (H5Lget_info(params, name, &li, H5P_DEFAULT) < 0 || li.type != H5L_TYPE_HARD) {
      return InvalidArgumentError("import: /params/", name, " in ", in_path, " is a soft or external link (only datasets stored in the file are read)");
    }
    Hid ds(H5Dopen2(params, name, H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) return InvalidArgumentError("import: /params/", name, " in ", in_path, " is not a dataset (unexpected layout)");
    InTensor t;
    t.name = name;
    t.order = static_cast<int64_t>(i);
    ASSIGN_OR_RETURN(DatasetInfo di, CheckDataset(params, name, ds.get(), in_path), "import");
    t.shape = di.shape;
    if (HasAttr(ds.get(), "group")) {
      ASSIGN_OR_RETURN(t.group, ReadAttrStr(ds.get(), "group"), in_path, ": ", name);
    }
    if (HasAttr(ds.get(), "order")) {
      ASSIGN_OR_RETURN(t.order, ReadAttrInt(ds.get(), "order"), in_path, ": ", name);
    }
    if (HasAttr(ds.get(), "lr")) {
      ASSIGN_OR_RETURN(t.lr, ReadAttrDouble(ds.get(), "lr"), in_path, ": ", name);
    }
    if (HasAttr(ds.get(), "weight_decay")) {
      ASSIGN_OR_RETURN(t.weight_decay, ReadAttrDouble(ds.get(), "weight_decay"), in_path, ": ", name);
    }
    if (HasAttr(ds.get(), "model_dtype")) {
      ASSIGN_OR_RETURN(std::string d, ReadAttrStr(ds.get(), "model_dtype"), in_path, ": ", name);
      ASSIGN_OR_RETURN(t.model_dtype, ParseDType(d), in_path, ": ", name);
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

// The file's counters and states (attributes of the root).
Result<Manifest> ReadCounters(hid_t file, const std::string& in_path) {
  Manifest m;
  if (HasAttr(file, "step")) {
    ASSIGN_OR_RETURN(m.step, ReadAttrInt(file, "step"), in_path);
    if (m.step < 0) return InvalidArgumentError("import: ", in_path, ": negative step ", m.step);
  }
  if (HasAttr(file, "loss_scale")) {
    ASSIGN_OR_RETURN(m.loss_scale, ReadAttrDouble(file, "loss_scale"), in_path);
    if (!(m.loss_scale > 0)) return InvalidArgumentError("import: ", in_path, ": loss_scale must be > 0");
  }
  if (HasAttr(file, "trainer_state")) {
    ASSIGN_OR_RETURN(std::string ts, ReadAttrStr(file, "trainer_state"), in_path);
    m.trainer_state = nlohmann::json::parse(ts, nullptr, false);
    if (m.trainer_state.is_discarded()) return DataLossError("import: ", in_path, ": trainer_state is not JSON");
  }
  if (HasAttr(file, "engine_state")) {
    ASSIGN_OR_RETURN(std::string es, ReadAttrStr(file, "engine_state"), in_path);
    m.engine_state = nlohmann::json::parse(es, nullptr, false);
    if (!m.engine_state.is_object()) return DataLossError("import: ", in_path, ": engine_state is not a JSON object");
  }
  return m;
}

}  // namespace

Status ImportHdf5(const std::string& in_path, const std::string& out_root, const ImportOptions& o, const ProgressFn& progress) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  if (!fs::exists(in_path)) return NotFoundError("import: ", in_path, " does not exist");
  Hid file(H5Fopen(in_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return DataLossError("import: ", in_path, " is not an HDF5 file");
  Hid params(H5Gopen2(file.get(), "/params", H5P_DEFAULT), H5Gclose);
  if (!params.ok()) return InvalidArgumentError("import: ", in_path, " has no /params group (unexpected layout)");
  ASSIGN_OR_RETURN(std::vector<InTensor> tensors, ReadParamList(params.get(), in_path));
  if (tensors.empty()) return InvalidArgumentError("import: ", in_path, " has no tensors under /params");
  std::sort(tensors.begin(), tensors.end(), [](const InTensor& a, const InTensor& b) { return a.order < b.order; });
  // Optimizer state kinds present for every tensor.
  std::vector<std::string> kinds = {"master"};
  for (const char* k : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
    int have = 0;
    for (const InTensor& t : tensors) {
      // H5Lexists needs every link on the way to exist.
      const std::string dir = "/optimizer/" + std::string(k);
      have += H5Lexists(file.get(), "/optimizer", H5P_DEFAULT) > 0 && H5Lexists(file.get(), dir.c_str(), H5P_DEFAULT) > 0 &&
              H5Lexists(file.get(), (dir + "/" + t.name).c_str(), H5P_DEFAULT) > 0;
    }
    if (have == static_cast<int>(tensors.size())) kinds.push_back(k);
    else if (have > 0) return InvalidArgumentError("import: /optimizer/", k, " in ", in_path, " covers only some tensors");
  }
  // Every state has its parameter's shape, checked now: a state of an empty tensor is never read.
  for (size_t k = 1; k < kinds.size(); ++k) {
    for (const InTensor& t : tensors) RETURN_IF_ERROR(OpenShaped(file.get(), "/optimizer/" + kinds[k] + "/" + t.name, t.shape, in_path).status(), "import");
  }
  ASSIGN_OR_RETURN(Manifest m, ReadCounters(file.get(), in_path));
  std::vector<FullTensor> full;
  for (const InTensor& t : tensors) full.push_back({t.name, t.shape, t.model_dtype, t.group, t.lr, t.weight_decay});
  // The last tensor read stays cached (consecutive shards share it).
  std::string cached_path;
  std::vector<float> cached;
  auto read = [&](size_t t, const std::string& kind, int64_t offset, int64_t count, float* out) -> Status {
    const std::string path = (kind == "master" ? "/params/" : "/optimizer/" + kind + "/") + tensors[t].name;
    if (path != cached_path) {
      cached_path.clear();
      ASSIGN_OR_RETURN(cached, ReadTensor(file.get(), path, tensors[t].shape, in_path));
      cached_path = path;
    }
    std::memcpy(out, cached.data() + offset, static_cast<size_t>(count) * 4);
    return Status();
  };
  std::map<std::string, std::vector<std::string>> group_kinds;
  for (const InTensor& t : tensors) group_kinds[t.group] = kinds;
  return WriteCheckpointFromFull(out_root, full, group_kinds, std::move(m), read, o, progress);
}

}  // namespace zrt::ckpt
