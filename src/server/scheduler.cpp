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

uint64_t Scheduler::submit(std::function<void()> job) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket = next_ticket_++;
    queue_.push_back({ticket, std::move(job)});
  }
  wake_.notify_one();
  return ticket;
}

std::function<void()> Scheduler::withdraw(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Queued& q) { return q.ticket == ticket; });
  if (it == queue_.end()) return {};
  std::function<void()> job = std::move(it->job);
  queue_.erase(it);
  return job;
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
    std::function<void()> job = std::move(queue_.front().job);
    queue_.pop_front();
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
  }
}

}  // namespace reprise
