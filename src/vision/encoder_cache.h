// Encoder-output cache: image embeddings by content and model identity.
//
// Re-running the vision tower for an image already seen costs as much as the
// first time; serving one model's image features to another model is wrong
// (a shape mismatch at best). So the key covers everything that determines
// the embedding: a versioned header (format version, modality, the encoder's
// execution fingerprint and the text model's, the preprocessing parameters,
// the decoded image's width/height/channels, the request's tenant salt)
// followed by the preprocessed pixels themselves. Same model pair + same image
// + same salt -> same key; a different model, size, preprocessing or salt
// never collides by construction. The salt is there because a hit is visible
// in response timings: tenants with different salts must not learn whether
// another sent an image, as they cannot for a prompt prefix.
//
// The same 128-bit key is the image's digest in prompts: it is the per-position
// extra key of the image's tokens in the prefix cache, so cached KV blocks
// holding image tokens are tied to exactly this embedding.
//
// Accounting: a byte budget (0 disables storing), least-recently-used
// eviction, an entry larger than the whole budget is returned but not
// stored. Concurrent requests for the same key encode once (single-flight):
// later callers wait for the first one's result. The encoder runs outside the
// cache's lock, so lookups and hits never wait behind an encode of another
// image. Entries are shared_ptr: an entry evicted while a request still uses
// it stays alive until that request drops it (such bytes are not counted).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_key.h"
#include "cache/memory_budget.h"

namespace reprise {

// Bumped whenever the key layout or what an embedding means changes.
constexpr uint32_t kEncoderCacheFormatVersion = 2;

enum class Modality : uint32_t { Image = 1 };

struct EncoderKeyHeader {
  uint32_t format_version = kEncoderCacheFormatVersion;
  Modality modality = Modality::Image;
  std::array<uint64_t, 2> encoder_fingerprint{};
  std::array<uint64_t, 2> text_model_fingerprint{};
  std::string preprocessing;  // PreprocessParams::describe()
  int64_t decoded_width = 0;
  int64_t decoded_height = 0;
  int64_t decoded_channels = 3;
  std::string tenant_salt;  // the request's cache_salt ("" = none)
};

// The header, then the preprocessed pixel bytes (exactly what the encoder reads).
Hash128 encoder_cache_key(const EncoderKeyHeader& header, std::span<const float> pixels);

// One image's soft tokens, n_tokens x n_embd floats in the text model's space.
struct ImageEmbedding {
  Hash128 digest;  // the encoder-cache key
  int64_t n_tokens = 0;
  int64_t n_embd = 0;
  std::vector<float> values;
  // Bytes this entry counts against the budget.
  uint64_t bytes() const { return values.size() * sizeof(float) + sizeof(ImageEmbedding); }
};
using ImageEmbeddingPtr = std::shared_ptr<const ImageEmbedding>;

struct EncoderCacheStats {
  uint64_t lookups = 0;
  uint64_t hits = 0;        // served without running the encoder (stored or in-flight)
  uint64_t misses = 0;      // ran the encoder
  uint64_t coalesced = 0;   // hits that waited for a concurrent encode of the same key
  uint64_t evictions = 0;
  uint64_t too_large = 0;   // results larger than the budget, returned but not stored
  uint64_t failures = 0;    // encodes that threw
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t budget_bytes = 0;
  double encode_seconds = 0;  // total time spent encoding misses
  // Encoder time the hits avoided, estimated at the mean time of a miss.
  double saved_seconds() const { return misses ? encode_seconds / misses * hits : 0.0; }
};

class EncoderCache final : private MemoryBudget::Tier {
 public:
  explicit EncoderCache(uint64_t budget_bytes);
  ~EncoderCache() override;
  EncoderCache(const EncoderCache&) = delete;
  EncoderCache& operator=(const EncoderCache&) = delete;

  // Joins (or with null, leaves) a budget shared with other cache tiers,
  // where entries compete by last use; the budget must outlive the cache or
  // be unshared first.
  void share_budget(MemoryBudget* budget) { budget_link_.share(budget); }

  using EncodeFn = std::function<std::vector<float>()>;

  // The embedding for `key`: from the cache, from a concurrent caller's
  // encode of the same key, or by calling `encode` (outside the lock), which
  // must return n_tokens * n_embd floats. If the encode throws, the exception
  // reaches this caller and every caller waiting on it, and nothing is stored.
  ImageEmbeddingPtr get_or_encode(const Hash128& key, int64_t n_tokens, int64_t n_embd, const EncodeFn& encode);

  // A stored entry, or null (counts as a lookup, not as a miss).
  ImageEmbeddingPtr find(const Hash128& key);

  EncoderCacheStats stats() const;
  void set_budget(uint64_t bytes);
  void clear();

 private:
  struct Entry {
    ImageEmbeddingPtr embedding;
    std::list<Hash128>::iterator lru;  // position in lru_ (front = most recent)
    uint64_t used = 0;                  // next_use_stamp() of the last store or hit
  };
  void store_locked(const ImageEmbeddingPtr& e);
  void enforce_budget_locked();

  // MemoryBudget::Tier
  uint64_t charged_bytes() const override;
  uint64_t oldest_evictable_stamp() const override;
  uint64_t evict_oldest() override;

  mutable std::mutex mutex_;
  uint64_t budget_;
  std::unordered_map<Hash128, Entry, Hash128Hasher> entries_;
  std::list<Hash128> lru_;
  std::unordered_map<Hash128, std::shared_future<ImageEmbeddingPtr>, Hash128Hasher> in_flight_;
  EncoderCacheStats stats_;
  BudgetLink budget_link_{this};  // last: leaves the shared budget first
};

}  // namespace reprise
