#include "cache/memory_budget.h"

#include <algorithm>
#include <atomic>

namespace reprise {

uint64_t next_use_stamp() {
  static std::atomic<uint64_t> clock{0};
  return clock.fetch_add(1, std::memory_order_relaxed) + 1;
}

void MemoryBudget::attach(Tier* tier) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(tiers_.begin(), tiers_.end(), tier) == tiers_.end()) tiers_.push_back(tier);
  }
  enforce();
}

void MemoryBudget::detach(Tier* tier) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase(tiers_, tier);
}

void MemoryBudget::enforce() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A tier can change between the two calls (another thread touches or frees
  // its entry): it then evicts its current oldest entry instead; a tier that
  // turns out to have nothing evictable ends this call (the next one retries).
  for (;;) {
    uint64_t total = 0;
    for (const Tier* t : tiers_) total += t->charged_bytes();
    if (total <= limit_) return;
    Tier* victim = nullptr;
    uint64_t oldest = 0;
    for (Tier* t : tiers_) {
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
  for (const Tier* t : tiers_) total += t->charged_bytes();
  return total;
}

uint64_t MemoryBudget::evictions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return evictions_;
}

void BudgetLink::share(MemoryBudget* budget) {
  if (budget == budget_) return;
  if (budget_) budget_->detach(tier_);
  budget_ = budget;
  if (budget_) budget_->attach(tier_);
}

}  // namespace reprise
