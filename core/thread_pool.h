// ThreadPool: owned, named, joined worker threads (../shared/STYLE.md item 7).
//
// ParallelFor hands indices out dynamically to the workers *and* the calling thread, so a pool of
// N-1 workers gives N-way parallelism and a pool of 0 workers runs everything inline. Work items must
// not throw. Thread-safety: every method may be called from any thread, including concurrently; a
// ParallelFor called from inside a pool task runs inline (no deadlock).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace zrt {

class ThreadPool {
 public:
  // Starts `workers` threads (>= 0) named "<name>-<i>" (15 characters at most are kept by Linux);
  // each runs `on_start` first (e.g. to set its priority).
  explicit ThreadPool(int workers, std::string name = "zrt-pool", std::function<void()> on_start = {});
  ~ThreadPool();  // finishes queued tasks, then joins every worker
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int workers() const { return static_cast<int>(threads_.size()); }

  // Calls fn(i) for every i in [0, n), using at most `max_parallelism` threads including the caller
  // (<= 0: all workers + caller). Returns when every call has returned.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn, int max_parallelism = 0);

  // Runs fn on a worker (inline when the pool has no workers); the future carries its result.
  template <typename F>
  auto Submit(F&& fn) -> std::future<std::invoke_result_t<F>> {
    using R = std::invoke_result_t<F>;
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(fn));
    std::future<R> fut = task->get_future();
    Enqueue([task] { (*task)(); });
    return fut;
  }

  // Number of hardware threads, at least 1.
  static int HardwareThreads();
  // Ranks on this node as the launcher tells them (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS or
  // SLURM_NTASKS_PER_NODE, the first set); 1 when none is.
  static int LauncherRanksPerNode();
  // The cores this rank (the calling thread's affinity) may use, shared fairly with the other ranks of
  // its node: every rank unbound (the mask is the whole machine) gets cores / ranks; ranks bound to
  // cores of their own get theirs; masks that overlap are divided by how many ranks fit on them. At
  // least 1. EngineConfig::optimizer_threads' default.
  static int CoresPerRank();
  // Marks the calling thread as background work (SCHED_BATCH, Linux): waking it never preempts the
  // thread that woke it (training, on busy cores, would otherwise lose its slice to a copy or a write
  // at every hand-over); its share of the cores is unchanged. Best effort.
  static void MakeBackground();

 private:
  void Enqueue(std::function<void()> task);
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace zrt
