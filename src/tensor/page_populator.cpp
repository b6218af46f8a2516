#include "tensor/page_populator.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>

#include "tensor/huge_pages.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the name
#endif

namespace reprise {
namespace {

// Lowers the calling thread to SCHED_IDLE: it then runs only on a CPU that
// no other thread of the system wants. Where that is refused, the lowest
// nice value does almost as well.
void become_idle_priority() {
  sched_param param{};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &param) != 0) {
    // A thread's nice value is its own on Linux (setpriority on its id).
    (void)nice(19);
  }
  pthread_setname_np(pthread_self(), "rp-populate");
}

double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The CPU time the process's other threads have used.
double others_cpu_seconds() {
  return cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
}

// How long a quiet spell lasts before a step, and how busy the process's
// other threads may be in it (a tenth of a CPU: a server between requests).
constexpr auto kQuietWindow = std::chrono::milliseconds(2);
constexpr double kQuietCpuShare = 0.1;

}  // namespace

PagePopulator& PagePopulator::shared() {
  static PagePopulator populator;
  static const bool from_env = [] {
    const char* env = std::getenv("REPRISE_POPULATE");
    if (env && std::atoi(env) == 0) populator.set_enabled(false);
    return true;
  }();
  (void)from_env;
  return populator;
}

PagePopulator::~PagePopulator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool PagePopulator::enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return enabled_ && !refused_;
}

void PagePopulator::set_enabled(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  enabled_ = on;
}

void PagePopulator::populate(std::shared_ptr<const void> keep, uint8_t* begin, size_t bytes) {
  if (bytes == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!enabled_ || refused_ || stopping_) return;
    queue_.push_back(Range{std::move(keep), begin, bytes});
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  work_.notify_one();
}

void PagePopulator::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void PagePopulator::wait_for_quiet() {
  // SCHED_IDLE alone is not enough: a decode step leaves its CPUs idle for
  // moments (a member waiting at a barrier, the gap between steps), and a
  // huge page faulted in one of them delayed the next step's thread, which
  // made a server's decode slower while its prompts got faster (session 44).
  // So a step waits for a spell in which the process's other threads
  // hardly ran.
  for (;;) {
    const double before = others_cpu_seconds();
    std::unique_lock<std::mutex> lock(mutex_);
    if (work_.wait_for(lock, kQuietWindow, [&] { return stopping_; })) return;
    lock.unlock();
    const double used = others_cpu_seconds() - before;
    if (used < kQuietCpuShare * std::chrono::duration<double>(kQuietWindow).count()) return;
  }
}

void PagePopulator::run() {
  become_idle_priority();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) break;
    Range r = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    for (size_t done = 0; done < r.bytes && !stopping_ && !refused_;) {
      // One huge page's worth at a time, unlocked: the lock is free for
      // new ranges, and a stop waits for one step at most.
      const size_t step = std::min(kHugePageBytes, r.bytes - done);
      lock.unlock();
      wait_for_quiet();
      const int rc = ::madvise(r.begin + done, step, MADV_POPULATE_WRITE);
      const int err = errno;
      lock.lock();
      if (rc != 0) {
        // EINVAL: no such advice in this kernel; anything else (no memory,
        // a signal) leaves the rest of the range to the writer's faults.
        if (err == EINVAL) refused_ = true;
        break;
      }
      done += step;
    }
    {
      // The memory may be unmapped once the range lets go of it; not
      // under the lock, in case this is the last owner.
      Range finished = std::move(r);
      lock.unlock();
      finished.keep.reset();
      lock.lock();
    }
    busy_ = false;
    if (refused_) queue_.clear();
    if (queue_.empty()) idle_.notify_all();
  }
  busy_ = false;
  idle_.notify_all();
}

}  // namespace reprise
