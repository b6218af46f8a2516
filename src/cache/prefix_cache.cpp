#include "cache/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "tensor/key_layout.h"
#include "util/error.h"

namespace reprise {

struct PrefixCache::Node {
  Hash128 hash;            // namespace hash for roots, block hash for blocks
  Node* parent = nullptr;  // nullptr for roots
  std::unordered_map<Hash128, Block*, Hash128Hasher> full_children;
  std::vector<Block*> partial_children;
  bool is_root = true;
  bool has_children() const { return !full_children.empty() || !partial_children.empty(); }
  virtual ~Node() = default;
};

struct PrefixCache::Block : PrefixCache::Node {
  Block() { is_root = false; }
  uint64_t id = 0;
  BlockPool::Buffer data;
  std::vector<int32_t> tokens;  // tokens whose state the block holds
  std::vector<Hash128> keys;    // per position, same length as tokens
  int refs = 0;
  bool indexed = false;
  bool partial = false;         // indexed as a partial (tail) block
  uint64_t last_used = 0;
  uint64_t evict_stamp = 0;     // key in evictable_ while listed (0 = not listed)
};

namespace {

// Extra keys for hashing: none when every position's key is zero.
std::span<const Hash128> hash_keys(std::span<const Hash128> keys) {
  for (const auto& k : keys)
    if (!k.is_zero()) return keys;
  return {};
}

Hash128 key_at(std::span<const Hash128> keys, size_t i) { return i < keys.size() ? keys[i] : Hash128{}; }

}  // namespace

std::string ReuseReport::describe() const {
  std::string s = "reused " + std::to_string(reused_tokens) + "/" + std::to_string(prompt_tokens) +
                  " prompt tokens; stopped: " + stop_reason;
  if (stop_reason == "divergence" || stop_reason == "evicted" || stop_reason == "end-of-cache")
    s += " at position " + std::to_string(stop_position);
  return s;
}

PrefixCache::PrefixCache(const StateSpec& spec, const PrefixCacheConfig& config)
    : spec_(spec), block_tokens_(config.block_tokens), config_(config) {
  if (block_tokens_ <= 0 || block_tokens_ > 4096) throw Error("invalid cache block size");
  // Per attention layer, each KV head's keys then its values: one head's
  // state of a block is one run of memory (see kv_head_stride).
  int64_t off = 0;
  for (const auto& layer : spec_.layers) {
    const bool attention = layer.kind == LayerStateKind::Attention;
    const int64_t head_k = attention ? block_tokens_ * int64_t{layer.head_dim_k} : 0;
    const int64_t head_v = attention ? block_tokens_ * int64_t{layer.head_dim_v} : 0;
    key_offset_.push_back(off);
    value_offset_.push_back(off + head_k);
    head_stride_.push_back(head_k + head_v);
    if (attention) off += int64_t{layer.n_kv_heads} * (head_k + head_v);
  }
  block_halfs_ = static_cast<uint64_t>(off);
  block_bytes_ = block_halfs_ * sizeof(uint16_t);
  block_cost_ = block_bytes_ + sizeof(Block) + block_tokens_ * (sizeof(int32_t) + sizeof(Hash128));
  stats_.budget_bytes = config_.budget_bytes;
  pool_ = std::make_unique<BlockPool>(block_halfs_);
}

PrefixCache::~PrefixCache() { budget_link_.share(nullptr); }

std::unique_ptr<CachedSequence> PrefixCache::open(const NamespaceKey& ns) {
  std::unique_ptr<CachedSequence> seq(new CachedSequence(*this, ns.hash()));
  std::lock_guard<std::mutex> lock(mutex_);
  live_.insert(seq.get());
  return seq;
}

void PrefixCache::set_budget(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  config_.budget_bytes = bytes;
  stats_.budget_bytes = bytes;
  enforce_budget_locked();
}

uint64_t PrefixCache::charged_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.bytes;
}

uint64_t PrefixCache::oldest_evictable_stamp() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return evictable_.empty() ? 0 : evictable_.begin()->first;
}

