#include "tensor/thread_pool.h"

#include <immintrin.h>

namespace reprise {

namespace {
// Spin iterations before a worker sleeps on the futex. Short on purpose: when
// the machine is oversubscribed, a spinning worker steals the core the
// dispatching thread needs.
constexpr int kSpinBeforeSleep = 2000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  state_.fetch_add(uint64_t(1) << 32, std::memory_order_release);
  state_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks(uint32_t gen) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(s >> 32) != gen) return;  // a newer dispatch began
    const int64_t task = static_cast<int64_t>(s & 0xffffffffu);
    // n_tasks_ may already belong to a newer generation; the CAS below then
    // fails (the generation changed) and we return at the check above.
    if (task >= n_tasks_.load(std::memory_order_acquire)) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // The task is ours and its generation is current until it completes, so
    // fn_ still holds this generation's function.
    (*fn_.load(std::memory_order_acquire))(task);
    completed_.fetch_add(1, std::memory_order_release);
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  // Close the previous generation first (an exhausted index under a new
  // generation), so no straggler can claim against the new task count with
  // the old generation; then publish the new work under the next generation.
  state_.store((static_cast<uint64_t>(++generation_) << 32) | 0xffffffffu, std::memory_order_seq_cst);
  fn_.store(&fn, std::memory_order_relaxed);
  n_tasks_.store(n_tasks, std::memory_order_relaxed);
  completed_.store(0, std::memory_order_relaxed);
  state_.store(static_cast<uint64_t>(++generation_) << 32, std::memory_order_release);
  state_.notify_all();
  run_tasks(generation_);
  // Only tasks already claimed by a worker can still be running.
  for (int spins = 0; completed_.load(std::memory_order_acquire) != n_tasks; ++spins) {
    if (spins < kSpinBeforeSleep) _mm_pause();
    else std::this_thread::yield();
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    uint64_t s;
    int spins = 0;
    while (static_cast<uint32_t>((s = state_.load(std::memory_order_acquire)) >> 32) == seen) {
      if (++spins < kSpinBeforeSleep) {
        _mm_pause();
      } else {
        state_.wait(s, std::memory_order_acquire);
        spins = 0;
      }
    }
    if (stop_.load()) return;
    seen = static_cast<uint32_t>(s >> 32);
    run_tasks(seen);
  }
}

}  // namespace reprise
