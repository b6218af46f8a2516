#include "cache/cache_key.h"

#include <xxhash.h>

#include <cstdio>

namespace reprise {

std::string Hash128::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

namespace {
// Length-prefixed fields keep ("ab","c") and ("a","bc") apart.
void update_field(XXH3_state_t* s, const void* data, uint64_t n) {
  XXH3_128bits_update(s, &n, sizeof n);
  XXH3_128bits_update(s, data, n);
}
Hash128 finish(XXH3_state_t* s) {
  XXH128_hash_t h = XXH3_128bits_digest(s);
  XXH3_freeState(s);
  return {h.low64, h.high64};
}
}  // namespace

Hash128 NamespaceKey::hash() const {
  XXH3_state_t* s = XXH3_createState();
  XXH3_128bits_reset(s);
  const char tag[] = "reprise-namespace";
  update_field(s, tag, sizeof tag);
  update_field(s, &format_version, sizeof format_version);
  update_field(s, model_fingerprint.data(), sizeof(uint64_t) * 2);
  update_field(s, adapter_id.data(), adapter_id.size());
  update_field(s, cache_salt.data(), cache_salt.size());
  update_field(s, extra.data(), extra.size());
  return finish(s);
}

Hash128 block_hash(const Hash128& parent, std::span<const int32_t> tokens,
                   std::span<const Hash128> extra_keys) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_128bits_reset(s);
  update_field(s, &parent, sizeof parent);
  update_field(s, tokens.data(), tokens.size_bytes());
  update_field(s, extra_keys.data(), extra_keys.size_bytes());
  return finish(s);
}

Hash128 hash_bytes(const void* data, size_t n, uint64_t seed) {
  XXH128_hash_t h = XXH3_128bits_withSeed(data, n, seed);
  return {h.low64, h.high64};
}

}  // namespace reprise
