// The models a server offers, loaded on first use and unloaded
// least-recently-used when --models-max-ram would be exceeded.
//
// Each loaded model has its own thread pool, prefix cache and engine (the
// pool serves one forward pass at a time and the engine serialises its own
// passes, so separate models must not share a pool). Cache state is also
// namespaced by the model's fingerprint, so two models never share it even
// if they were to share a cache.
//
// A ModelLease pins a model while a request uses it: a leased model is never
// unloaded. A model's RAM is counted as its file size (weights are mapped)
// plus its prefix-cache budget.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/memory_budget.h"
#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "grammar/json_constraint.h"
#include "server/api_error.h"
#include "server/model_chat_template.h"
#include "tensor/thread_pool.h"
#include "vision/vision_pipeline.h"

namespace reprise {

struct ModelSource {
  std::string id;    // what requests put in "model"
  std::string path;  // GGUF file
};

// A LoRA adapter a model serves (`base`: the model's id; empty: the
// default model's).
struct AdapterSource {
  std::string name;  // what requests put in "model" or in their lora field
  std::string path;
  std::string base;
  // The adapter as first read (null until then): its model's later loads
  // reuse it rather than read a file that may have changed or gone since.
  std::shared_ptr<const LoraAdapter> adapter;
};

struct RegistryOptions {
  int threads = 1;                          // per model's thread pool
  int max_decode_batch = 16;                // continuous batching (EngineOptions::max_decode_batch)
  int64_t prefill_chunk_decoding = 128;     // EngineOptions::n_batch_while_decoding
  uint64_t cache_budget_bytes = 256ull << 20;  // per model's prefix cache
  uint64_t snapshot_budget_bytes = 256ull << 20;  // per SSM/hybrid model's snapshot store
  size_t snapshot_max_entries = 4096;
  double snapshot_ttl_seconds = 0;
  // For the default (first) model only: a speculative-decoding draft and a
  // vision projector.
  std::string draft_model_path;
  int draft_max = 8;
  std::string mmproj_path;
  // LoRA adapters, each loaded and checked against its model when that
  // model loads.
  std::vector<AdapterSource> loras;
  uint64_t mm_cache_bytes = 256ull << 20;
  int64_t n_ctx = 0;                        // 0: each model's training context
  uint64_t max_ram_bytes = 0;               // 0: no limit
  // One budget over every cache tier (KV blocks, snapshots, encoder outputs)
  // of every loaded model, evicting least-recently-used entries across them;
  // 0: only the per-tier budgets above apply.
  uint64_t shared_cache_budget_bytes = 0;
  std::optional<std::string> chat_template_override;
  std::function<void(const std::string&)> log;  // progress and load/unload events
};

// A LoRA adapter a model serves: requests name it as their model, or in
// their `lora` field by name or by its index in the model's list.
struct ServedAdapter {
  std::string name;
  std::string path;
  std::shared_ptr<const LoraAdapter> adapter;
};

// Everything one loaded model needs to serve requests.
struct LoadedModel {
  std::string id;
  std::unique_ptr<ModelBundle> bundle;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<SnapshotStore> snapshots;  // models with recurrent layers
  std::unique_ptr<ModelBundle> draft;        // speculative decoding (default model, optional)
  std::unique_ptr<PrefixCache> draft_cache;
  std::unique_ptr<Engine> engine;
  // Image inputs (default model, optional). Its engine shares `engine`'s
  // pass batcher, so it is declared (and destroyed) after it.
  std::unique_ptr<VisionPipeline> vision;
  ModelChatTemplate chat;
  std::string fingerprint_hex;  // short, for system_fingerprint
  // Structured output's view of the vocabulary (a trie of every token's
  // bytes): built by the first request that asks for it, then shared.
  std::mutex json_vocabulary_mutex;
  std::shared_ptr<JsonVocabulary> json_vocabulary;

  // Its LoRA adapters, in the order requests' lora fields index them
  // (adapters may be added and removed while the model serves).
  std::vector<ServedAdapter> adapters() const {
    std::lock_guard<std::mutex> lock(adapters_mutex);
    return adapters_;
  }
  void set_adapters(std::vector<ServedAdapter> adapters) {
    std::lock_guard<std::mutex> lock(adapters_mutex);
    adapters_ = std::move(adapters);
  }

 private:
  mutable std::mutex adapters_mutex;
  std::vector<ServedAdapter> adapters_;
};

class ModelRegistry;

// Keeps a model loaded while alive. Move-only.
class ModelLease {
 public:
  ModelLease(ModelLease&& other) noexcept;
  ModelLease& operator=(ModelLease&&) = delete;
  ModelLease(const ModelLease&) = delete;
  ~ModelLease();

