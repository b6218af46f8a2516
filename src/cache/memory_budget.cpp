#include "cache/memory_budget.h"

#include <algorithm>
#include <atomic>

namespace reprise {

uint64_t next_use_stamp() {
  static std::atomic<uint64_t> clock{0};
  return clock.fetch_add(1, std::memory_order_relaxed) + 1;
}

MemoryBudget::~MemoryBudget() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (BudgetLink* link : links_) link->budget_ = nullptr;
}

void MemoryBudget::attach(BudgetLink* link) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(links_.begin(), links_.end(), link) == links_.end()) links_.push_back(link);
  }
  enforce();
}

void MemoryBudget::detach(BudgetLink* link) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase(links_, link);
}

void MemoryBudget::enforce() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A tier can change between the two calls (another thread touches or frees
  // its entry): it then evicts its current oldest entry instead; a tier that
  // turns out to have nothing evictable ends this call (the next one retries).
  for (;;) {
    uint64_t total = 0;
    for (const BudgetLink* l : links_) total += l->tier_->charged_bytes();
    if (total <= limit_) return;
    Tier* victim = nullptr;
    uint64_t oldest = 0;
    for (const BudgetLink* l : links_) {
      Tier* t = l->tier_;
      const uint64_t s = t->oldest_evictable_stamp();
      if (s != 0 && (victim == nullptr || s < oldest)) victim = t, oldest = s;
    }
    if (victim == nullptr || victim->evict_oldest() == 0) return;
    ++evictions_;
  }
}

uint64_t MemoryBudget::used_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t total = 0;
  for (const BudgetLink* l : links_) total += l->tier_->charged_bytes();
  return total;
}

uint64_t MemoryBudget::evictions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return evictions_;
}

void BudgetLink::share(MemoryBudget* budget) {
  if (budget == budget_) return;
  if (budget_) budget_->detach(this);
  budget_ = budget;
  if (budget_) budget_->attach(this);
}

}  // namespace reprise
