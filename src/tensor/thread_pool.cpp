#include "tensor/thread_pool.h"

#include <immintrin.h>

namespace reprise {

namespace {
// Spin iterations before a worker sleeps on the futex. Short on purpose: when
// the machine is oversubscribed (2 cores shared with other processes), a
// spinning worker steals the core the dispatching thread needs.
constexpr int kSpinBeforeSleep = 1000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
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
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  pending_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  run_tasks();
  for (int spins = 0; pending_workers_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kSpinBeforeSleep) _mm_pause();
    else std::this_thread::yield();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g;
    int spins = 0;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      _mm_pause();
      if (++spins >= kSpinBeforeSleep) {
        generation_.wait(seen, std::memory_order_acquire);
        spins = 0;
      }
    }
    seen = g;
    if (stop_.load()) return;
    run_tasks();
    pending_workers_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace reprise
