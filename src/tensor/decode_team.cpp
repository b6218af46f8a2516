#include "tensor/decode_team.h"

#include <immintrin.h>
#include <x86intrin.h>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <cstdlib>
#include <exception>
#include <thread>

#include "tensor/cpu_topology.h"
#include "tensor/thread_pool.h"
#include "util/error.h"

namespace reprise {

namespace {

// A share's word: the work's tag (its low 20 bits) and [next, end), 22 bits
// each. Shares alternate between two sets, so a set's stale tag is always
// that of two works before, never the current one.
constexpr int kItemBits = 22;
constexpr uint64_t kItemMask = (uint64_t{1} << kItemBits) - 1;
constexpr uint64_t kTagMask = (uint64_t{1} << 20) - 1;

uint64_t pack(uint64_t tag, uint64_t next, uint64_t end) {
  return ((tag & kTagMask) << (2 * kItemBits)) | (next << kItemBits) | end;
}
uint64_t tag_of(uint64_t w) { return w >> (2 * kItemBits); }
uint64_t next_of(uint64_t w) { return (w >> kItemBits) & kItemMask; }
uint64_t end_of(uint64_t w) { return w & kItemMask; }

// A member that waits longer than this at a barrier yields its core
// between checks.
constexpr uint64_t kSpinTicks = 150000;  // ~70 us at this host's 2.1 GHz TSC
// A wait this long means a teammate lost its CPU (a scheduler time slice
// is milliseconds). Shorter waits are a pool worker waking from its futex
// at the first barrier of a run (tens to hundreds of microseconds after an
// idle spell), which must not stand teams down.
constexpr uint64_t kStallTicks = 3000000;  // ~1.4 ms at 2.1 GHz

// How long teams stand down after two stalled runs in a row: the shortest
// at first, twice as long as the last each time they stand down again
// within kStandDownMemory of the last stand-down's end, up to the longest.
constexpr double kShortestStandDown = 0.05;
constexpr double kLongestStandDown = 1.0;
constexpr double kStandDownMemory = 1.0;

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Thrown out of a barrier when another member has thrown.
struct Aborted {};

std::atomic<uint64_t> g_runs{0};
std::atomic<uint64_t> g_waited_ticks{0};

std::atomic<int>& enabled_state() {
  static std::atomic<int> state{[] {
    const char* env = std::getenv("REPRISE_DECODE_TEAM");
    return env && std::atoi(env) == 0 ? 0 : 1;
  }()};
  return state;
}

}  // namespace

int DecodeTeam::Member::size() const { return team_.size_; }

ThreadPool& DecodeTeam::Member::pool() const { return team_.pool_; }

bool DecodeTeam::Member::claim(int64_t n_items, bool halves, int64_t& i0, int64_t& i1) {
  if (n_items < 0 || static_cast<uint64_t>(n_items) > kItemMask) throw Error("DecodeTeam: too many items in one work");
  const int n = team_.size_;
  const uint64_t tag = work_ & kTagMask;
  const uint64_t items = static_cast<uint64_t>(n_items);
  for (; share_ < n; ++share_) {
    const int r = (index_ + share_) % n;
    std::atomic<uint64_t>& word = team_.shares_[(work_ & 1) * n + r].word;
    const uint64_t start = pack(tag, items * r / n, items * (r + 1) / n);
    const bool owner = share_ == 0;
    for (uint64_t cur = word.load(std::memory_order_acquire);;) {
      if (tag_of(cur) != tag) {
        // The share's first claim in this work starts it; a member that
        // loses the race sees the winner's word.
        word.compare_exchange_weak(cur, start, std::memory_order_acq_rel, std::memory_order_acquire);
        continue;
      }
      const uint64_t next = next_of(cur), end = end_of(cur);
      if (next >= end) break;
      const uint64_t take = halves ? std::max<uint64_t>(1, (end - next) / 2) : 1;
      const uint64_t b = owner ? next : end - take;
      const uint64_t claimed = owner ? pack(tag, next + take, end) : pack(tag, next, end - take);
      if (word.compare_exchange_weak(cur, claimed, std::memory_order_acq_rel, std::memory_order_acquire)) {
        i0 = static_cast<int64_t>(b);
        i1 = static_cast<int64_t>(b + take);
        return true;
      }
    }
  }
  return false;
}

void DecodeTeam::Member::barrier() {
  arrivals_ += static_cast<uint64_t>(team_.size_);
  team_.arrived_.fetch_add(1, std::memory_order_acq_rel);
  if (team_.arrived_.load(std::memory_order_acquire) < arrivals_) {
    const uint64_t t0 = __rdtsc();
    while (team_.arrived_.load(std::memory_order_acquire) < arrivals_) {
      if (team_.aborted_.load(std::memory_order_relaxed)) throw Aborted{};
      const uint64_t waited = __rdtsc() - t0;
      if (waited < kSpinTicks) {
        _mm_pause();
      } else {
        if (waited > kStallTicks) team_.stalled_.store(true, std::memory_order_relaxed);
        std::this_thread::yield();
      }
    }
    waited_ += __rdtsc() - t0;
  }
  ++work_;
  share_ = 0;
}

DecodeTeam::DecodeTeam(ThreadPool& pool)
    : pool_(pool), size_(pool.size()), shares_(std::make_unique<Share[]>(2 * static_cast<size_t>(pool.size()))) {
  reset();
}

void DecodeTeam::reset() {
  // As if set s had last served work s - 2, so works 0 and 1 start theirs.
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < size_; ++r) shares_[s * size_ + r].word.store(pack(static_cast<uint64_t>(s) - 2, 0, 0));
  arrived_.store(0);
  aborted_.store(false);
  stalled_.store(false);
  stalled_runs_ = 0;
  works_ = 0;
}

