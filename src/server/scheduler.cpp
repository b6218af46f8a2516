#include "server/scheduler.h"

#include <algorithm>

namespace reprise {

Scheduler::Scheduler(int slots) {
  const int n = std::max(1, slots);
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { slot_loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

// Group ids callers choose and the tickets that stand for a job's own group
// never meet: those are kept in the top half of the id space.
constexpr uint64_t kOwnGroup = 1ull << 63;

uint64_t Scheduler::submit(std::function<void()> job, uint64_t group) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket = next_ticket_++;
    if (group == 0) group = kOwnGroup | ticket;
    ++groups_[group].jobs;
    queue_.push_back({ticket, group, std::move(job)});
  }
  wake_.notify_one();
  return ticket;
}

std::function<void()> Scheduler::withdraw(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Queued& q) { return q.ticket == ticket; });
  if (it == queue_.end()) return {};
  std::function<void()> job = std::move(it->job);
  forget_job_locked(it->group);
  queue_.erase(it);
  return job;
}

void Scheduler::forget_job_locked(uint64_t group) {
  auto g = groups_.find(group);
  if (g != groups_.end() && --g->second.jobs == 0) groups_.erase(g);
}

size_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size();
}

size_t Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_;
}

void Scheduler::slot_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    // Round robin between requests: the first queued job of the group that
    // started a job least recently (queue order breaks ties).
    auto next = queue_.begin();
    for (auto it = queue_.begin(); it != queue_.end(); ++it)
      if (groups_[it->group].last_start < groups_[next->group].last_start) next = it;
    const uint64_t group = next->group;
    std::function<void()> job = std::move(next->job);
    queue_.erase(next);
    groups_[group].last_start = ++starts_;
    ++running_;
    lock.unlock();
    try {
      job();
    } catch (...) {
      // Jobs report their own errors; nothing may escape a slot thread.
    }
    job = nullptr;  // release captured state (model leases) before counting the slot free
    lock.lock();
    --running_;
    forget_job_locked(group);
  }
}

}  // namespace reprise
