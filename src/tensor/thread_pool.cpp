#include "tensor/thread_pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <thread>

namespace reprise {

namespace {

constexpr double kTicksPerMicro = 3000.0;  // ~3 TSC ticks per ns on current x86

// Spin budgets in TSC ticks (the TSC runs at a few GHz): a worker spins this
// long for the next job before sleeping; the caller spins this long for
// stragglers before yielding its core between checks. REPRISE_SPIN_US
// overrides the worker budget (0: always sleep).
uint64_t spin_ticks() {
  static const uint64_t ticks = [] {
    double us = 30.0;
    if (const char* env = std::getenv("REPRISE_SPIN_US")) us = std::atof(env);
    return static_cast<uint64_t>(us * kTicksPerMicro);
  }();
  return ticks;
}
constexpr uint64_t kCallerSpinTicks = 150000;  // ~50 us

constexpr uint32_t kIndexMask = 0xffffffffu;

void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

size_t ThreadPool::next_caller_slot() {
  static std::atomic<size_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  job_seq_.fetch_add(1, std::memory_order_seq_cst);
  wake_sleepers();
  for (auto& t : workers_) t.join();
}

void ThreadPool::wake_sleepers() {
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  wake_word_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&wake_word_);
}

void ThreadPool::keep_awake(double micros) {
  if (workers_.empty() || micros <= 0) return;
  const uint64_t until = __rdtsc() + static_cast<uint64_t>(micros * kTicksPerMicro);
  for (uint64_t cur = awake_until_.load(std::memory_order_seq_cst);
       cur < until && !awake_until_.compare_exchange_weak(cur, until, std::memory_order_seq_cst);) {
  }
  wake_sleepers();
}

bool ThreadPool::wake_workers(double micros) {
  keep_awake(micros);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(micros);
  while (!workers_awake() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  return workers_awake();
}

int64_t ThreadPool::run_tasks(uint32_t job) {
  int64_t ran = 0;
  uint64_t cur = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(cur >> 32) != job) break;
    const int64_t index = static_cast<int64_t>(cur & kIndexMask);
    if (index >= n_tasks_.load(std::memory_order_acquire)) break;
    // A successful claim proves the job is still open, so fn_/ctx_ are its.
    if (!claim_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    fn_(ctx_, index);
    ++ran;
    cur = claim_.load(std::memory_order_acquire);
  }
  return ran;
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  const uint32_t job = job_seq_.load(std::memory_order_relaxed) + 1;
  fn_ = fn;
  ctx_ = ctx;
  n_tasks_.store(n_tasks, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(static_cast<uint64_t>(job) << 32, std::memory_order_release);
  job_seq_.store(job, std::memory_order_seq_cst);
  wake_sleepers();
  // The work keep_awake was waiting for has come: after it the workers
  // sleep again after their usual spin, rather than hold a CPU that the
  // request's other threads (its reply) may need. (A keep_awake for another
  // request that lands just before this is cut short too; that request's
  // own first job wakes the workers.)
  if (awake_until_.load(std::memory_order_relaxed) != 0) awake_until_.store(0, std::memory_order_relaxed);

  const int64_t mine = run_tasks(job);
  if (mine < n_tasks) {
    const uint64_t t0 = __rdtsc();
    while (mine + done_.load(std::memory_order_acquire) < n_tasks) {
      if (__rdtsc() - t0 < kCallerSpinTicks) _mm_pause();
      else std::this_thread::yield();
    }
  }
  // Close the job: a worker still holding its claim word can no longer
  // claim, whatever the next job's task count.
  claim_.store((static_cast<uint64_t>(job) << 32) | kIndexMask, std::memory_order_release);
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    uint32_t job = job_seq_.load(std::memory_order_acquire);
    if (job == seen) {
      const uint64_t t0 = __rdtsc(), budget = spin_ticks();
      for (uint64_t now = t0; (job = job_seq_.load(std::memory_order_acquire)) == seen; now = __rdtsc()) {
        if (now - t0 < budget) {
          _mm_pause();
        } else if (now < awake_until_.load(std::memory_order_relaxed)) {
          // Kept awake for work to come: the request's own threads (its
          // parsing, its reply) may want this CPU meanwhile.
          std::this_thread::yield();
        } else {
          break;
        }
      }
      if (job == seen) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        for (;;) {
          // The word is read before the checks: a job or keep_awake that
          // comes after them bumps it, and the wait returns at once.
          const uint32_t word = wake_word_.load(std::memory_order_seq_cst);
          job = job_seq_.load(std::memory_order_seq_cst);
          if (job != seen || __rdtsc() < awake_until_.load(std::memory_order_seq_cst)) break;
          futex_wait(&wake_word_, word);
        }
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        if (job == seen) continue;  // asked to stay awake: spin again
      }
    }
    seen = job;
    if (stop_.load(std::memory_order_acquire)) return;
    const int64_t ran = run_tasks(job);
    if (ran > 0) done_.fetch_add(ran, std::memory_order_release);
  }
}

}  // namespace reprise
