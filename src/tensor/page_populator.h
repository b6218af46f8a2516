// Faults in memory that is about to be written, on a thread of its own that
// runs only when a CPU would otherwise be idle.
//
// Why: where a VM's host backs guest memory lazily and takes back what the
// guest leaves free (free page reporting: memory freed and left alone for a
// few seconds is returned to the host), the first write to each 2 MiB of
// fresh memory costs ~3.5-4 ms on this VM, against ~0.15 ms for memory the
// guest touched recently. The KV block pool grows into such memory block by
// block as the prefix cache fills, so a request that happened to start a
// new 2 MiB paid for it (docs/performance.md, session 44). Populating ahead
// of the pool's writes moves that cost into the time between requests.
//
// The thread runs under SCHED_IDLE, so it never takes a CPU from another
// thread, and only in spells when the process's other threads are nearly
// idle (between requests rather than in the gaps of a decode step). It
// populates with MADV_POPULATE_WRITE, which maps pages writable without
// writing to them: it may run beside a writer of the same memory and never
// changes what the memory holds. Where the kernel has no
// MADV_POPULATE_WRITE (before Linux 5.14) it does nothing.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace reprise {

class PagePopulator {
 public:
  // The process's populator; its thread starts with the first range.
  static PagePopulator& shared();

  PagePopulator() = default;
  // Stops after the 2 MiB step in progress; ranges not yet done are dropped.
  ~PagePopulator();
  PagePopulator(const PagePopulator&) = delete;
  PagePopulator& operator=(const PagePopulator&) = delete;

  // Faults in [begin, begin + bytes) soon, 2 MiB at a time, ranges in the
  // order given, while `owner` (which owns the mapping) lives: each step
  // holds it, so the memory stays mapped for the step, and once it is gone
  // the rest of the range is dropped. begin must be 4 KiB-aligned. Ignored
  // when disabled.
  void populate(std::weak_ptr<const void> owner, uint8_t* begin, size_t bytes);

  // Returns when every range given so far is done or dropped (tests).
  void wait_idle();

  // Whether ranges are populated: on unless REPRISE_POPULATE=0 (for
  // comparisons) or set_enabled(false) (tests), while the kernel has not
  // refused MADV_POPULATE_WRITE and a thread could be started.
  bool enabled() const;
  void set_enabled(bool on);

 private:
  struct Range {
    std::weak_ptr<const void> owner;
    uint8_t* begin;
    size_t bytes;
  };
  void run();
  // Returns after a 10 ms spell in which the process's other threads were nearly
  // idle, or once stopping (called unlocked).
  void wait_for_quiet();

  mutable std::mutex mutex_;
  std::condition_variable work_;  // a range queued, or stopping
  std::condition_variable idle_;  // the queue ran empty
  std::deque<Range> queue_;
  bool busy_ = false;  // the thread holds a range taken from the queue
  bool stopping_ = false;
  bool enabled_ = true;
  bool refused_ = false;  // no MADV_POPULATE_WRITE in the kernel, or no thread
  std::thread thread_;
};

}  // namespace reprise
