#include "cache/snapshot_store.h"

#include <algorithm>
#include <cstring>

namespace reprise {

namespace {
Hash128 key_at(std::span<const Hash128> keys, int64_t i) {
  return i < static_cast<int64_t>(keys.size()) ? keys[i] : Hash128{};
}
// Extra keys of tokens[begin, end): empty when all zero (matches the KV chain).
std::vector<Hash128> chunk_keys(std::span<const Hash128> keys, int64_t begin, int64_t end) {
  std::vector<Hash128> out;
  bool any = false;
  for (int64_t i = begin; i < end; ++i) {
    out.push_back(key_at(keys, i));
    any |= !out.back().is_zero();
  }
  if (!any) out.clear();
  return out;
}
}  // namespace

SnapshotStore::SnapshotStore(const StateSpec& spec, const SnapshotConfig& config) : spec_(spec), config_(config) {
  if (config_.chunk_tokens <= 0) config_.chunk_tokens = 32;
  state_bytes_ = static_cast<uint64_t>(spec_.recurrent_floats()) * sizeof(float);
  stats_.budget_bytes = config_.budget_bytes;
}

SnapshotStore::~SnapshotStore() { budget_link_.share(nullptr); }

Hash128 SnapshotStore::position_key(const Hash128& ns, std::span<const int32_t> tokens,
                                    std::span<const Hash128> keys, int64_t n,
                                    std::vector<Hash128>& prefix_hashes) const {
  const int64_t C = config_.chunk_tokens;
  if (prefix_hashes.empty()) prefix_hashes.push_back(ns);
  while (static_cast<int64_t>(prefix_hashes.size()) <= n / C) {
    const int64_t k = static_cast<int64_t>(prefix_hashes.size()) - 1;
    auto ck = chunk_keys(keys, k * C, (k + 1) * C);
    prefix_hashes.push_back(block_hash(prefix_hashes.back(), tokens.subspan(k * C, C), ck));
  }
  const int64_t full = n / C;
  if (n % C == 0) return prefix_hashes[full];
  auto ck = chunk_keys(keys, full * C, n);
  return block_hash(prefix_hashes[full], tokens.subspan(full * C, n - full * C), ck);
}

uint64_t SnapshotStore::entry_cost(const Entry& e) const {
  return e.state.size() * sizeof(float) + e.tokens.size() * sizeof(int32_t) + e.keys.size() * sizeof(Hash128) +
         sizeof(Entry);
}

bool SnapshotStore::expired(const Entry& e) const {
  if (config_.ttl_seconds <= 0) return false;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - e.created).count() > config_.ttl_seconds;
}

void SnapshotStore::put(const Hash128& ns, std::span<const int32_t> prefix, std::span<const Hash128> keys,
                        SequenceMemory& memory) {
  if (state_bytes_ == 0 || config_.budget_bytes == 0 || config_.max_entries == 0 || prefix.empty()) return;
  std::vector<Hash128> hashes;
  const Hash128 key = position_key(ns, prefix, keys, static_cast<int64_t>(prefix.size()), hashes);
  Entry e;
  e.key = key;
  e.tokens.assign(prefix.begin(), prefix.end());
  if (!keys.empty()) e.keys.assign(keys.begin(), keys.begin() + prefix.size());
  e.state.resize(spec_.recurrent_floats());
  float* dst = e.state.data();
  for (size_t l = 0; l < spec_.layers.size(); ++l) {
    const auto& s = spec_.layers[l];
    if (s.kind != LayerStateKind::Recurrent) continue;
    std::memcpy(dst, memory.conv_state(static_cast<int>(l)), s.conv_state_floats * sizeof(float));
    dst += s.conv_state_floats;
    std::memcpy(dst, memory.ssm_state(static_cast<int>(l)), s.ssm_state_floats * sizeof(float));
    dst += s.ssm_state_floats;
  }
  e.created = std::chrono::steady_clock::now();
  const uint64_t cost = entry_cost(e);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cost > config_.budget_bytes) return;  // larger than the whole budget: not stored
    if (entries_.count(key)) evict_locked(key);  // same prefix: replace (identical state)
    lru_.push_front(key);
    e.lru = lru_.begin();
    e.used = next_use_stamp();
    stats_.bytes += cost;
    entries_.emplace(key, std::move(e));
    stats_.stores++;
    enforce_limits_locked();
  }
  budget_link_.enforce();
}

