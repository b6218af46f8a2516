// A fixed set of worker threads for data-parallel kernels.
//
// parallel_for is called many times per token (every matmul of every layer), so
// dispatch is a generation counter the workers spin on briefly before sleeping
// on it (futex): the per-call cost stays in the microseconds while idle workers
// cost nothing.
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
  // all are done. Tasks are claimed dynamically. Not reentrant; one caller at
  // a time (callers serialise through the model's forward pass).
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();
  void run_tasks();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> pending_workers_{0};
  std::atomic<bool> stop_{false};
  // Published to workers by the release increment of generation_.
  int64_t n_tasks_ = 0;
  const std::function<void(int64_t)>* fn_ = nullptr;
};

}  // namespace reprise
