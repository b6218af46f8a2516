// Responses kept for the Responses API's `store` (default true): what
// GET /v1/responses/{id} returns, what previous_response_id continues, and
// GET .../input_items lists.
//
// A stored response holds its own turn only (its input and output as chat
// messages) and names the response it continued; a conversation is put back
// together by walking that chain, so a long conversation costs its length
// once, not once per turn. Memory is bounded by accounting (the JSON's
// serialised size against a byte budget); the least recently used responses
// go first, and reading a conversation marks its whole chain used. A
// response is visible only under the cache_salt it was made with, as the
// prefix cache is: another tenant sees "not found".
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace reprise {

// Held serialised, so what the budget counts is what the store holds.
struct StoredResponse {
  std::string id;
  std::string cache_salt;
  std::string previous_response_id;  // "" starts a conversation
  std::string response;              // the Response object as returned (JSON)
  std::string input_items;           // JSON array
  std::string messages;              // JSON array: this turn as chat messages, its input then its reply
};

class ResponseStore {
 public:
  explicit ResponseStore(size_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // Keeps the response, evicting the least recently used beyond the
  // budget; false (nothing kept) when it alone exceeds the budget.
  bool put(StoredResponse response);
  // The response stored under `id` and `cache_salt`, or null.
  std::shared_ptr<const StoredResponse> get(const std::string& id, const std::string& cache_salt);
  // The conversation's chat messages up to and including `id`'s turn, or
  // nullopt when it, or a response it continued, is not stored (evicted or
  // deleted) under this salt; `missing` then names the first one missing.
  std::optional<nlohmann::ordered_json> conversation(const std::string& id, const std::string& cache_salt,
                                                     std::string* missing = nullptr);
  // True when a response was removed.
  bool erase(const std::string& id, const std::string& cache_salt);

  size_t bytes() const;
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<const StoredResponse> response;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
  };
  // Requires mutex_ held.
  std::shared_ptr<const StoredResponse> find_locked(const std::string& id, const std::string& cache_salt);
  void evict_locked();

  const size_t budget_bytes_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;
  size_t bytes_ = 0;
};

}  // namespace reprise
