// One byte budget over every cache tier (prefix-cache KV blocks, recurrent
// snapshots, vision encoder outputs) of every loaded model.
//
// Each tier keeps its own entries, its own per-tier limit and its own LRU
// order, and stamps every use of an entry with next_use_stamp(), one clock
// for all tiers. A tier that has grown calls enforce() (never while holding
// its own lock); enforce() evicts the evictable entry with the oldest stamp
// across all attached tiers until their total fits the limit. So the budget
// goes to whatever was used most recently, whichever tier holds it. Entries
// in use (KV blocks of live sequences) are not evictable: while they are
// held the total may exceed the limit, as a single tier's budget allows.
//
// Lock order: the budget's mutex, then one tier's at a time. Thread-safe.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

namespace reprise {

// Monotonic across all tiers and threads; never returns 0.
uint64_t next_use_stamp();

class BudgetLink;

class MemoryBudget {
 public:
  // Implemented by each cache store; every method takes the store's own lock.
  class Tier {
   public:
    virtual ~Tier() = default;
    virtual uint64_t charged_bytes() const = 0;
    // Stamp of the entry the tier would evict next; 0 when none is evictable.
    virtual uint64_t oldest_evictable_stamp() const = 0;
    // Evicts the tier's least recently used evictable entry; returns the
    // bytes freed (0: nothing was evictable).
    virtual uint64_t evict_oldest() = 0;
  };

  explicit MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}
  // Unlinks every store still attached (they keep working on their own
  // per-tier limits), so the budget and its stores may die in any order.
  ~MemoryBudget();
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Evicts globally least-recently-used entries until the attached tiers'
  // total is within the limit or nothing more is evictable.
  void enforce();

  uint64_t limit_bytes() const { return limit_; }
  uint64_t used_bytes() const;
  uint64_t evictions() const;

 private:
  friend class BudgetLink;
  void attach(BudgetLink* link);
  void detach(BudgetLink* link);

  const uint64_t limit_;
  mutable std::mutex mutex_;
  std::vector<BudgetLink*> links_;
  uint64_t evictions_ = 0;
};

// A store's membership in a shared budget (none by default). Stores hold one
// as a member, call share() during set-up (not concurrently with their own
// use) and enforce() after growing, and leave (share(nullptr)) first thing in
// their destructor, so the budget never calls into a store being torn down.
class BudgetLink {
 public:
  explicit BudgetLink(MemoryBudget::Tier* tier) : tier_(tier) {}
  ~BudgetLink() { share(nullptr); }
  BudgetLink(const BudgetLink&) = delete;
  BudgetLink& operator=(const BudgetLink&) = delete;

  void share(MemoryBudget* budget);
  void enforce() const {
    if (budget_) budget_->enforce();
  }
  bool shared() const { return budget_ != nullptr; }

 private:
  friend class MemoryBudget;
  MemoryBudget::Tier* const tier_;
  MemoryBudget* budget_ = nullptr;  // cleared by the budget's destructor
};

}  // namespace reprise
