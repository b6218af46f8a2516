// A fixed set of worker threads for data-parallel kernels.
//
// parallel_for is called many times per token (every matmul of every layer).
// Tasks are claimed from one atomic word holding (generation, next task), so
// the caller never waits for a worker to wake up: if the workers are asleep or
// descheduled (an oversubscribed machine), the caller simply runs every task
// itself and returns. Workers spin briefly, then sleep on a futex.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace reprise {

class ThreadPool {
 public:
  // n_threads counts the calling thread: n_threads == 1 runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(task) for task in [0, n_tasks) across the pool and returns when
  // all are done. Not reentrant; one caller at a time (callers serialise
  // through the engine's forward lock).
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();
  // Claims and runs tasks of generation `gen` until none are left.
  void run_tasks(uint32_t gen);

  int n_threads_;
  std::vector<std::thread> workers_;
  // High 32 bits: generation; low 32 bits: next unclaimed task.
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> n_tasks_{0};
  std::atomic<const std::function<void(int64_t)>*> fn_{nullptr};
  std::atomic<int64_t> completed_{0};
  std::atomic<bool> stop_{false};
  uint32_t generation_ = 0;  // caller-side copy
};

}  // namespace reprise
