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
#include <system_error>

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
// 10 ms rather than less, so that a server whose requests come back to
// back (gaps of a few ms) leaves its faults to the requests, as before,
// rather than having a step of ~4 ms run into the next request.
constexpr auto kQuietWindow = std::chrono::milliseconds(10);
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
  if (!thread_.joinable()) return;
  // Back to normal priority to stop: at SCHED_IDLE the thread could wait
  // long for a CPU on a busy machine before it saw the stop. (Refused
  // without the privilege to raise it; it then stops when it gets a CPU.)
  sched_param param{};
  pthread_setschedparam(thread_.native_handle(), SCHED_OTHER, &param);
  thread_.join();
}

bool PagePopulator::enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return enabled_ && !refused_;
}

void PagePopulator::set_enabled(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  enabled_ = on;
}

void PagePopulator::populate(std::weak_ptr<const void> owner, uint8_t* begin, size_t bytes) {
  if (bytes == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!enabled_ || refused_ || stopping_) return;
    queue_.push_back(Range{std::move(owner), begin, bytes});
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread([this] { run(); });
      } catch (const std::system_error&) {
        // No thread to be had (a process at its limit): populating is only
        // a head start, so the writers fault their pages in as before.
        queue_.clear();
        refused_ = true;
        return;
      }
    }
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
    const Range r = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    // One huge page's worth a step, unlocked: the lock stays free for new
    // ranges, and a stop waits for one step at most.
    lock.unlock();
    for (size_t done = 0; done < r.bytes;) {
      wait_for_quiet();
      const std::shared_ptr<const void> owner = r.owner.lock();
      if (!owner) break;  // the memory went back to the system
      {
        std::lock_guard<std::mutex> check(mutex_);
        if (stopping_ || refused_) break;
      }
      const size_t step = std::min(kHugePageBytes, r.bytes - done);
      if (::madvise(r.begin + done, step, MADV_POPULATE_WRITE) != 0) {
        // EINVAL: no such advice in this kernel; anything else (no memory,
        // a signal) leaves the rest of the range to the writer's faults.
        if (errno == EINVAL) {
          std::lock_guard<std::mutex> refuse(mutex_);
          refused_ = true;
        }
        break;
      }
      done += step;
    }
    lock.lock();
    busy_ = false;
    if (refused_) queue_.clear();
    if (queue_.empty()) idle_.notify_all();
  }
  busy_ = false;
  idle_.notify_all();
}

}  // namespace reprise
