// HDF5 import as untrusted input: files made here with the HDF5 C API, each hostile in one way the
// read-side campaign found (an optimizer dataset larger than its parameter, array-valued attributes,
// a huge sparse dataset, an unknown zrt_dtype, links and storage outside the file), are refused with
// an error naming the dataset — no overflow, no crash, nothing read elsewhere — and a torch-style
// int16 view of bf16 is accepted.
#include "zrt/checkpoint/interchange/interchange.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <vector>

#include "tests/support/synthetic_state.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/load.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

class Hdf5ImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zrt_h5_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A file with /params/w (4 x 6 float32) and /params/b (6), plus whatever `hostile` adds.
  std::string Make(const std::string& name, const std::function<void(hid_t file)>& hostile) {
    const std::string path = (dir_ / name).string();
    hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    auto dataset = [&](const char* p, std::vector<hsize_t> dims, float v) {
      hid_t s = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
      hid_t d = H5Dcreate2(f, p, H5T_IEEE_F32LE, s, lcpl, H5P_DEFAULT, H5P_DEFAULT);
      hsize_t n = 1;
      for (hsize_t x : dims) n *= x;
      std::vector<float> data(n, v);
      H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
      H5Dclose(d);
      H5Sclose(s);
    };
    dataset("/params/w", {4, 6}, 1.5f);
    dataset("/params/b", {6}, -2.0f);
    if (hostile) hostile(f);
    H5Pclose(lcpl);
    H5Fclose(f);
    return path;
  }
  Status Import(const std::string& in) {
    ImportOptions o;
    o.world_size = 2;
    return ImportHdf5(in, (dir_ / "out").string(), o);
  }
  fs::path dir_;
};

void Attr(hid_t obj, const char* name, hid_t type, std::vector<hsize_t> dims, const void* data) {
  hid_t s = dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t a = H5Acreate2(obj, name, type, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, type, data);
  H5Aclose(a);
  H5Sclose(s);
}

TEST_F(Hdf5ImportTest, APlainFileImportsAndLoads) {
  ASSERT_TRUE(Import(Make("ok.h5", nullptr)).ok());
  auto dir = FindLatestComplete((dir_ / "out").string());
  ASSERT_TRUE(dir.ok()) << dir.status();
  StateView v;
  v.world_size = 1;
  StateGroup g;
  g.name = "default";
  g.tensors = {{"w", {4, 6}, DType::kF32}, {"b", {6}, DType::kF32}};
  g.layout = *ShardLayout::Create(g.tensors, 1, 1);
  std::vector<float> master(static_cast<size_t>(g.layout.shard_size()));
  g.buffers = {{"master", DType::kF32, master.data(), g.layout.shard_size()}};
  v.groups.push_back(std::move(g));
  ASSERT_TRUE(Load(*dir, v).ok());
  EXPECT_EQ(master[0], 1.5f);
  EXPECT_EQ(master[24], -2.0f);
}

TEST_F(Hdf5ImportTest, AnOptimizerDatasetOfAnotherShapeIsRefused) {
  for (const auto& dims : std::vector<std::vector<hsize_t>>{{40, 6}, {2, 6}, {6, 4}}) {
    const std::string in = Make("opt.h5", [&](hid_t f) {
      hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
      H5Pset_create_intermediate_group(lcpl, 1);
      for (const char* k : {"/optimizer/exp_avg/", "/optimizer/exp_avg_sq/"}) {
        for (const char* t : {"w", "b"}) {
          const std::vector<hsize_t> d = std::string(t) == "w" ? dims : std::vector<hsize_t>{6};
          hid_t s = H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr);
          std::vector<float> data(d[0] * (d.size() > 1 ? d[1] : 1), 0.5f);
          hid_t ds = H5Dcreate2(f, (std::string(k) + t).c_str(), H5T_IEEE_F32LE, s, lcpl, H5P_DEFAULT, H5P_DEFAULT);
          H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
          H5Dclose(ds);
          H5Sclose(s);
        }
      }
      H5Pclose(lcpl);
    });
    Status s = Import(in);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("/optimizer/exp_avg/w has shape"), std::string_view::npos) << s;
    EXPECT_FALSE(fs::exists(dir_ / "out" / "step-00000000"));
  }
}

