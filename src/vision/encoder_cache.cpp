#include "vision/encoder_cache.h"

#include <xxhash.h>

#include <chrono>

#include "util/error.h"

namespace reprise {

namespace {
// Length-prefixed, so adjacent fields can never run into each other.
void update_field(XXH3_state_t* s, const void* data, uint64_t n) {
  XXH3_128bits_update(s, &n, sizeof n);
  XXH3_128bits_update(s, data, n);
}
}  // namespace

Hash128 encoder_cache_key(const EncoderKeyHeader& h, std::span<const float> pixels) {
  XXH3_state_t* s = XXH3_createState();
  if (!s) throw Error("encoder cache key: out of memory");
  XXH3_128bits_reset(s);
  const char tag[] = "reprise-encoder-output";
  update_field(s, tag, sizeof tag);
  update_field(s, &h.format_version, sizeof h.format_version);
  const uint32_t modality = static_cast<uint32_t>(h.modality);
  update_field(s, &modality, sizeof modality);
  update_field(s, h.encoder_fingerprint.data(), sizeof h.encoder_fingerprint);
  update_field(s, h.text_model_fingerprint.data(), sizeof h.text_model_fingerprint);
  update_field(s, h.preprocessing.data(), h.preprocessing.size());
  const int64_t dims[3] = {h.decoded_width, h.decoded_height, h.decoded_channels};
  update_field(s, dims, sizeof dims);
  update_field(s, h.tenant_salt.data(), h.tenant_salt.size());
  update_field(s, pixels.data(), pixels.size_bytes());
  const XXH128_hash_t d = XXH3_128bits_digest(s);
  XXH3_freeState(s);
  return {d.low64, d.high64};
}

EncoderCache::EncoderCache(uint64_t budget_bytes) : budget_(budget_bytes) { stats_.budget_bytes = budget_bytes; }

EncoderCache::~EncoderCache() { budget_link_.share(nullptr); }

ImageEmbeddingPtr EncoderCache::find(const Hash128& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.lookups++;
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  it->second.used = next_use_stamp();
  return it->second.embedding;
}

ImageEmbeddingPtr EncoderCache::get_or_encode(const Hash128& key, int64_t n_tokens, int64_t n_embd,
                                              const EncodeFn& encode) {
  std::promise<ImageEmbeddingPtr> promise;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stats_.lookups++;
    if (auto it = entries_.find(key); it != entries_.end()) {
      stats_.hits++;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      it->second.used = next_use_stamp();
      return it->second.embedding;
    }
    if (auto it = in_flight_.find(key); it != in_flight_.end()) {
      std::shared_future<ImageEmbeddingPtr> pending = it->second;
      stats_.hits++;
      stats_.coalesced++;
      lock.unlock();
      return pending.get();  // rethrows the encoder's exception, if any
    }
    in_flight_.emplace(key, promise.get_future().share());
    stats_.misses++;
  }

  ImageEmbeddingPtr result;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> values = encode();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (n_tokens <= 0 || n_embd <= 0 || values.size() != static_cast<size_t>(n_tokens * n_embd))
      throw Error("encoder returned " + std::to_string(values.size()) + " values, expected " +
                  std::to_string(n_tokens) + " x " + std::to_string(n_embd));
    auto embedding = std::make_shared<ImageEmbedding>();
    embedding->digest = key;
    embedding->n_tokens = n_tokens;
    embedding->n_embd = n_embd;
    embedding->values = std::move(values);
    result = std::move(embedding);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.encode_seconds += seconds;
    in_flight_.erase(key);
    store_locked(result);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_flight_.erase(key);
      stats_.failures++;
    }
    promise.set_exception(std::current_exception());
    throw;
  }
  promise.set_value(result);
  budget_link_.enforce();  // outside the lock: may evict from other tiers
  return result;
}

void EncoderCache::store_locked(const ImageEmbeddingPtr& e) {
  if (budget_ == 0) return;
  if (e->bytes() > budget_) {
    stats_.too_large++;
    return;
  }
  if (entries_.count(e->digest)) return;
  lru_.push_front(e->digest);
  entries_.emplace(e->digest, Entry{e, lru_.begin(), next_use_stamp()});
  stats_.bytes += e->bytes();
  enforce_budget_locked();
}

void EncoderCache::enforce_budget_locked() {
  while (stats_.bytes > budget_ && !lru_.empty()) {
    auto it = entries_.find(lru_.back());
    stats_.bytes -= it->second.embedding->bytes();
    entries_.erase(it);
    lru_.pop_back();
    stats_.evictions++;
  }
}

uint64_t EncoderCache::charged_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.bytes;
}

uint64_t EncoderCache::oldest_evictable_stamp() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lru_.empty() ? 0 : entries_.at(lru_.back()).used;
}

uint64_t EncoderCache::evict_oldest() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lru_.empty()) return 0;
  auto it = entries_.find(lru_.back());
  const uint64_t bytes = it->second.embedding->bytes();
  stats_.bytes -= bytes;
  entries_.erase(it);
  lru_.pop_back();
  stats_.evictions++;
  return bytes;
}

EncoderCacheStats EncoderCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EncoderCacheStats s = stats_;
  s.entries = entries_.size();
  s.budget_bytes = budget_;
  return s;
}

void EncoderCache::set_budget(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  budget_ = bytes;
  enforce_budget_locked();
}

void EncoderCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
  lru_.clear();
  stats_.bytes = 0;
}

}  // namespace reprise
