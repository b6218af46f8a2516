// A fixed set of worker threads for data-parallel kernels.
//
// parallel_for is called dozens of times per decoded token (every matmul and
// attention of every layer), so a dispatch is one atomic store that spinning
// workers see within a few hundred nanoseconds. Workers that find nothing to
// do spin for a bounded time (about 30 us, enough to stay awake across the
// serial steps between the products of one forward pass) and then sleep on a
// futex, so an idle pool costs nothing and an oversubscribed machine is not
// made worse by long PAUSE loops.
//
// A worker asleep when work arrives takes ~0.5-2 ms to run again on this
// VM (its vCPU has halted and the host must schedule it), so code that knows
// work is coming can ask the workers to wake and spin until then
// (keep_awake), and a decode team, which cannot start without every
// member, runs only while they are awake (workers_awake).
//
// Completion is counted per task, not per worker: a worker that was
// descheduled while a job ran never holds up the caller, and a worker that
// wakes late cannot claim tasks of a later job (job id and task index are
// claimed together with one compare-and-swap).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
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

  // One T per pool for the thread that dispatches to it: the scratch a
  // forward pass grows to its batch (activations, widened K/V). Callers use
  // a pool one at a time, so one instance per pool serves them all; as
  // thread_local, every HTTP thread that ever led a pass kept its own copy
  // (tens of MB each for a mid-sized model). Only that caller may use it,
  // and only while it is the pool's caller; not from inside tasks.
  template <typename T>
  T& caller_local() {
    static const size_t slot = next_caller_slot();
    if (slot >= caller_locals_.size()) caller_locals_.resize(slot + 1);
    std::shared_ptr<void>& p = caller_locals_[slot];
    if (!p) p = std::make_shared<T>();
    return *static_cast<T*>(p.get());
  }

  // Wakes sleeping workers and keeps every worker spinning for up to
  // `micros` from now, or until the next job, for work that is about to
  // arrive (a request was received). Any thread may call it, at any time.
  void keep_awake(double micros);
  // Whether no worker is asleep (a job published now would start on every
  // thread within microseconds).
  bool workers_awake() const { return sleepers_.load(std::memory_order_seq_cst) == 0; }
  // keep_awake(micros), then waits up to as long for every worker to be
  // awake (yielding its CPU meanwhile); returns workers_awake().
  bool wake_workers(double micros);

  // Runs fn(task) for task in [0, n_tasks) across the pool and returns when
  // all are done. Tasks are claimed dynamically. Not reentrant; one caller at
  // a time (callers serialise through the model's forward pass).
  template <typename Fn>
  void parallel_for(int64_t n_tasks, Fn&& fn) {
    if (n_tasks <= 0) return;
    if (workers_.empty() || n_tasks == 1) {
      for (int64_t t = 0; t < n_tasks; ++t) fn(t);
      return;
    }
    using F = std::remove_reference_t<Fn>;
    run(n_tasks, [](void* ctx, int64_t t) { (*static_cast<F*>(ctx))(t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void*, int64_t);
  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void worker_loop();
  // Wakes the workers asleep on wake_word_, if any.
  void wake_sleepers();
  // Claims and runs tasks of job `job` until none are left; returns the
  // number run.
  int64_t run_tasks(uint32_t job);

  // A process-wide index per caller_local type.
  static size_t next_caller_slot();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::vector<std::shared_ptr<void>> caller_locals_;
  // Job id (high 32 bits) and next task index (low 32 bits).
  alignas(64) std::atomic<uint64_t> claim_{0};
  alignas(64) std::atomic<int64_t> done_{0};
  // The current job id, and the futex word sleeping workers wait on (bumped
  // to wake them: by a new job, keep_awake or the destructor); sleepers_
  // counts workers asleep or about to be.
  alignas(64) std::atomic<uint32_t> job_seq_{0};
  std::atomic<uint32_t> wake_word_{0};
  std::atomic<int> sleepers_{0};
  // Workers spin, rather than sleep, until this time-stamp counter value.
  std::atomic<uint64_t> awake_until_{0};
  std::atomic<bool> stop_{false};
  // Published by the release store of claim_/job_seq_; stable while the job
  // has unclaimed or running tasks.
  std::atomic<int64_t> n_tasks_{0};
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace reprise
