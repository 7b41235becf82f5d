// gtest main for multi-rank tests: initialises MPI (zrt's thread level), runs the tests on every rank,
// prints the normal report on rank 0 only and failures from every rank with their rank, and exits
// non-zero on any rank's failure (mpiexec then fails).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "zrt/core/mpi_communicator.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto session = zrt::MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "MPI initialisation failed: %s\n", session.status().ToString().c_str());
    return 1;
  }
  const int rank = (*session)->world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && global != 0 && local == 0) std::fprintf(stderr, "a test failed on another rank\n");
  return global;
}