  LoadedModel& operator*() const { return *model_; }
  LoadedModel* operator->() const { return model_.get(); }

 private:
  friend class ModelRegistry;
  ModelLease(ModelRegistry* registry, size_t entry, std::shared_ptr<LoadedModel> model)
      : registry_(registry), entry_(entry), model_(std::move(model)) {}
  ModelRegistry* registry_;
  size_t entry_;
  std::shared_ptr<LoadedModel> model_;
};

// Point-in-time view of one model for /v1/models, /metrics and /v1/cache/stats.
struct ModelStatus {
  std::string id;
  std::string path;
  bool loaded = false;
  bool loading = false;
  int in_flight = 0;
  uint64_t footprint_bytes = 0;
  uint64_t loads = 0, unloads = 0;
  int64_t n_ctx = 0;
  int block_tokens = 0;
  std::string fingerprint_hex;
  std::string chat_template_origin;
  // Counters include earlier loads of the model; gauges describe the
  // current load (zero when unloaded).
  CacheStats cache;
  SnapshotStats snapshots;        // current load only
  EncoderCacheStats encoder;      // current load only
  uint64_t drafted_tokens = 0, accepted_tokens = 0;  // current load only
  PassBatchStats passes;                              // current load only
  PassBatchStats draft_passes;                        // the draft model's, current load only
  uint64_t prefix_waits = 0;                          // current load only
};

class ModelRegistry {
 public:
  // Throws reprise::Error for an empty list, duplicate ids, or an adapter
  // named like a model or another adapter.
  ModelRegistry(std::vector<ModelSource> sources, RegistryOptions options);
  ~ModelRegistry();
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // The first configured model: what requests without "model" get.
  const std::string& default_id() const { return entries_.front().source.id; }
  std::vector<std::string> ids() const;
  // The LoRA adapters: RegistryOptions::loras, and those added since.
  std::vector<AdapterSource> adapters() const;
  // The model a requested id runs on: an adapter's base model for an
  // adapter's name, else the id itself.
  std::string base_of(const std::string& id) const;
  // Adds an adapter while serving: its model is loaded if it is not, the
  // adapter loaded and checked against it, and requests may name it from
  // then on. Errors: 400 for a bad name, a name in use, or a file that is
  // not an adapter of that model; 404 for a model that is not served.
  std::optional<ApiError> add_adapter(AdapterSource adapter);
  // Removes one: requests running with it finish with it; later ones
  // cannot name it (404 when no adapter has the name).
  std::optional<ApiError> remove_adapter(const std::string& name);

  // The model, loading it first if needed (concurrent callers share one
  // load). Errors: 404 unknown id, 503 when RAM cannot be freed because every
  // other model is busy, 500 when the file fails to load.
  Parsed<ModelLease> acquire(const std::string& id);

  std::vector<ModelStatus> status() const;

  // The shared cache budget (null when not configured).
  const MemoryBudget* shared_cache_budget() const { return shared_budget_.get(); }

 private:
  friend class ModelLease;
  struct Entry {
    ModelSource source;
    std::shared_ptr<LoadedModel> loaded;
    bool loading = false;
    int in_flight = 0;
    uint64_t last_used = 0;
    uint64_t footprint = 0;
    uint64_t loads = 0, unloads = 0;
    CacheStats retired;  // counters of earlier loads
  };

  void release(size_t entry);
  // Loads source; `opened` is its GGUF opened already (acquire opens it to
  // count its packed size), or null to open it here.
  // `adapters`: the model's LoRA adapters, loaded and checked with it.
  std::unique_ptr<LoadedModel> load(const ModelSource& source, std::unique_ptr<gguf::File> opened,
                                    const std::vector<AdapterSource>& adapters) const;
  // What is wrong with adding `a` (its base filled in: "" is the default
  // model), or nothing.
  std::optional<ApiError> check_new_adapter_locked(AdapterSource& a) const;
  // Unloads idle models (LRU first) until `needed` more bytes fit; the
  // unloaded models are moved to `doomed` so they are destroyed outside the
  // lock. False when busy models leave too little room.
  bool make_room_locked(size_t for_entry, uint64_t needed, std::vector<std::shared_ptr<LoadedModel>>& doomed);
  void say(const std::string& message) const;

  RegistryOptions options_;
  // Declared before entries_: outlives every model's stores, which leave it
  // when they are destroyed.
  std::unique_ptr<MemoryBudget> shared_budget_;
  mutable std::mutex mutex_;
  std::condition_variable load_done_;
  std::vector<Entry> entries_;
  std::vector<AdapterSource> adapters_;  // under mutex_
  uint64_t clock_ = 0;
};

}  // namespace reprise