uint64_t PrefixCache::evict_oldest() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (evictable_.empty()) return 0;
  evict_locked(blocks_.at(evictable_.begin()->second).get());
  std::erase_if(roots_, [](const auto& kv) { return !kv.second->has_children(); });
  return block_cost_;
}

void PrefixCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!evictable_.empty()) evict_locked(blocks_.at(evictable_.begin()->second).get());
  std::erase_if(roots_, [](const auto& kv) { return !kv.second->has_children(); });
}

PrefixCache::Node* PrefixCache::root_locked(const Hash128& ns, bool create) {
  auto it = roots_.find(ns);
  if (it != roots_.end()) return it->second.get();
  if (!create) return nullptr;
  auto node = std::make_unique<Node>();
  node->hash = ns;
  Node* raw = node.get();
  roots_.emplace(ns, std::move(node));
  return raw;
}

PrefixCache::Block* PrefixCache::allocate_locked() {
  auto b = std::make_unique<Block>();
  b->id = next_id_++;
  if (block_halfs_ > 0) b->data = pool_->acquire();
  b->refs = 1;
  Block* raw = b.get();
  blocks_.emplace(raw->id, std::move(b));
  stats_.bytes += block_cost_;
  return raw;
}

void PrefixCache::touch_locked(Block* b) {
  b->last_used = next_use_stamp();
  update_evictable_locked(b);
}

void PrefixCache::update_evictable_locked(Block* b) {
  if (b->evict_stamp) {
    evictable_.erase({b->evict_stamp, b->id});
    b->evict_stamp = 0;
  }
  if (b->indexed && b->refs == 0 && !b->has_children()) {
    b->evict_stamp = b->last_used ? b->last_used : next_use_stamp();
    evictable_.insert({b->evict_stamp, b->id});
  }
}

void PrefixCache::release_locked(Block* b) {
  if (--b->refs > 0) return;
  if (b->indexed && config_.budget_bytes > 0) {
    touch_locked(b);
  } else if (b->indexed) {
    evict_locked(b);
  } else {
    free_block_locked(b);
  }
}

void PrefixCache::free_block_locked(Block* b) {
  if (b->evict_stamp) evictable_.erase({b->evict_stamp, b->id});
  stats_.bytes -= block_cost_;
  blocks_.erase(b->id);
}

void PrefixCache::evict_locked(Block* b) {
  Node* parent = b->parent;
  if (parent) {
    if (b->partial) {
      auto& pc = parent->partial_children;
      pc.erase(std::remove(pc.begin(), pc.end(), b), pc.end());
    } else {
      parent->full_children.erase(b->hash);
    }
  }
  // Children of an evicted block become unreachable; eviction only picks
  // leaves, but clear() and disabled caches may reach here with children.
  for (auto& [h, child] : b->full_children) child->parent = nullptr, child->indexed = false;
  for (Block* child : b->partial_children) child->parent = nullptr, child->indexed = false;
  if (evicted_hashes_.size() > 65536) evicted_hashes_.clear();
  evicted_hashes_.insert(b->hash);
  stats_.evictions++;
  free_block_locked(b);
  // Empty roots are pruned in enforce_budget_locked(), never here: callers may
  // still hold the parent pointer.
  if (parent && !parent->is_root) update_evictable_locked(static_cast<Block*>(parent));
}

void PrefixCache::enforce_budget_locked() {
  while (stats_.bytes > config_.budget_bytes && !evictable_.empty())
    evict_locked(blocks_.at(evictable_.begin()->second).get());
  std::erase_if(roots_, [](const auto& kv) { return !kv.second->has_children(); });
}

CacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  CacheStats s = stats_;
  s.blocks = blocks_.size();
  s.blocks_in_use = s.blocks_cached = s.blocks_shared = 0;
  for (const auto& [id, b] : blocks_) {
    if (b->refs > 0) s.blocks_in_use++;
    if (b->refs > 1) s.blocks_shared++;
    if (b->refs == 0 && b->indexed) s.blocks_cached++;
  }
  s.bytes_in_use = s.blocks_in_use * block_cost_;
  return s;
}

