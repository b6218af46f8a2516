#include "server/response_store.h"

#include <vector>


namespace reprise {

namespace {
// Bookkeeping beside the JSON text of an entry (map node, list node, strings).
constexpr size_t kEntryOverhead = 256;
}  // namespace

bool ResponseStore::put(StoredResponse response) {
  const size_t bytes = kEntryOverhead + response.id.capacity() + response.cache_salt.capacity() +
                       response.previous_response_id.capacity() + response.response.capacity() +
                       response.input_items.capacity() + response.messages.capacity();
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto old = entries_.find(response.id); old != entries_.end()) {
    bytes_ -= old->second.bytes;
    lru_.erase(old->second.lru);
    entries_.erase(old);
  }
  if (bytes > budget_bytes_) return false;
  const std::string id = response.id;
  lru_.push_front(id);
  entries_[id] = Entry{std::make_shared<const StoredResponse>(std::move(response)), bytes, lru_.begin()};
  bytes_ += bytes;
  evict_locked();
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::find_locked(const std::string& id,
                                                                 const std::string& cache_salt) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.response->cache_salt != cache_salt) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.response;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id, const std::string& cache_salt) {
  std::lock_guard<std::mutex> lock(mutex_);
  return find_locked(id, cache_salt);
}

std::optional<nlohmann::ordered_json> ResponseStore::conversation(const std::string& id,
                                                                  const std::string& cache_salt,
                                                                  std::string* missing) {
  std::vector<std::shared_ptr<const StoredResponse>> turns;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A chain is finite: each response names one stored before it. The
    // bound only guards against a store grown out of its own invariant.
    for (std::string at = id; !at.empty() && turns.size() <= entries_.size();) {
      std::shared_ptr<const StoredResponse> turn = find_locked(at, cache_salt);
      if (!turn) {
        if (missing) *missing = at;
        return std::nullopt;
      }
      at = turn->previous_response_id;
      turns.push_back(std::move(turn));
    }
  }
  // Parsed outside the lock (the turns are shared, immutable).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (auto turn = turns.rbegin(); turn != turns.rend(); ++turn)
    for (auto& m : nlohmann::ordered_json::parse((*turn)->messages)) messages.push_back(std::move(m));
  return messages;
}

bool ResponseStore::erase(const std::string& id, const std::string& cache_salt) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.response->cache_salt != cache_salt) return false;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
  return true;
}

void ResponseStore::evict_locked() {
  while (bytes_ > budget_bytes_ && !lru_.empty()) {
    auto it = entries_.find(lru_.back());
    bytes_ -= it->second.bytes;
    entries_.erase(it);
    lru_.pop_back();
  }
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace reprise
