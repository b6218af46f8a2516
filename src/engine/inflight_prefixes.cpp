#include "engine/inflight_prefixes.h"

#include <algorithm>
#include <chrono>

namespace reprise {

int64_t InflightPrefixes::shared_length(const Entry& a, const Entry& b) {
  const size_t n = std::min(a.prompt.size(), b.prompt.size());
  size_t i = 0;
  while (i < n && a.prompt[i] == b.prompt[i]) {
    const Hash128 ka = a.keys.empty() ? Hash128{} : a.keys[i];
    const Hash128 kb = b.keys.empty() ? Hash128{} : b.keys[i];
    if (!(ka == kb)) break;
    ++i;
  }
  return static_cast<int64_t>(i);
}

std::unique_ptr<InflightPrefixes::Prefill> InflightPrefixes::begin(const Hash128& ns, std::span<const int32_t> prompt,
                                                                   std::span<const Hash128> keys, bool* waited,
                                                                   const std::atomic<bool>* cancelled) {
  const Entry mine{ns, prompt, keys, 0};
  std::unique_lock<std::mutex> lock(mutex_);
  if (waited) *waited = false;
  for (;;) {
    // An earlier prefill that has yet to commit a long enough shared prefix.
    const bool blocked = std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) {
      if (!(e.ns == ns)) return false;
      const int64_t shared = shared_length(e, mine);
      return shared >= min_shared_ && e.committed < shared;
    });
    if (!blocked) break;
    if (waited) *waited = true;
    if (cancelled && cancelled->load()) return nullptr;
    // Cancellation is polled: it is set without notifying.
    changed_.wait_for(lock, std::chrono::milliseconds(20));
  }
  entries_.push_back(mine);
  return std::unique_ptr<Prefill>(new Prefill(*this, std::prev(entries_.end())));
}

void InflightPrefixes::Prefill::committed(int64_t n) {
  std::lock_guard<std::mutex> lock(owner_.mutex_);
  entry_->committed = n;
  owner_.changed_.notify_all();
}

InflightPrefixes::Prefill::~Prefill() {
  std::lock_guard<std::mutex> lock(owner_.mutex_);
  owner_.entries_.erase(entry_);
  owner_.changed_.notify_all();
}

}  // namespace reprise
