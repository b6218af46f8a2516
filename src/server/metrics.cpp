#include "server/metrics.h"

#include <cstdio>
#include <functional>

#include "tensor/huge_pages.h"

namespace reprise {

std::string prometheus_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Metrics::record_request(const std::string& model, const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{model, endpoint, status}];
}

void Metrics::record_tokens(const std::string& model, int64_t prompt, int64_t cached, int64_t completion) {
  std::lock_guard<std::mutex> lock(mutex_);
  ModelCounters& c = models_[model];
  c.prompt_tokens += prompt;
  c.cached_tokens += cached;
  c.completion_tokens += completion;
}

void Metrics::record_cancelled(const std::string& model) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++models_[model].cancelled;
}

void Metrics::record_timing(const std::string& model, double queue_seconds, double prefill_seconds,
                            double decode_seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ModelCounters& c = models_[model];
  c.queue_seconds += queue_seconds;
  c.prefill_seconds += prefill_seconds;
  c.decode_seconds += decode_seconds;
}

namespace {

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(const char* name, const std::string& labels, double value) {
    char num[64];
    std::snprintf(num, sizeof num, "%.17g", value);
    out_ += name;
    if (!labels.empty()) out_ += "{" + labels + "}";
    out_ += ' ';
    out_ += num;
    out_ += '\n';
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string model_label(const std::string& model) { return "model=\"" + prometheus_label_value(model) + "\""; }

}  // namespace

std::string Metrics::prometheus(const std::vector<ModelStatus>& models, const SchedulerSnapshot& scheduler,
                                int generation_requests, const MemoryBudget* shared_budget) const {
  Writer w;
  std::lock_guard<std::mutex> lock(mutex_);

  w.family("reprise_requests_total", "counter", "HTTP requests by model, endpoint and status code.");
  for (const auto& [key, n] : requests_) {
    const auto& [model, endpoint, status] = key;
    w.sample("reprise_requests_total",
             model_label(model) + ",endpoint=\"" + prometheus_label_value(endpoint) + "\",status=\"" +
                 std::to_string(status) + "\"",
             static_cast<double>(n));
  }

  using Field = uint64_t ModelCounters::*;
  const std::tuple<const char*, const char*, Field> token_counters[] = {
      {"reprise_prompt_tokens_total", "Prompt tokens of finished generations.", &ModelCounters::prompt_tokens},
      {"reprise_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache.",
       &ModelCounters::cached_tokens},
      {"reprise_completion_tokens_total", "Generated tokens.", &ModelCounters::completion_tokens},
      {"reprise_cancelled_requests_total", "Generations cancelled because the client went away.",
       &ModelCounters::cancelled},
  };
  for (const auto& [name, help, field] : token_counters) {
    w.family(name, "counter", help);
    for (const auto& [model, c] : models_) w.sample(name, model_label(model), static_cast<double>(c.*field));
  }
  using Seconds = double ModelCounters::*;
  const std::tuple<const char*, const char*, Seconds> time_counters[] = {
      {"reprise_queue_seconds_total", "Time generations waited for a sequence slot.", &ModelCounters::queue_seconds},
      {"reprise_prefill_seconds_total", "Time spent computing uncached prompt tokens.",
       &ModelCounters::prefill_seconds},
      {"reprise_decode_seconds_total", "Time spent generating tokens.", &ModelCounters::decode_seconds},
  };
  for (const auto& [name, help, field] : time_counters) {
    w.family(name, "counter", help);
    for (const auto& [model, c] : models_) w.sample(name, model_label(model), c.*field);
  }

  w.family("reprise_queue_depth", "gauge", "Generations waiting for a sequence slot.");
  w.sample("reprise_queue_depth", "", static_cast<double>(scheduler.queued));
  w.family("reprise_sequences_active", "gauge", "Generations occupying a sequence slot.");
  w.sample("reprise_sequences_active", "", static_cast<double>(scheduler.running));
  w.family("reprise_sequence_slots", "gauge", "Sequence slots (--parallel).");
  w.sample("reprise_sequence_slots", "", scheduler.slots);
  w.family("reprise_generation_requests_in_flight", "gauge",
           "Chat and completion requests queued, generating or streaming their response.");
  w.sample("reprise_generation_requests_in_flight", "", generation_requests);
  const StreamedMemoryStats weights = streamed_memory_stats();
  w.family("reprise_weight_memory_bytes", "gauge",
           "Memory mapped for the loaded models' packed weights (huge-page slabs; unmapped when a model unloads).");
  w.sample("reprise_weight_memory_bytes", "", static_cast<double>(weights.mapped_bytes));

  struct ModelGauge {
    const char* name;
    const char* type;
    const char* help;
    std::function<double(const ModelStatus&)> value;
  };
  const ModelGauge per_model[] = {
      {"reprise_model_loaded", "gauge", "1 when the model is loaded.", [](const ModelStatus& s) { return s.loaded ? 1.0 : 0.0; }},
      {"reprise_model_requests_in_flight", "gauge", "Requests holding the model.",
       [](const ModelStatus& s) { return double(s.in_flight); }},
      {"reprise_model_loads_total", "counter", "Times the model was loaded.", [](const ModelStatus& s) { return double(s.loads); }},
      {"reprise_model_unloads_total", "counter", "Times the model was unloaded to free RAM.",
       [](const ModelStatus& s) { return double(s.unloads); }},
      {"reprise_model_ram_bytes", "gauge", "RAM counted against --models-max-ram (file size + cache budget).",
       [](const ModelStatus& s) { return double(s.footprint_bytes); }},
      {"reprise_cache_lookups_total", "counter", "Prefix cache lookups.", [](const ModelStatus& s) { return double(s.cache.lookups); }},
      {"reprise_cache_hits_total", "counter", "Lookups that reused at least one token.",
       [](const ModelStatus& s) { return double(s.cache.hits); }},
      {"reprise_cache_misses_total", "counter", "Lookups that reused nothing.", [](const ModelStatus& s) { return double(s.cache.misses); }},
      {"reprise_cache_tokens_reused_total", "counter", "Prompt tokens reused from the cache.",
       [](const ModelStatus& s) { return double(s.cache.tokens_reused); }},
      {"reprise_cache_evictions_total", "counter", "Cache blocks evicted to stay within the budget.",
       [](const ModelStatus& s) { return double(s.cache.evictions); }},
      {"reprise_cache_copies_on_write_total", "counter", "Shared cache blocks copied before a write.",
       [](const ModelStatus& s) { return double(s.cache.copies_on_write); }},
      {"reprise_cache_bytes", "gauge", "Bytes of all cache blocks.", [](const ModelStatus& s) { return double(s.cache.bytes); }},
      {"reprise_cache_bytes_in_use", "gauge", "Bytes of blocks referenced by live sequences.",
       [](const ModelStatus& s) { return double(s.cache.bytes_in_use); }},
      {"reprise_cache_budget_bytes", "gauge", "Cache budget (--cache-ram).", [](const ModelStatus& s) { return double(s.cache.budget_bytes); }},
      {"reprise_snapshot_hits_total", "counter", "Recurrent-state snapshot restores (current load).",
       [](const ModelStatus& s) { return double(s.snapshots.hits); }},
      {"reprise_snapshot_misses_total", "counter", "Lookups that found no usable snapshot (current load).",
       [](const ModelStatus& s) { return double(s.snapshots.misses); }},
      {"reprise_snapshot_tokens_saved_total", "counter", "Positions not recomputed thanks to snapshot restores.",
       [](const ModelStatus& s) { return double(s.snapshots.tokens_saved); }},
      {"reprise_snapshot_evictions_total", "counter", "Snapshots evicted to stay within limits.",
       [](const ModelStatus& s) { return double(s.snapshots.evictions); }},
      {"reprise_snapshot_entries", "gauge", "Snapshots held.", [](const ModelStatus& s) { return double(s.snapshots.entries); }},
      {"reprise_snapshot_bytes", "gauge", "Bytes of snapshots held (--snapshot-ram).",
       [](const ModelStatus& s) { return double(s.snapshots.bytes); }},
      {"reprise_encoder_cache_hits_total", "counter", "Vision encoder-output cache hits (current load).",
       [](const ModelStatus& s) { return double(s.encoder.hits); }},
      {"reprise_encoder_cache_misses_total", "counter", "Images the vision encoder ran for (current load).",
       [](const ModelStatus& s) { return double(s.encoder.misses); }},
      {"reprise_encoder_cache_evictions_total", "counter", "Encoder-cache entries evicted.",
       [](const ModelStatus& s) { return double(s.encoder.evictions); }},
      {"reprise_encoder_cache_entries", "gauge", "Encoder-cache entries held.", [](const ModelStatus& s) { return double(s.encoder.entries); }},
      {"reprise_encoder_cache_bytes", "gauge", "Bytes of encoder outputs held (--mm-cache-bytes).",
       [](const ModelStatus& s) { return double(s.encoder.bytes); }},
      {"reprise_draft_tokens_total", "counter", "Tokens proposed by the draft model (current load).",
       [](const ModelStatus& s) { return double(s.drafted_tokens); }},
      {"reprise_draft_accepted_tokens_total", "counter", "Drafted tokens the target accepted (current load).",
       [](const ModelStatus& s) { return double(s.accepted_tokens); }},
      {"reprise_prefix_waits_total", "counter",
       "Requests that waited for a concurrent request to compute a prompt prefix they share, instead of "
       "computing it again (current load).",
       [](const ModelStatus& s) { return double(s.prefix_waits); }},
      {"reprise_forward_passes_total", "counter",
       "Forward passes of requests (current load); each runs one or more concurrent sequences' work.",
       [](const ModelStatus& s) { return double(s.passes.passes); }},
      {"reprise_forward_pass_sequences_total", "counter",
       "Sequence batches (decode steps, prompt chunks) those passes ran (current load): divided by the passes, "
       "the mean batch.",
       [](const ModelStatus& s) { return double(s.passes.sequences); }},
      {"reprise_forward_pass_sequences_max", "gauge", "The most sequences one forward pass ran (current load).",
       [](const ModelStatus& s) { return double(s.passes.max_sequences); }},
      {"reprise_draft_forward_passes_total", "counter",
       "Forward passes of the draft model (speculative decoding, current load); concurrent requests share them.",
       [](const ModelStatus& s) { return double(s.draft_passes.passes); }},
      {"reprise_draft_forward_pass_sequences_total", "counter",
       "Sequence batches the draft model's passes ran (current load): divided by its passes, the mean batch.",
       [](const ModelStatus& s) { return double(s.draft_passes.sequences); }},
  };
  for (const ModelGauge& g : per_model) {
    w.family(g.name, g.type, g.help);
    for (const ModelStatus& s : models) w.sample(g.name, model_label(s.id), g.value(s));
  }
  w.family("reprise_memory_bytes", "gauge",
           "Bytes held per cache kind (kv = prefix cache blocks, snapshots = recurrent state, encoder = image "
           "embeddings), all within --models-max-ram accounting.");
  for (const ModelStatus& s : models) {
    const std::pair<const char*, uint64_t> kinds[] = {
        {"kv", s.cache.bytes}, {"snapshots", s.snapshots.bytes}, {"encoder", s.encoder.bytes}};
    for (const auto& [kind, n] : kinds)
      w.sample("reprise_memory_bytes", model_label(s.id) + ",kind=\"" + kind + "\"", static_cast<double>(n));
  }
  if (shared_budget) {
    w.family("reprise_cache_shared_budget_bytes", "gauge", "The budget over all cache tiers of all models (--cache-total-ram).");
    w.sample("reprise_cache_shared_budget_bytes", "", static_cast<double>(shared_budget->limit_bytes()));
    w.family("reprise_cache_shared_bytes", "gauge", "Bytes held by all cache tiers of all loaded models.");
    w.sample("reprise_cache_shared_bytes", "", static_cast<double>(shared_budget->used_bytes()));
    w.family("reprise_cache_shared_evictions_total", "counter",
             "Entries of any tier evicted to keep all tiers within --cache-total-ram.");
    w.sample("reprise_cache_shared_evictions_total", "", static_cast<double>(shared_budget->evictions()));
  }
  w.family("reprise_cache_blocks", "gauge", "Cache blocks by state (all, in_use, cached = evictable, shared).");
  for (const ModelStatus& s : models) {
    const std::pair<const char*, uint64_t> states[] = {{"all", s.cache.blocks},
                                                       {"in_use", s.cache.blocks_in_use},
                                                       {"cached", s.cache.blocks_cached},
                                                       {"shared", s.cache.blocks_shared}};
    for (const auto& [state, n] : states)
      w.sample("reprise_cache_blocks", model_label(s.id) + ",state=\"" + state + "\"", static_cast<double>(n));
  }
  return w.take();
}

}  // namespace reprise