std::string PrefixCache::check_invariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::unordered_map<const Block*, int> refs;
  for (const CachedSequence* seq : live_)
    for (const Block* b : seq->table_) refs[b]++;
  if (stats_.bytes != blocks_.size() * block_cost_)
    return "byte accounting " + std::to_string(stats_.bytes) + " != " + std::to_string(blocks_.size()) +
           " blocks x " + std::to_string(block_cost_);
  size_t n_evictable = 0;
  for (const auto& [id, b] : blocks_) {
    int want = refs.count(b.get()) ? refs[b.get()] : 0;
    if (b->refs != want)
      return "block " + std::to_string(id) + " has refs " + std::to_string(b->refs) + ", sequences hold " +
             std::to_string(want);
    if (!b->indexed && b->refs == 0) return "block " + std::to_string(id) + " leaked (unindexed, unreferenced)";
    if (b->tokens.size() > static_cast<size_t>(block_tokens_) || b->keys.size() != b->tokens.size())
      return "block " + std::to_string(id) + " claims more tokens than it holds";
    if (b->indexed) {
      if (!b->parent) return "indexed block " + std::to_string(id) + " has no parent";
      bool linked = b->partial ? std::count(b->parent->partial_children.begin(), b->parent->partial_children.end(), b.get()) == 1
                               : (b->parent->full_children.count(b->hash) && b->parent->full_children.at(b->hash) == b.get());
      if (!linked) return "indexed block " + std::to_string(id) + " is not linked from its parent";
      if (!b->partial && b->tokens.size() != static_cast<size_t>(block_tokens_))
        return "full block " + std::to_string(id) + " is not full";
    }
    bool should = b->indexed && b->refs == 0 && !b->has_children();
    bool listed = b->evict_stamp != 0 && evictable_.count({b->evict_stamp, b->id});
    if (should != listed) return "block " + std::to_string(id) + " evictable-list state is wrong";
    n_evictable += listed;
  }
  if (n_evictable != evictable_.size()) return "evictable list holds unknown blocks";
  if (live_.empty() && config_.budget_bytes < stats_.bytes) return "over budget with no live sequences";
  return "";
}

// ---- CachedSequence ----

CachedSequence::CachedSequence(PrefixCache& cache, const Hash128& ns) : cache_(cache), ns_(ns) {
  const auto& layers = cache_.spec_.layers;
  conv_.resize(layers.size());
  ssm_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].kind != LayerStateKind::Recurrent) continue;
    conv_[l].assign(layers[l].conv_state_floats, 0.0f);
    ssm_[l].assign(layers[l].ssm_state_floats, 0.0f);
  }
}

CachedSequence::~CachedSequence() {
  release_all();
  // Released blocks may now be evicted for another tier's growth.
  cache_.budget_link_.enforce();
}

void CachedSequence::release_all() {
  std::lock_guard<std::mutex> lock(cache_.mutex_);
  const int B = cache_.block_tokens_;
  if (hold_from_ < n_tokens()) truncate_locked(hold_from_);  // tentative positions are never cached
  // The partial tail becomes a cached partial block, so a continuation of this
  // exact text (the next turn) reuses it.
  if (!table_.empty() && cache_.config_.budget_bytes > 0) {
    PrefixCache::Block* tail = table_.back();
    const size_t bi = table_.size() - 1;
    const size_t valid = tokens_.size() - bi * B;
    if (!tail->indexed && valid > 0 && valid < static_cast<size_t>(B) && tail->refs == 1) {
      PrefixCache::Node* parent = bi == 0 ? cache_.root_locked(ns_, true)
                                          : (table_[bi - 1]->indexed ? table_[bi - 1] : nullptr);
      if (parent) {
        std::span<const int32_t> toks(tail->tokens);
        bool covered = false;
        auto covers = [&](const PrefixCache::Block* c) {
          return c->tokens.size() >= toks.size() && std::equal(toks.begin(), toks.end(), c->tokens.begin()) &&
                 std::equal(tail->keys.begin(), tail->keys.end(), c->keys.begin());
        };
        for (auto& [h, c] : parent->full_children) covered |= covers(c);
        for (auto* c : parent->partial_children) covered |= covers(c);
        if (!covered) {
          // Drop unreferenced partial siblings this block extends.
          std::vector<PrefixCache::Block*> redundant;
          for (auto* c : parent->partial_children) {
            if (c->refs == 0 && c->tokens.size() <= toks.size() &&
                std::equal(c->tokens.begin(), c->tokens.end(), toks.begin()) &&
                std::equal(c->keys.begin(), c->keys.end(), tail->keys.begin()))
              redundant.push_back(c);
          }
          for (auto* c : redundant) cache_.evict_locked(c);
          tail->hash = block_hash(parent->hash, toks, hash_keys(tail->keys));
          tail->parent = parent;
          tail->indexed = true;
          tail->partial = true;
          parent->partial_children.push_back(tail);
          if (!parent->is_root) cache_.update_evictable_locked(static_cast<PrefixCache::Block*>(parent));
        }
      }
    }
  }
  // Release tail first so heads stay more recently used than their tails.
  for (auto it = table_.rbegin(); it != table_.rend(); ++it) cache_.release_locked(*it);
  table_.clear();
  cache_.live_.erase(this);
  cache_.enforce_budget_locked();
}

