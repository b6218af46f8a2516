// Runs generation jobs on a fixed number of sequence slots (--parallel N).
//
// Each slot is a thread that runs one job (one sequence) at a time; jobs
// beyond N wait in a FIFO queue. Generation runs here rather than on the
// HTTP connection's thread so that a client that stops reading cannot hold
// a slot: its output is buffered and the slot moves on.
#pragma once
#include <condition_variable>
#include <cstddef>
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
  void submit(std::function<void()> job);

  int slots() const { return static_cast<int>(workers_.size()); }
  size_t queued() const;   // waiting for a slot
  size_t running() const;  // occupying a slot

 private:
  void slot_loop();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace reprise