// A tensor with no elements has no values to read, so its optimizer datasets are never read while
// the checkpoint is written: their shapes are checked before anything is, and the file is refused.
TEST_F(Hdf5ImportTest, AStateOfAnEmptyTensorMustHaveItsShapeToo) {
  for (const auto& zdims : std::vector<std::vector<hsize_t>>{{27}, {1, 27}, {0, 26}}) {
    const std::string in = Make("empty.h5", [&](hid_t f) {
      hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
      H5Pset_create_intermediate_group(lcpl, 1);
      auto put = [&](const std::string& path, const std::vector<hsize_t>& d) {
        hid_t s = H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr);
        size_t n = 1;
        for (hsize_t x : d) n *= x;
        std::vector<float> data(n, 0.25f);
        hid_t ds = H5Dcreate2(f, path.c_str(), H5T_IEEE_F32LE, s, lcpl, H5P_DEFAULT, H5P_DEFAULT);
        if (n > 0) H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
        H5Dclose(ds);
        H5Sclose(s);
      };
      put("/params/z", {0, 27});
      for (const char* k : {"/optimizer/exp_avg/", "/optimizer/exp_avg_sq/"}) {
        put(std::string(k) + "w", {4, 6});
        put(std::string(k) + "b", {6});
        put(std::string(k) + "z", zdims);
      }
      H5Pclose(lcpl);
    });
    Status s = Import(in);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("/optimizer/exp_avg/z has shape"), std::string_view::npos) << s;
    EXPECT_NE(s.message().find("[0, 27]"), std::string_view::npos) << s;  // the parameter's, beside it
    EXPECT_FALSE(fs::exists(dir_ / "out" / "step-00000000"));
  }
  // With the right shape it imports.
  const std::string ok = Make("empty_ok.h5", [&](hid_t f) {
    const hsize_t d[2] = {0, 27};
    hid_t s = H5Screate_simple(2, d, nullptr);
    H5Dclose(H5Dcreate2(f, "/params/z", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(s);
  });
  EXPECT_TRUE(Import(ok).ok());
}

TEST_F(Hdf5ImportTest, ArrayValuedAttributesAreRefused) {
  std::vector<int64_t> ints(1000, 3);  // under the 64 KiB of a compact attribute
  std::vector<double> doubles(1000, 0.1);
  for (const char* name : {"order", "lr", "step", "group"}) {
    SCOPED_TRACE(name);
    const std::string in = Make("attr.h5", [&](hid_t f) {
      const bool root = std::string(name) == "step";
      hid_t obj = root ? f : H5Dopen2(f, "/params/w", H5P_DEFAULT);
      if (std::string(name) == "group") {
        hid_t type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, 8);
        std::vector<char> strings(8 * 1000, 'x');
        Attr(obj, name, type, {1000}, strings.data());
        H5Tclose(type);
      } else if (std::string(name) == "lr") {
        Attr(obj, name, H5T_NATIVE_DOUBLE, {1000}, doubles.data());
      } else {
        Attr(obj, name, H5T_NATIVE_INT64, {1000}, ints.data());
      }
      if (!root) H5Dclose(obj);
    });
    Status s = Import(in);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("holds 1000 values"), std::string_view::npos) << s;
  }
}

TEST_F(Hdf5ImportTest, AHugeSparseDatasetIsRefusedBeforeAllocating) {
  const std::string in = Make("sparse.h5", [](hid_t f) {
    hsize_t dims[1] = {hsize_t{1} << 40}, chunk[1] = {1024};
    hid_t s = H5Screate_simple(1, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    hid_t d = H5Dcreate2(f, "/params/huge", H5T_IEEE_F32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(s);
  });
  Status s = Import(in);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not fully written"), std::string_view::npos) << s;
}

TEST_F(Hdf5ImportTest, Bf16BitsNeedTheirMarkAndATorchInt16ViewIsAccepted) {
  auto with = [&](hid_t type, const char* mark) {
    return Make("bits.h5", [&](hid_t f) {
      hsize_t dims[1] = {3};
      hid_t s = H5Screate_simple(1, dims, nullptr);
      hid_t d = H5Dcreate2(f, "/params/h", type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      const uint16_t bits[3] = {FloatToBf16(1.0f), FloatToBf16(-3.5f), FloatToBf16(0.25f)};
      H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits);
      if (mark != nullptr) {
        hid_t st = H5Tcopy(H5T_C_S1);
        H5Tset_size(st, std::strlen(mark));
        Attr(d, "zrt_dtype", st, {}, mark);
        H5Tclose(st);
      }
      H5Dclose(d);
      H5Sclose(s);
    });
  };
  EXPECT_NE(Import(with(H5T_STD_U16LE, "fp8")).message().find("is not bf16"), std::string_view::npos);
  EXPECT_NE(Import(with(H5T_STD_U16LE, nullptr)).message().find("without zrt_dtype"), std::string_view::npos);
  EXPECT_TRUE(Import(with(H5T_STD_I16LE, "bf16")).ok());  // torch: t.view(torch.int16)
}

TEST_F(Hdf5ImportTest, NothingIsReadThroughLinksOrFromOtherFiles) {
  const std::string other = Make("other.h5", nullptr);
  Status s = Import(Make("ext.h5", [&](hid_t f) { H5Lcreate_external(other.c_str(), "/params/w", f, "/params/x", H5P_DEFAULT, H5P_DEFAULT); }));
  EXPECT_NE(s.message().find("soft or external link"), std::string_view::npos) << s;
  s = Import(Make("soft.h5", [](hid_t f) { H5Lcreate_soft("/params/w", f, "/params/y", H5P_DEFAULT, H5P_DEFAULT); }));
  EXPECT_NE(s.message().find("soft or external link"), std::string_view::npos) << s;
  s = Import(Make("raw.h5", [&](hid_t f) {
    hsize_t dims[1] = {4};
    hid_t sp = H5Screate_simple(1, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, (dir_ / "outside.bin").c_str(), 0, 16);
    hid_t d = H5Dcreate2(f, "/params/z", H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(sp);
  }));
  EXPECT_NE(s.message().find("other files"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace zrt::ckpt
