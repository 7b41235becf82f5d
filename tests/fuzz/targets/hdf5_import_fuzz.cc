// libFuzzer target for the HDF5 importer, structure-aware: the input's bytes choose how an HDF5 file
// is built through the HDF5 API (datasets of any type, rank and dimensions, written or sparse;
// attributes of any type, count and content; optimizer datasets of other shapes; soft and external
// links), so the fuzzer explores what zrt's validation sees rather than libhdf5's own parser. Any
// input must give a Status — no crash, overflow, sanitizer report or huge allocation — and whatever
// import accepts must be a complete checkpoint that verifies.
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "zrt/checkpoint/interchange/interchange.h"
#include "tests/fuzz/targets/fuzz_checks.h"
#include "zrt/core/logging.h"

namespace {

namespace fs = std::filesystem;

class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t U8() { return i_ < n_ ? d_[i_++] : 0; }
  uint32_t Below(uint32_t k) { return k == 0 ? 0 : U8() % k; }
  bool Flag() { return U8() & 1; }

 private:
  const uint8_t* d_;
  size_t n_, i_ = 0;
};

hid_t PickType(Bytes& b) {
  switch (b.Below(8)) {
    case 0: return H5Tcopy(H5T_IEEE_F64LE);
    case 1: return H5Tcopy(H5T_STD_U16LE);
    case 2: return H5Tcopy(H5T_STD_I16LE);
    case 3: return H5Tcopy(H5T_STD_I32LE);
    case 4: return H5Tcopy(H5T_STD_U8LE);
    case 5: return H5Tcopy(H5T_IEEE_F32BE);
    case 6: {  // a half float: a 2-byte float type derived from f32
      hid_t t = H5Tcopy(H5T_IEEE_F32LE);
      H5Tset_fields(t, 15, 10, 5, 0, 10);
      H5Tset_size(t, 2);
      H5Tset_ebias(t, 15);
      return t;
    }
    default: return H5Tcopy(H5T_IEEE_F32LE);
  }
}

void AddAttribute(Bytes& b, hid_t obj) {
  static const char* kNames[] = {"group", "order", "lr", "weight_decay", "model_dtype", "zrt_dtype", "step", "loss_scale",
                                 "trainer_state"};
  const char* name = kNames[b.Below(9)];
  if (H5Aexists(obj, name) > 0) return;
  const hsize_t n = 1 + b.Below(b.Flag() ? 300 : 2);
  hid_t space = b.Flag() ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
  const hsize_t count = H5Sget_simple_extent_npoints(space) > 0 ? static_cast<hsize_t>(H5Sget_simple_extent_npoints(space)) : 1;
  hid_t type;
  std::vector<char> value;
  switch (b.Below(4)) {
    case 0: {  // a fixed string
      static const char* kStrings[] = {"bf16", "f32", "f16", "default", "{}", "{\"a\": [1, 2]}", "fp8", "", "g1"};
      const std::string s = kStrings[b.Below(9)];
      type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, std::max<size_t>(s.size(), 1));
      value.resize(std::max<size_t>(s.size(), 1) * count, '\0');
      for (hsize_t i = 0; i < count; ++i) std::memcpy(value.data() + i * std::max<size_t>(s.size(), 1), s.data(), s.size());
      break;
    }
    case 1:
      type = H5Tcopy(H5T_NATIVE_INT64);
      value.resize(8 * count);
      for (hsize_t i = 0; i < count; ++i) {
        const int64_t v = static_cast<int64_t>(b.U8()) - 64 + (b.Flag() ? (int64_t{1} << 62) : 0);
        std::memcpy(value.data() + 8 * i, &v, 8);
      }
      break;
    case 2:
      type = H5Tcopy(H5T_NATIVE_DOUBLE);
      value.resize(8 * count);
      for (hsize_t i = 0; i < count; ++i) {
        const double v = b.Flag() ? 1.0 / 0.0 : static_cast<double>(b.U8()) * 0.01 - 1;
        std::memcpy(value.data() + 8 * i, &v, 8);
      }
      break;
    default:
      type = H5Tcopy(H5T_NATIVE_UINT8);
      value.resize(count, static_cast<char>(b.U8()));
      break;
  }
  hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    H5Awrite(a, type, value.data());
    H5Aclose(a);
  }
  H5Tclose(type);
  H5Sclose(space);
}

void AddDataset(Bytes& b, hid_t file, const std::string& path, hid_t lcpl) {
  const int rank = static_cast<int>(b.Below(4));
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  const bool huge = b.Below(16) == 0;
  hsize_t n = 1;
  for (hsize_t& d : dims) {
    d = huge ? (hsize_t{1} << (10 + b.Below(40))) : b.Below(9);
    n *= d;
  }
  hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (huge || b.Below(4) == 0) {
    std::vector<hsize_t> chunk(dims.size(), 1);
    if (rank > 0) H5Pset_chunk(dcpl, rank, chunk.data());
  }
  hid_t type = PickType(b);
  hid_t ds = H5Dcreate2(file, path.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT);
  if (ds >= 0) {
    if (!huge && b.Below(5) != 0 && n < 4096) {  // written (else sparse)
      std::vector<float> data(n);
      for (float& v : data) v = static_cast<float>(b.U8()) * 0.01f;
      H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
    }
    for (uint32_t k = b.Below(4); k > 0; --k) AddAttribute(b, ds);
    H5Dclose(ds);
  }
  H5Tclose(type);
  H5Pclose(dcpl);
  H5Sclose(space);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zrt::SetLogLevel(zrt::LogLevel::kError);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path base = zrt::fuzz::ScratchDir("zrt_h5fuzz_");
  std::error_code ec;
  fs::remove_all(base, ec);
  fs::create_directories(base, ec);
  const std::string file_path = (base / "in.h5").string(), other = (base / "other.h5").string();
  Bytes b(data, size);
  hid_t file = H5Fcreate(file_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) return 0;
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  static const char* kNames[] = {"w", "b", "e", "a.b", "x/y"};
  const uint32_t tensors = 1 + b.Below(3);
  for (uint32_t t = 0; t < tensors; ++t) AddDataset(b, file, std::string("/params/") + kNames[b.Below(5)], lcpl);
  for (const char* kind : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
    if (!b.Flag()) continue;
    for (const char* n : kNames) {
      if (b.Flag()) AddDataset(b, file, std::string("/optimizer/") + kind + "/" + n, lcpl);
    }
  }
  switch (b.Below(6)) {
    case 0: H5Lcreate_soft("/params/w", file, "/params/soft", lcpl, H5P_DEFAULT); break;
    case 1: H5Lcreate_external(other.c_str(), "/params/w", file, "/params/ext", lcpl, H5P_DEFAULT); break;
    case 2: H5Gclose(H5Gcreate2(file, "/params/group", lcpl, H5P_DEFAULT, H5P_DEFAULT)); break;
    default: break;
  }
  for (uint32_t k = b.Below(4); k > 0; --k) AddAttribute(b, file);
  H5Pclose(lcpl);
  H5Fclose(file);
  zrt::ckpt::ImportOptions o;
  o.world_size = 1 + static_cast<int>(b.Below(3));
  o.stage = static_cast<int>(b.Below(4));
  const std::string out = (base / "out").string();
  if (zrt::ckpt::ImportHdf5(file_path, out, o).ok()) zrt::fuzz::AbortUnlessEveryCheckpointVerifies(out);
  return 0;
}
