// Runs generation jobs on a fixed number of sequence slots (--parallel N).
//
// Each slot is a thread that runs one job (one sequence) at a time; jobs
// beyond N wait in a FIFO queue. Generation runs here rather than on the
// HTTP connection's thread so that a client that stops reading cannot hold
// a slot: its output is buffered and the slot moves on.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace reprise {

class Scheduler {
 public:
  explicit Scheduler(int slots);
  // Runs every job already queued, then joins the slots. Jobs are expected to
  // finish promptly once their requests are cancelled.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a job. It must not throw (exceptions are caught and dropped).
  // The ticket names it to withdraw().
  uint64_t submit(std::function<void()> job);

  // Takes a job that still waits for a slot out of the queue and returns it
  // unrun (an empty function once a slot has taken it). A request whose
  // client has gone withdraws its job and runs it at once, cancelled, so it
  // no longer holds a place in the queue, a connection thread and its
  // model until the requests ahead of it finish.
  std::function<void()> withdraw(uint64_t ticket);

  int slots() const { return static_cast<int>(workers_.size()); }
  size_t queued() const;   // waiting for a slot
  size_t running() const;  // occupying a slot

 private:
  void slot_loop();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  struct Queued {
    uint64_t ticket;
    std::function<void()> job;
  };
  std::deque<Queued> queue_;
  uint64_t next_ticket_ = 1;
  size_t running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace reprise
