#include "zrt/core/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>

namespace zrt {
namespace {
thread_local const ThreadPool* tls_current_pool = nullptr;
}  // namespace

ThreadPool::ThreadPool(int workers, std::string name, std::function<void()> on_start) {
  threads_.reserve(workers > 0 ? workers : 0);
  for (int i = 0; i < workers; ++i) {
    threads_.emplace_back([this, on_start] {
      tls_current_pool = this;
      if (on_start) on_start();
      WorkerLoop();
    });
    std::string tname = name + "-" + std::to_string(i);
    if (tname.size() > 15) tname = tname.substr(tname.size() - 15);
    pthread_setname_np(threads_.back().native_handle(), tname.c_str());
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

int ThreadPool::HardwareThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::MakeBackground() {
  const sched_param none{};
  (void)::pthread_setschedparam(::pthread_self(), SCHED_BATCH, &none);
}

int ThreadPool::LauncherRanksPerNode() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

int ThreadPool::CoresPerRank() {
  const int64_t online = HardwareThreads();
  int64_t mine = online;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) mine = std::clamp<int64_t>(CPU_COUNT(&set), 1, online);
  // Ranks sharing these cores: as many as the node's ranks' masks of this size overlap here.
  const int64_t sharing = std::max<int64_t>(1, (LauncherRanksPerNode() * mine + online - 1) / online);
  return static_cast<int>(std::max<int64_t>(1, mine / sharing));
}

void ThreadPool::Enqueue(std::function<void()> task) {
  if (threads_.empty()) {
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn, int max_parallelism) {
  if (n <= 0) return;
  int helpers = workers();
  if (max_parallelism > 0 && max_parallelism - 1 < helpers) helpers = max_parallelism - 1;
  if (helpers > n - 1) helpers = static_cast<int>(n - 1);
  if (helpers <= 0 || tls_current_pool == this) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Shared state outlives this call if a helper starts late: such a helper finds no index left and
  // never touches `fn`, which lives on this stack frame.
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto st = std::make_shared<State>();
  const std::function<void(int64_t)>* f = &fn;
  auto drain = [st, f, n] {
    int64_t finished = 0;
    for (int64_t i; (i = st->next.fetch_add(1, std::memory_order_relaxed)) < n; ++finished) (*f)(i);
    if (finished > 0 && st->done.fetch_add(finished, std::memory_order_acq_rel) + finished == n) {
      std::lock_guard<std::mutex> lock(st->mu);
      st->cv.notify_all();
    }
  };
  for (int h = 0; h < helpers; ++h) Enqueue(drain);
  drain();
  std::unique_lock<std::mutex> lock(st->mu);
  st->cv.wait(lock, [&] { return st->done.load(std::memory_order_acquire) == n; });
}

}  // namespace zrt
