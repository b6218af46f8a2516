// Paged attention state shared across sequences through a radix prefix index.
//
// State lives in fixed-size blocks of `block_tokens` positions (all attention
// layers' K and V rows for those positions, f16). A sequence holds a table of
// blocks. Blocks that are full (and, when a sequence ends, its partial tail)
// enter the index: a tree per namespace whose edges are block hashes, so a
// later request with the same prefix attaches those blocks without copying.
// Indexed blocks are immutable; a sequence that must write into one (a
// partially matched or partial block) copies it first.
//
// Accounting: every block's bytes count against the budget. Blocks referenced
// by live sequences are never evicted; when the total exceeds the budget,
// unreferenced leaf blocks are evicted least-recently-used first. A budget of
// 0 disables caching (nothing is indexed, lookups never hit).
//
// A cache may also share one MemoryBudget with other cache tiers
// (share_budget): its evictable blocks then compete with their entries by
// last use, and growth of any tier can evict them.
//
// Thread safety: all methods lock the cache; key()/value() of a sequence are
// lock-free reads of its own table.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/block_pool.h"
#include "cache/cache_key.h"
#include "cache/cache_stats.h"
#include "cache/memory_budget.h"
#include "model/sequence_memory.h"
#include "model/state_spec.h"

namespace reprise {

struct PrefixCacheConfig {
  int block_tokens = 32;
  uint64_t budget_bytes = 256ull << 20;
};

class CachedSequence;

class PrefixCache final : private MemoryBudget::Tier {
 public:
  PrefixCache(const StateSpec& spec, const PrefixCacheConfig& config);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // A new, empty sequence whose blocks live in namespace `ns`.
  std::unique_ptr<CachedSequence> open(const NamespaceKey& ns);

  CacheStats stats() const;
  int block_tokens() const { return block_tokens_; }
  // Bytes one block counts against the budget: its KV storage plus the
  // bookkeeping (tokens, keys, node), so zero-KV models are bounded too.
  uint64_t block_bytes() const { return block_cost_; }
  bool enabled() const { return config_.budget_bytes > 0; }
  void set_budget(uint64_t bytes);
  // Joins (or with null, leaves) a budget shared with other tiers; the
  // budget must outlive the cache or be unshared first.
  void share_budget(MemoryBudget* budget) { budget_link_.share(budget); }
  // Drops every unreferenced block.
  void clear();
  // Verifies reference counts, the index and byte accounting against the
  // blocks that exist. Returns "" when consistent, else what is wrong.
  std::string check_invariants() const;

 private:
  friend class CachedSequence;
  struct Block;
  struct Node;

  Block* allocate_locked();
  void release_locked(Block* b);
  void touch_locked(Block* b);
  void update_evictable_locked(Block* b);
  void enforce_budget_locked();
  void evict_locked(Block* b);
  void free_block_locked(Block* b);
  Node* root_locked(const Hash128& ns, bool create);

  // MemoryBudget::Tier
  uint64_t charged_bytes() const override;
  uint64_t oldest_evictable_stamp() const override;
  uint64_t evict_oldest() override;

  const StateSpec spec_;
  const int block_tokens_;
  PrefixCacheConfig config_;
  // Per layer, in halfs within a block: KV head 0's keys and values, and
  // the distance from one head's to the next's.
  std::vector<int64_t> key_offset_, value_offset_, head_stride_;
  uint64_t block_halfs_ = 0;
  uint64_t block_bytes_ = 0;  // KV storage only
  uint64_t block_cost_ = 0;   // accounted per block

  mutable std::mutex mutex_;
  std::unique_ptr<BlockPool> pool_;  // KV buffers; outlives the blocks below
  std::unordered_map<Hash128, std::unique_ptr<Node>, Hash128Hasher> roots_;
  std::unordered_map<uint64_t, std::unique_ptr<Block>> blocks_;
  std::set<std::pair<uint64_t, uint64_t>> evictable_;  // (last_used, id): unreferenced indexed leaves
  std::unordered_set<Hash128, Hash128Hasher> evicted_hashes_;  // recent, for miss reasons
  std::unordered_set<const CachedSequence*> live_;
  uint64_t next_id_ = 1;
  CacheStats stats_;
  BudgetLink budget_link_{this};  // last: leaves the shared budget first
};

// Per-request outcome of prefix reuse.
struct ReuseReport {
  int64_t reused_tokens = 0;
  int64_t prompt_tokens = 0;
  // Why reuse stopped where it did: "full", "empty-namespace", "evicted",
  // "divergence", "end-of-cache", "disabled" or "not-asked" (the request
  // needed every position computed).
  std::string stop_reason;
  int64_t stop_position = 0;
  std::string describe() const;
};

class CachedSequence final : public SequenceMemory {
 public:
  ~CachedSequence() override;

  // Attaches the longest cached prefix of `tokens` (with optional per-position
  // extra keys, same length as tokens or empty), always leaving at least one
  // token to compute so the caller gets logits. Only valid on an empty sequence.
  ReuseReport attach_prefix(std::span<const int32_t> tokens, std::span<const Hash128> keys = {});

  // Records that positions [n_tokens(), n_tokens() + tokens.size()) now hold
  // the state of `tokens` (after a forward pass). Completed blocks are indexed.
  void commit(std::span<const int32_t> tokens, std::span<const Hash128> keys = {});

  // Forgets positions >= n (e.g. rejected speculative tokens).
  void truncate(int64_t n);

  // Positions from n on are tentative (speculative proposals, which the
  // verification may reject): the blocks holding any are written but not
  // indexed, so a rejected proposal never enters the prefix index, where it
  // would take budget and recency from real prefixes. settle() ends the hold
  // and indexes the full blocks it held back (truncate the rejected ones
  // first). A sequence released while holding forgets its tentative positions.
  void hold_index_from(int64_t n);
  void settle();

  int64_t n_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

  void prepare(int64_t first_write, int64_t end) override;
  uint16_t* key(int layer, int64_t pos) override;
  uint16_t* value(int layer, int64_t pos) override;
  void kv_rows(int layer, int64_t first, int64_t end, const uint16_t** keys, const uint16_t** values) override;
  // A block holds each layer's state by KV head: head j's keys (its key
  // groups of the block's positions), then its values ([block position]
  // [head_dim]), so decode attention, which reads one head's keys and then
  // its values, reads one run of memory per head and block.
  int64_t kv_head_stride(int layer) const override;
  // The largest that whole blocks hold (key_group_for(block_tokens)).
  int64_t key_group(int layer) const override;
  // Recurrent layers' state is private to the sequence (snapshots live in a
  // SnapshotStore); zero for a new sequence.
  float* conv_state(int layer) override { return conv_[layer].data(); }
  float* ssm_state(int layer) override { return ssm_[layer].data(); }
  const Hash128& namespace_hash() const { return ns_; }

 private:
  friend class PrefixCache;
  CachedSequence(PrefixCache& cache, const Hash128& ns);
  void index_full_block_locked(size_t block_index);
  void prepare_blocks(int64_t first_write, int64_t end);
  void release_all();
  void truncate_locked(int64_t n);
  Hash128 parent_hash_locked(size_t block_index) const;

  PrefixCache& cache_;
  Hash128 ns_;
  std::vector<PrefixCache::Block*> table_;
  std::vector<int32_t> tokens_;
  std::vector<Hash128> keys_;  // per position; zero when none
  int64_t hold_from_ = INT64_MAX;  // see hold_index_from
  std::vector<std::vector<float>> conv_, ssm_;
};

}  // namespace reprise
