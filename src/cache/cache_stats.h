// Cumulative and current counters of a prefix cache (for /metrics and logs).
#pragma once
#include <cstdint>

namespace reprise {

struct CacheStats {
  uint64_t lookups = 0;
  uint64_t hits = 0;            // lookups that reused at least one token
  uint64_t misses = 0;
  uint64_t tokens_looked_up = 0;
  uint64_t tokens_reused = 0;
  uint64_t evictions = 0;       // blocks evicted
  uint64_t copies_on_write = 0;
  uint64_t blocks = 0;          // blocks that exist now
  uint64_t blocks_in_use = 0;   // referenced by a live sequence
  uint64_t blocks_cached = 0;   // indexed and unreferenced (evictable)
  uint64_t blocks_shared = 0;   // referenced by more than one sequence
  uint64_t bytes = 0;           // bytes of all blocks
  uint64_t bytes_in_use = 0;
  uint64_t budget_bytes = 0;
};

}  // namespace reprise