DecodeTeam::~DecodeTeam() = default;

void DecodeTeam::run_members(MemberFn fn, void* ctx) {
  // Every member starts from the same counts; the pool's dispatch publishes
  // them. A run's members all pass the same barriers, so afterwards the
  // arrivals are a whole number of barriers and the works their count.
  const uint64_t arrived = arrived_.load(std::memory_order_relaxed);
  const uint64_t works = works_;
  std::atomic<uint64_t> works_after{0};
  std::exception_ptr error;
  std::atomic_flag error_taken = ATOMIC_FLAG_INIT;
  pool_.parallel_for(size_, [&](int64_t index) {
    Member m(*this, static_cast<int>(index), works, arrived);
    try {
      fn(ctx, m);
    } catch (const Aborted&) {
      return;
    } catch (...) {
      if (!error_taken.test_and_set()) error = std::current_exception();
      aborted_.store(true, std::memory_order_relaxed);
      return;
    }
    // One add per member and run, after its last barrier: off the path
    // between two works.
    g_waited_ticks.fetch_add(m.waited_, std::memory_order_relaxed);
    if (index == 0) works_after.store(m.work_, std::memory_order_relaxed);
  });
  if (error) {
    reset();
    std::rethrow_exception(error);
  }
  works_ = works_after.load(std::memory_order_relaxed);
  g_runs.fetch_add(1, std::memory_order_relaxed);
  // One stalled run is often a one-off (a page fault on a new huge page
  // of K/V memory took 1.4 ms once); two in a row mean a teammate keeps
  // losing its CPU.
  stalled_runs_ = stalled_.exchange(false, std::memory_order_relaxed) ? stalled_runs_ + 1 : 0;
  if (stalled_runs_ >= 2) {
    // A host that takes a vCPU away now and then (this VM: a few ms at a
    // time) stalls two runs in a row once in a while, and a second of
    // dispatched steps was then ~25 % of a second's decode lost; threads
    // that keep losing their CPUs (more threads than free CPUs) stall
    // again as soon as teams are back, and soon stand down for a second
    // at a time as before.
    const double now = seconds_now();
    const bool again = stand_down_seconds_ > 0 && now - stood_down_until_ < kStandDownMemory;
    stand_down_seconds_ = again ? std::min(2 * stand_down_seconds_, kLongestStandDown) : kShortestStandDown;
    stood_down_until_ = now + stand_down_seconds_;
    stalled_runs_ = 0;
  }
}

bool DecodeTeam::fits_cpus(int threads) {
  static const int cpus = [] {
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    if (const std::optional<double> quota = cgroup_cpu_quota(CpuFacts{}))
      n = std::min(n, std::max(1, static_cast<int>(std::ceil(*quota))));
    return n;
  }();
  return threads <= cpus;
}

uint64_t DecodeTeam::runs() { return g_runs.load(std::memory_order_relaxed); }

uint64_t DecodeTeam::waited_ticks() { return g_waited_ticks.load(std::memory_order_relaxed); }

bool DecodeTeam::ready() const { return seconds_now() >= stood_down_until_; }

double DecodeTeam::last_stand_down_seconds() const { return stand_down_seconds_; }

bool DecodeTeam::enabled() { return enabled_state().load(std::memory_order_relaxed) != 0; }

void DecodeTeam::set_enabled(bool on) { enabled_state().store(on ? 1 : 0, std::memory_order_relaxed); }

}  // namespace reprise
