// Prompts being prefilled right now, so concurrent requests compute a shared
// prefix once.
//
// The prefix cache serves what earlier requests committed; requests that
// arrive together (an agent fanning out, a batch job, several users of one
// system prompt) would each compute their common prefix before any of them
// commits it. So a request about to prefill first looks for an earlier one,
// in the same cache namespace, that is computing a prompt sharing at least
// `min_shared` leading positions (tokens and per-position keys) with its own
// and has not committed them yet; it waits until that request has (or has
// stopped), then attaches the committed blocks from the cache like any hit.
// A request waits only on requests listed before it, and listed requests
// never wait, so waits cannot form a cycle.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>

#include "cache/cache_key.h"

namespace reprise {

class InflightPrefixes {
  struct Entry {
    Hash128 ns;
    std::span<const int32_t> prompt;
    std::span<const Hash128> keys;
    int64_t committed = 0;
  };

 public:
  // Shared prefixes shorter than this are computed again rather than waited
  // for (one cache block: nothing shorter can be reused).
  explicit InflightPrefixes(int64_t min_shared) : min_shared_(min_shared) {}
  InflightPrefixes(const InflightPrefixes&) = delete;
  InflightPrefixes& operator=(const InflightPrefixes&) = delete;

  // A listed prefill; unlisted (and waiters woken) when destroyed.
  class Prefill {
   public:
    ~Prefill();
    Prefill(const Prefill&) = delete;
    Prefill& operator=(const Prefill&) = delete;
    // Positions [0, n) of the prompt are committed to the cache.
    void committed(int64_t n);

   private:
    friend class InflightPrefixes;
    Prefill(InflightPrefixes& owner, std::list<Entry>::iterator entry) : owner_(owner), entry_(entry) {}
    InflightPrefixes& owner_;
    std::list<Entry>::iterator entry_;
  };

  // Waits while an earlier listed prefill is computing a shared prefix of
  // `prompt` (keys: per-position extra keys, or empty), then lists this one.
  // The spans must outlive the returned Prefill. `waited` (optional) is set
  // to whether it had to wait. Returns null, unlisted, once `cancelled` (if
  // given) is set while waiting.
  [[nodiscard]] std::unique_ptr<Prefill> begin(const Hash128& ns, std::span<const int32_t> prompt,
                                               std::span<const Hash128> keys, bool* waited = nullptr,
                                               const std::atomic<bool>* cancelled = nullptr);

 private:
  // Leading positions where a and b hold the same token and key.
  static int64_t shared_length(const Entry& a, const Entry& b);

  const int64_t min_shared_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::list<Entry> entries_;
};

}  // namespace reprise