ReuseReport CachedSequence::attach_prefix(std::span<const int32_t> tokens, std::span<const Hash128> keys) {
  if (!tokens_.empty()) throw Error("attach_prefix on a non-empty sequence");
  if (!keys.empty() && keys.size() != tokens.size()) throw Error("attach_prefix: keys/tokens length mismatch");
  std::lock_guard<std::mutex> lock(cache_.mutex_);
  const int B = cache_.block_tokens_;
  ReuseReport report;
  report.prompt_tokens = static_cast<int64_t>(tokens.size());
  cache_.stats_.lookups++;
  cache_.stats_.tokens_looked_up += tokens.size();
  const int64_t limit = static_cast<int64_t>(tokens.size()) - 1;  // always compute the last token
  auto finish = [&](const char* reason, int64_t pos) {
    report.stop_reason = reason;
    report.stop_position = pos;
    report.reused_tokens = static_cast<int64_t>(tokens_.size());
    if (report.reused_tokens > 0) {
      cache_.stats_.hits++;
      cache_.stats_.tokens_reused += report.reused_tokens;
    } else {
      cache_.stats_.misses++;
    }
    return report;
  };
  if (cache_.config_.budget_bytes == 0) return finish("disabled", 0);
  if (limit <= 0) return finish("full", 0);
  PrefixCache::Node* node = cache_.root_locked(ns_, false);
  if (!node) return finish("empty-namespace", 0);

  auto attach = [&](PrefixCache::Block* b, int64_t pos, int64_t n) {
    b->refs++;
    cache_.touch_locked(b);
    table_.push_back(b);
    tokens_.insert(tokens_.end(), tokens.begin() + pos, tokens.begin() + pos + n);
    for (int64_t i = 0; i < n; ++i) keys_.push_back(key_at(keys, pos + i));
  };
  auto same_keys = [&](const PrefixCache::Block* b, int64_t pos, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      if (b->keys[i] != key_at(keys, pos + i)) return false;
    return true;
  };

  int64_t pos = 0;
  Hash128 missing{};
  for (;;) {
    if (pos + B <= limit) {
      std::span<const int32_t> block_tokens = tokens.subspan(pos, B);
      std::span<const Hash128> block_keys = keys.empty() ? std::span<const Hash128>{} : keys.subspan(pos, B);
      const Hash128 h = block_hash(node->hash, block_tokens, hash_keys(block_keys));
      auto it = node->full_children.find(h);
      // The hash finds the candidate; the tokens confirm it (no collision can serve wrong state).
      if (it != node->full_children.end() &&
          std::equal(block_tokens.begin(), block_tokens.end(), it->second->tokens.begin()) &&
          same_keys(it->second, pos, B)) {
        attach(it->second, pos, B);
        node = it->second;
        pos += B;
        continue;
      }
      missing = h;
    }
    // Longest partial match among the children (full or partial blocks).
    PrefixCache::Block* best = nullptr;
    int64_t best_len = 0;
    auto consider = [&](PrefixCache::Block* c) {
      int64_t n = std::min<int64_t>(static_cast<int64_t>(c->tokens.size()), limit - pos);
      int64_t l = 0;
      while (l < n && c->tokens[l] == tokens[pos + l] && c->keys[l] == key_at(keys, pos + l)) ++l;
      if (l > best_len) best = c, best_len = l;
    };
    for (auto& [h, c] : node->full_children) consider(c);
    for (auto* c : node->partial_children) consider(c);
    if (best) {
      attach(best, pos, best_len);
      pos += best_len;
      return finish(pos >= limit ? "full" : "divergence", pos);
    }
    if (pos >= limit) return finish("full", pos);
    if (node->has_children()) return finish("divergence", pos);
    if (!missing.is_zero() && cache_.evicted_hashes_.count(missing)) return finish("evicted", pos);
    return finish("end-of-cache", pos);
  }
}

