// Fixture of the multi-rank GPU suites: MPI, this rank's GPU and an NCCL communicator over it; skips
// without a GPU or with fewer GPUs than ranks (NCCL refuses two ranks on one GPU).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>

#include "zrt/core/mpi_communicator.h"
#include "zrt/core/nccl_communicator.h"
#include "tests/gpu/gpu_test_util.h"

namespace zrt::testing {

class NcclFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    ZRT_REQUIRE_GPU();
    auto m = MpiCommunicator::Create(MPI_COMM_WORLD);
    ASSERT_TRUE(m.ok()) << m.status();
    mpi_ = std::move(*m);
    int gpus = 0;
    (void)cudaGetDeviceCount(&gpus);
    if (gpus < mpi_->size()) GTEST_SKIP() << "NCCL needs one GPU per rank: " << mpi_->size() << " ranks, " << gpus << " GPUs";
    auto d = CudaDevice::Create();
    ASSERT_TRUE(d.ok()) << d.status();
    gpu_ = std::move(*d);
    auto c = NcclCommunicator::Create(mpi_.get(), gpu_.get(), {.timeout_seconds = 60});
    ASSERT_TRUE(c.ok()) << c.status();
    nccl_ = std::move(*c);
  }
  int rank() const { return mpi_->rank(); }
  int size() const { return mpi_->size(); }

  std::unique_ptr<MpiCommunicator> mpi_;
  std::unique_ptr<CudaDevice> gpu_;
  std::unique_ptr<NcclCommunicator> nccl_;
};

}  // namespace zrt::testing
