// Request and token counters for /metrics (Prometheus text format 0.0.4).
//
// Counters recorded by the HTTP layer live here; cache and model figures are
// read from the registry at scrape time, so /metrics never disagrees with
// /v1/cache/stats.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cache/memory_budget.h"
#include "server/model_registry.h"

namespace reprise {

struct SchedulerSnapshot {
  int slots = 0;
  size_t queued = 0;
  size_t running = 0;
};

class Metrics {
 public:
  // `model` may be "" when the request failed before a model was chosen.
  void record_request(const std::string& model, const std::string& endpoint, int status);
  void record_tokens(const std::string& model, int64_t prompt, int64_t cached, int64_t completion);
  void record_cancelled(const std::string& model);
  void record_timing(const std::string& model, double queue_seconds, double prefill_seconds, double decode_seconds);

  // shared_budget: the registry's budget over all cache tiers, or null.
  std::string prometheus(const std::vector<ModelStatus>& models, const SchedulerSnapshot& scheduler,
                         int generation_requests, const MemoryBudget* shared_budget = nullptr) const;

 private:
  struct ModelCounters {
    uint64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0, cancelled = 0;
    double queue_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::tuple<std::string, std::string, int>, uint64_t> requests_;  // (model, endpoint, status)
  std::map<std::string, ModelCounters> models_;
};

// Escapes a Prometheus label value (backslash, quote, newline).
std::string prometheus_label_value(const std::string& value);

}  // namespace reprise
