// Cache identity: 128-bit hashes for namespaces and block chains.
//
// A namespace is everything that makes cached state valid: the model's
// execution fingerprint, the adapter, the tenant's cache salt and the cache
// format version. A block's hash covers its parent's hash, its tokens and its
// extra keys (e.g. image digests), so every block depends on all before it.
#pragma once
#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace reprise {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool is_zero() const { return lo == 0 && hi == 0; }
  auto operator<=>(const Hash128&) const = default;
  std::string hex() const;
};

struct Hash128Hasher {
  size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

// Bumped whenever the stored layout or hashing changes, so old state never matches.
constexpr uint32_t kCacheFormatVersion = 1;

struct NamespaceKey {
  std::array<uint64_t, 2> model_fingerprint{};
  std::string adapter_id;   // LoRA adapter identity; empty = base weights
  std::string cache_salt;   // tenant isolation (OpenAI/vLLM `cache_salt`)
  std::string extra;        // anything else that changes the computation
  uint32_t format_version = kCacheFormatVersion;

  Hash128 hash() const;
};

// Hash of one block: parent (namespace hash for the first block), the block's
// tokens and its per-position extra keys (empty when there are none).
Hash128 block_hash(const Hash128& parent, std::span<const int32_t> tokens,
                   std::span<const Hash128> extra_keys);

// 128-bit hash of arbitrary bytes (image digests, fingerprints).
Hash128 hash_bytes(const void* data, size_t n, uint64_t seed = 0);

}  // namespace reprise
