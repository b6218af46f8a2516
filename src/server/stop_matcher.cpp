#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace reprise {

StopMatcher::StopMatcher(std::vector<std::string> stop_strings) : stops_(std::move(stop_strings)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  if (stops_.empty()) return std::exchange(pending_, {});

  // Earliest complete match wins (ties: the longer stop string).
  size_t best = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t at = pending_.find(stop);
    if (at != std::string::npos && (at < best || (at == best && stop.size() > matched_.size()))) {
      best = at;
      matched_ = stop;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) == std::string_view(stop).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(pending_, {});
}

}  // namespace reprise
