// Runs generation jobs on a fixed number of sequence slots (--parallel N).
//
// Each slot is a thread that runs one job (one sequence) at a time; jobs
// beyond N wait in a queue. Generation runs here rather than on the HTTP
// connection's thread so that a client that stops reading cannot hold a
// slot: its output is buffered and the slot moves on.
//
// A request may queue many jobs (n choices, a batch of prompts or
// embedding inputs); requests are served round robin: a free slot takes the
// oldest job of the group (request) that started a job least recently, so a
// request of one job is not held behind another's hundreds. Within a group,
// and between groups that have not started, jobs run in submission order.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
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

  // Queues a job of `group` (the request it belongs to; 0: a group of its
  // own). It must not throw (exceptions are caught and dropped). The ticket
  // names it to withdraw().
  uint64_t submit(std::function<void()> job, uint64_t group = 0);

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
    uint64_t group;
    std::function<void()> job;
  };
  // A group with jobs queued or running: when it last started one (0:
  // never), and how many it has.
  struct Group {
    uint64_t last_start = 0;
    size_t jobs = 0;
  };
  void forget_job_locked(uint64_t group);
  std::deque<Queued> queue_;
  std::unordered_map<uint64_t, Group> groups_;
  uint64_t starts_ = 0;
  uint64_t next_ticket_ = 1;
  size_t running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace reprise
