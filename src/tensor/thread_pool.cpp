#include "tensor/thread_pool.h"

#include <immintrin.h>

namespace reprise {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
  for (;;) {
    int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    (*fn_)(task);
  }
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_task_.store(0);
    busy_workers_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_tasks();
  while (busy_workers_.load(std::memory_order_acquire) != 0) _mm_pause();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little: the next parallel_for usually follows within microseconds.
    bool got = false;
    for (int spin = 0; spin < 20000; ++spin) {
      if (generation_.load(std::memory_order_acquire) != seen) { got = true; break; }
      _mm_pause();
    }
    if (!got) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
      seen = generation_.load();
    }
    run_tasks();
    busy_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace reprise