int64_t SnapshotStore::restore_longest(const Hash128& ns, std::span<const int32_t> tokens,
                                       std::span<const Hash128> keys, int64_t max_position,
                                       SequenceMemory& memory) {
  if (state_bytes_ == 0) return 0;
  max_position = std::min<int64_t>(max_position, static_cast<int64_t>(tokens.size()));
  std::vector<Hash128> hashes;
  std::vector<Hash128> candidates(max_position + 1);
  // Hash every candidate position outside the lock (cheap: at most one chunk each).
  for (int64_t p = 1; p <= max_position; ++p) candidates[p] = position_key(ns, tokens, keys, p, hashes);
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t p = max_position; p >= 1; --p) {
    auto it = entries_.find(candidates[p]);
    if (it == entries_.end()) continue;
    Entry& e = it->second;
    if (expired(e)) {
      evict_locked(it->first);
      continue;
    }
    // Confirm: the hash located it, the tokens prove it.
    if (static_cast<int64_t>(e.tokens.size()) != p || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))
      continue;
    bool keys_match = true;
    for (int64_t i = 0; i < p && keys_match; ++i)
      keys_match = key_at(e.keys, i) == key_at(keys, i);
    if (!keys_match) continue;
    const float* src = e.state.data();
    for (size_t l = 0; l < spec_.layers.size(); ++l) {
      const auto& s = spec_.layers[l];
      if (s.kind != LayerStateKind::Recurrent) continue;
      std::memcpy(memory.conv_state(static_cast<int>(l)), src, s.conv_state_floats * sizeof(float));
      src += s.conv_state_floats;
      std::memcpy(memory.ssm_state(static_cast<int>(l)), src, s.ssm_state_floats * sizeof(float));
      src += s.ssm_state_floats;
    }
    lru_.splice(lru_.begin(), lru_, e.lru);
    e.used = next_use_stamp();
    stats_.hits++;
    stats_.tokens_saved += p;
    return p;
  }
  stats_.misses++;
  return 0;
}

std::vector<int64_t> SnapshotStore::checkpoints(int64_t from, int64_t to) const {
  std::vector<int64_t> out;
  if (config_.checkpoint_every_chunks <= 0) return out;
  const int64_t every = static_cast<int64_t>(config_.checkpoint_every_chunks) * config_.chunk_tokens;
  for (int64_t p = (from / every + 1) * every; p < to; p += every) out.push_back(p);
  return out;
}

void SnapshotStore::evict_locked(const Hash128& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  stats_.bytes -= entry_cost(it->second);
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void SnapshotStore::enforce_limits_locked() {
  while (!lru_.empty() && (stats_.bytes > config_.budget_bytes || entries_.size() > config_.max_entries)) {
    evict_locked(lru_.back());
    stats_.evictions++;
  }
}

uint64_t SnapshotStore::charged_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.bytes;
}

uint64_t SnapshotStore::oldest_evictable_stamp() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.empty() ? 0 : entries_.at(lru_.back()).used;
}

uint64_t SnapshotStore::evict_oldest() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lru_.empty()) return 0;
  const uint64_t bytes = stats_.bytes;
  evict_locked(lru_.back());
  stats_.evictions++;
  return bytes - stats_.bytes;
}

SnapshotStats SnapshotStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  SnapshotStats s = stats_;
  s.entries = entries_.size();
  return s;
}

}  // namespace reprise
