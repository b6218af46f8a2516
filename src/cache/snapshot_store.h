// Recurrent-state snapshots for state-space and hybrid models.
//
// A recurrent layer's state summarises every earlier position and cannot be
// trimmed, so prefix reuse needs the exact state at a position P. Snapshots are
// keyed by the namespace and the hash chain of the tokens before P (the same
// 128-bit chaining as KV blocks, confirmed token by token on a hit), so a
// snapshot is valid for exactly that prefix. Restore picks the longest
// snapshotted position the caller allows; the caller replays the rest.
//
// Limits: a byte budget, an entry count and an optional TTL; LRU eviction.
// The store may also share a MemoryBudget with other cache tiers
// (share_budget), where its entries compete with theirs by last use.
// Thread-safe.
#pragma once
#include <chrono>
#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/cache_key.h"
#include "cache/memory_budget.h"
#include "model/sequence_memory.h"
#include "model/state_spec.h"

namespace reprise {

struct SnapshotConfig {
  uint64_t budget_bytes = 256ull << 20;
  size_t max_entries = 4096;
  double ttl_seconds = 0;  // 0: entries never expire by age
  // Checkpoint every N * chunk_tokens positions during prefill (0: only at the
  // ends of prompts and generations).
  int checkpoint_every_chunks = 4;
  int chunk_tokens = 32;
};

struct SnapshotStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t stores = 0;
  uint64_t evictions = 0;
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t tokens_saved = 0;  // positions not recomputed thanks to restores
  uint64_t budget_bytes = 0;
};

class SnapshotStore final : private MemoryBudget::Tier {
 public:
  SnapshotStore(const StateSpec& spec, const SnapshotConfig& config);
  ~SnapshotStore() override;
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  // Joins (or with null, leaves) a budget shared with other tiers; the
  // budget must outlive the store or be unshared first.
  void share_budget(MemoryBudget* budget) { budget_link_.share(budget); }

  // Stores the recurrent state `memory` holds after processing `prefix`.
  void put(const Hash128& ns, std::span<const int32_t> prefix, std::span<const Hash128> keys,
           SequenceMemory& memory);

  // Restores the snapshot of the longest prefix of `tokens` no longer than
  // max_position into `memory`; returns its length (0 = none: memory untouched).
  int64_t restore_longest(const Hash128& ns, std::span<const int32_t> tokens, std::span<const Hash128> keys,
                          int64_t max_position, SequenceMemory& memory);

  // Positions in [from, to) where prefill should stop to take a checkpoint.
  std::vector<int64_t> checkpoints(int64_t from, int64_t to) const;

  SnapshotStats stats() const;
  const SnapshotConfig& config() const { return config_; }
  uint64_t entry_bytes() const { return state_bytes_; }

 private:
  struct Entry {
    Hash128 key;
    std::vector<int32_t> tokens;
    std::vector<Hash128> keys;
    std::vector<float> state;
    std::chrono::steady_clock::time_point created;
    std::list<Hash128>::iterator lru;
    uint64_t used = 0;  // next_use_stamp() of the last store or restore
  };
  // Chain hash of tokens[0:n] in chunk_tokens chunks; prefix_hashes[k] is the
  // hash after k full chunks.
  Hash128 position_key(const Hash128& ns, std::span<const int32_t> tokens, std::span<const Hash128> keys,
                       int64_t n, std::vector<Hash128>& prefix_hashes) const;
  uint64_t entry_cost(const Entry& e) const;
  void evict_locked(const Hash128& key);
  void enforce_limits_locked();
  bool expired(const Entry& e) const;

  // MemoryBudget::Tier
  uint64_t charged_bytes() const override;
  uint64_t oldest_evictable_stamp() const override;
  uint64_t evict_oldest() override;

  const StateSpec spec_;
  SnapshotConfig config_;
  uint64_t state_bytes_ = 0;
  mutable std::mutex mutex_;
  std::unordered_map<Hash128, Entry, Hash128Hasher> entries_;
  std::list<Hash128> lru_;  // front = most recent
  SnapshotStats stats_;
  BudgetLink budget_link_{this};  // last: leaves the shared budget first
};

}  // namespace reprise