void CachedSequence::prepare(int64_t first_write, int64_t end) {
  prepare_blocks(first_write, end);
  // New blocks count against a shared budget: make room in the other tiers.
  cache_.budget_link_.enforce();
}

void CachedSequence::prepare_blocks(int64_t first_write, int64_t end) {
  std::lock_guard<std::mutex> lock(cache_.mutex_);
  const int B = cache_.block_tokens_;
  const size_t need = static_cast<size_t>((end + B - 1) / B);
  for (size_t bi = static_cast<size_t>(first_write / B); bi < table_.size() && bi < need; ++bi) {
    PrefixCache::Block* b = table_[bi];
    if (!b->indexed && b->refs == 1) continue;
    // Shared or indexed (immutable): copy before writing.
    PrefixCache::Block* copy = cache_.allocate_locked();
    if (cache_.block_halfs_) std::memcpy(copy->data.get(), b->data.get(), cache_.block_bytes_);
    const size_t valid = std::min<size_t>(B, tokens_.size() > bi * B ? tokens_.size() - bi * B : 0);
    copy->tokens.assign(b->tokens.begin(), b->tokens.begin() + std::min(valid, b->tokens.size()));
    copy->keys.assign(b->keys.begin(), b->keys.begin() + copy->tokens.size());
    cache_.stats_.copies_on_write++;
    cache_.release_locked(b);
    table_[bi] = copy;
  }
  while (table_.size() < need) table_.push_back(cache_.allocate_locked());
  cache_.enforce_budget_locked();
}

Hash128 CachedSequence::parent_hash_locked(size_t bi) const { return bi == 0 ? ns_ : table_[bi - 1]->hash; }

void CachedSequence::commit(std::span<const int32_t> tokens, std::span<const Hash128> keys) {
  if (!keys.empty() && keys.size() != tokens.size()) throw Error("commit: keys/tokens length mismatch");
  std::lock_guard<std::mutex> lock(cache_.mutex_);
  const int B = cache_.block_tokens_;
  if (static_cast<size_t>((tokens_.size() + tokens.size() + B - 1) / B) > table_.size())
    throw Error("commit past prepared positions");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const size_t pos = tokens_.size();
    const size_t bi = pos / B;
    PrefixCache::Block* b = table_[bi];
    tokens_.push_back(tokens[i]);
    keys_.push_back(key_at(keys, i));
    b->tokens.resize(pos - bi * B);  // drop stale tail from a truncation
    b->keys.resize(b->tokens.size());
    b->tokens.push_back(tokens[i]);
    b->keys.push_back(key_at(keys, i));
    if (b->tokens.size() == static_cast<size_t>(B) && static_cast<int64_t>((bi + 1) * B) <= hold_from_)
      index_full_block_locked(bi);
  }
  cache_.enforce_budget_locked();
}

void CachedSequence::hold_index_from(int64_t n) {
  std::lock_guard<std::mutex> lock(cache_.mutex_);
  hold_from_ = std::min(hold_from_, n);
}

void CachedSequence::settle() {
  std::lock_guard<std::mutex> lock(cache_.mutex_);
  if (hold_from_ == INT64_MAX) return;
  const size_t B = static_cast<size_t>(cache_.block_tokens_);
  const size_t first = static_cast<size_t>(hold_from_) / B;
  hold_from_ = INT64_MAX;
  for (size_t bi = first; bi < tokens_.size() / B; ++bi) index_full_block_locked(bi);
}

void CachedSequence::index_full_block_locked(size_t bi) {
  if (cache_.config_.budget_bytes == 0) return;
  PrefixCache::Block* b = table_[bi];
  if (b->indexed) return;
  PrefixCache::Node* parent = bi == 0 ? cache_.root_locked(ns_, true) : table_[bi - 1];
  if (bi > 0 && !table_[bi - 1]->indexed) return;  // chain broken (e.g. budget changed)
  const Hash128 h = block_hash(parent->hash, b->tokens, hash_keys(b->keys));
  auto it = parent->full_children.find(h);
  if (it != parent->full_children.end()) {
    PrefixCache::Block* existing = it->second;
    if (existing->tokens == b->tokens && existing->keys == b->keys) {
      // Computed twice (e.g. two concurrent requests): share the indexed copy.
      // Kernels are deterministic, so the two hold identical state.
      existing->refs++;
      cache_.touch_locked(existing);
      table_[bi] = existing;
      cache_.release_locked(b);
    }
    return;
  }
  // A partial sibling that this full block extends is now redundant.
  std::vector<PrefixCache::Block*> redundant;
  for (auto* c : parent->partial_children)
    if (c->refs == 0 && std::equal(c->tokens.begin(), c->tokens.end(), b->tokens.begin()) &&
        std::equal(c->keys.begin(), c->keys.end(), b->keys.begin()))
      redundant.push_back(c);
  for (auto* c : redundant) cache_.evict_locked(c);
  b->hash = h;
  b->parent = parent;
  b->indexed = true;
  b->partial = false;
  parent->full_children.emplace(h, b);
  b->last_used = next_use_stamp();
  if (!parent->is_root) cache_.update_evictable_locked(static_cast<PrefixCache::Block*>(parent));
}

void CachedSequence::truncate(int64_t n) {
  std::lock_guard<std::mutex> lock(cache_.mutex_);
  truncate_locked(n);
}

void CachedSequence::truncate_locked(int64_t n) {
  if (n >= static_cast<int64_t>(tokens_.size())) return;
  const int B = cache_.block_tokens_;
  tokens_.resize(n);
  keys_.resize(n);
  const size_t keep = static_cast<size_t>((n + B - 1) / B);
  while (table_.size() > keep) {
    cache_.release_locked(table_.back());
    table_.pop_back();
  }
  if (keep > 0) {
    PrefixCache::Block* b = table_[keep - 1];
    if (!b->indexed && b->refs == 1) {
      b->tokens.resize(n - (keep - 1) * B);
      b->keys.resize(b->tokens.size());
    }
  }
}

uint16_t* CachedSequence::key(int layer, int64_t pos) {
  const int B = cache_.block_tokens_;
  return table_[pos / B]->data.get() + cache_.key_offset_[layer] + (pos % B) * cache_.spec_.layers[layer].head_dim_k;
}

uint16_t* CachedSequence::value(int layer, int64_t pos) {
  const int B = cache_.block_tokens_;
  return table_[pos / B]->data.get() + cache_.value_offset_[layer] + (pos % B) * cache_.spec_.layers[layer].head_dim_v;
}

int64_t CachedSequence::kv_head_stride(int layer) const { return cache_.head_stride_[layer]; }

int64_t CachedSequence::key_group(int /*layer*/) const { return key_group_for(cache_.block_tokens_); }

void CachedSequence::kv_rows(int layer, int64_t first, int64_t end, const uint16_t** keys,
                             const uint16_t** values) {
  const int B = cache_.block_tokens_;
  const int64_t ks = cache_.spec_.layers[layer].head_dim_k, vs = cache_.spec_.layers[layer].head_dim_v;
  for (int64_t p = first; p < end;) {
    const uint16_t* data = table_[p / B]->data.get();
    const uint16_t* k = data + cache_.key_offset_[layer];
    const uint16_t* v = data + cache_.value_offset_[layer];
    const int64_t block_end = std::min(end, (p / B + 1) * B);
    for (; p < block_end; ++p) {
      keys[p - first] = k + (p % B) * ks;
      values[p - first] = v + (p % B) * vs;
    }
  }
}

}  // namespace reprise
