#include "server/model_registry.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <utility>

#include "gguf/gguf_file.h"
#include "model/model.h"
#include "util/error.h"

namespace reprise {

namespace {

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

void add_counters(CacheStats& into, const CacheStats& from) {
  into.lookups += from.lookups;
  into.hits += from.hits;
  into.misses += from.misses;
  into.tokens_looked_up += from.tokens_looked_up;
  into.tokens_reused += from.tokens_reused;
  into.evictions += from.evictions;
  into.copies_on_write += from.copies_on_write;
}

}  // namespace

ModelLease::ModelLease(ModelLease&& other) noexcept
    : registry_(std::exchange(other.registry_, nullptr)), entry_(other.entry_), model_(std::move(other.model_)) {}

ModelLease::~ModelLease() {
  if (registry_) registry_->release(entry_);
}

namespace {
uint64_t e_extra_bytes(const LoadedModel& m) {
  uint64_t extra = 0;
  if (m.snapshots) extra += m.snapshots->config().budget_bytes;
  for (const ServedAdapter& a : m.adapters()) extra += a.adapter->packed_bytes();
  if (m.vision) extra += m.vision->encoder_cache_stats().budget_bytes;
  if (m.draft) {
    std::error_code ec;
    extra += std::filesystem::file_size(m.draft->path, ec) + packing_growth_bytes(*m.draft->file) +
             m.draft_cache->stats().budget_bytes;
  }
  return extra;
}
}  // namespace

ModelRegistry::ModelRegistry(std::vector<ModelSource> sources, RegistryOptions options)
    : options_(std::move(options)) {
  if (sources.empty()) throw Error("no models to serve");
  if (options_.shared_cache_budget_bytes > 0)
    shared_budget_ = std::make_unique<MemoryBudget>(options_.shared_cache_budget_bytes);
  std::set<std::string> seen;
  for (ModelSource& s : sources) {
    if (s.id.empty()) throw Error("model id must not be empty (" + s.path + ")");
    if (!seen.insert(s.id).second) throw Error("model id '" + s.id + "' is given twice");
    Entry e;
    e.source = std::move(s);
    entries_.push_back(std::move(e));
  }
  for (AdapterSource a : options_.loras) {
    if (auto bad = check_new_adapter_locked(a)) throw Error(bad->message);
    adapters_.push_back(std::move(a));
  }
}

std::optional<ApiError> ModelRegistry::check_new_adapter_locked(AdapterSource& a) const {
  if (a.name.empty()) return ApiError::invalid("LoRA adapter name must not be empty (" + a.path + ")", "lora_name");
  for (unsigned char c : a.name)
    if (c <= ' ' || c == 0x7f)
      return ApiError::invalid("LoRA adapter name '" + a.name + "' holds a space or control character", "lora_name");
  bool taken = false;
  for (const Entry& e : entries_) taken = taken || e.source.id == a.name;
  for (const AdapterSource& other : adapters_) taken = taken || other.name == a.name;
  if (taken) return ApiError::invalid("LoRA adapter name '" + a.name + "' is already a model's or another adapter's", "lora_name");
  if (a.base.empty()) a.base = entries_.front().source.id;
  bool served = false;
  for (const Entry& e : entries_) served = served || e.source.id == a.base;
  if (!served)
    return ApiError{404, "LoRA adapter '" + a.name + "' is for model '" + a.base + "', which is not served",
                    "invalid_request_error", "model", "model_not_found"};
  return std::nullopt;
}

std::vector<AdapterSource> ModelRegistry::adapters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return adapters_;
}

std::string ModelRegistry::base_of(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const AdapterSource& a : adapters_)
    if (a.name == id) return a.base;
  return id;
}

std::optional<ApiError> ModelRegistry::add_adapter(AdapterSource adapter) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto bad = check_new_adapter_locked(adapter)) return bad;
  }
  // Loaded and checked against the model outside the lock (the lease keeps
  // the model loaded meanwhile).
  Parsed<ModelLease> lease = acquire(adapter.base);
  if (!lease.ok()) return lease.error();
  ServedAdapter served{adapter.name, adapter.path, nullptr};
  try {
    served.adapter = LoraAdapter::load(adapter.path);
    lease.value()->bundle->model->check_adapter(*served.adapter);
  } catch (const std::exception& e) {
    return ApiError::invalid(e.what(), "lora_path", "invalid_lora_adapter");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto bad = check_new_adapter_locked(adapter)) return bad;  // named meanwhile
  adapter.adapter = served.adapter;
  adapters_.push_back(adapter);
  for (Entry& e : entries_)
    if (e.source.id == adapter.base && e.loaded) {
      std::vector<ServedAdapter> now = e.loaded->adapters();
      std::erase_if(now, [&](const ServedAdapter& a) { return a.name == adapter.name; });
      now.push_back(served);
      e.loaded->set_adapters(std::move(now));
      e.footprint += served.adapter->packed_bytes();
    }
  say("[" + adapter.base + "] LoRA adapter '" + adapter.name + "' added from " + adapter.path);
  return std::nullopt;
}

std::optional<ApiError> ModelRegistry::remove_adapter(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(adapters_.begin(), adapters_.end(), [&](const AdapterSource& a) { return a.name == name; });
  if (it == adapters_.end())
    return ApiError{404, "no LoRA adapter '" + name + "'", "invalid_request_error", "lora_name", "lora_not_found"};
  const std::string base = it->base;
  adapters_.erase(it);
  for (Entry& e : entries_)
    if (e.source.id == base && e.loaded) {
      std::vector<ServedAdapter> now = e.loaded->adapters();
      for (auto a = now.begin(); a != now.end(); ++a)
        if (a->name == name) {
          e.footprint -= std::min(e.footprint, a->adapter->packed_bytes());
          now.erase(a);
          break;
        }
      e.loaded->set_adapters(std::move(now));
    }
  say("[" + base + "] LoRA adapter '" + name + "' removed");
  return std::nullopt;
}

ModelRegistry::~ModelRegistry() = default;

std::vector<std::string> ModelRegistry::ids() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.source.id);
  return out;
}

void ModelRegistry::say(const std::string& message) const {
  if (options_.log) options_.log(message);
}

Parsed<ModelLease> ModelRegistry::acquire(const std::string& id) {
  std::unique_lock<std::mutex> lock(mutex_);
  size_t index = entries_.size();
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].source.id == id) index = i;
  if (index == entries_.size())
    return ApiError{404, "The model '" + id + "' does not exist", "invalid_request_error", "model",
                    "model_not_found"};
  Entry& e = entries_[index];
  load_done_.wait(lock, [&] { return !e.loading; });
  if (e.loaded) {
    ++e.in_flight;
    e.last_used = ++clock_;
    return ModelLease(this, index, e.loaded);
  }

  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(e.source.path, ec);
  if (ec) return ApiError::server("cannot load model '" + id + "': " + e.source.path + ": " + ec.message(),
                                  "model_load_failed");
  // The weights take the file's bytes, more where packing widens a type; a
  // file that does not open counts as its size and fails to load below. The
  // opened file is the one loaded.
  uint64_t growth = 0;
  std::unique_ptr<gguf::File> opened;
  try {
    opened = gguf::File::open(e.source.path);
    growth = packing_growth_bytes(*opened);
  } catch (const std::exception&) {
    opened.reset();
  }
  const uint64_t footprint = file_bytes + growth + options_.cache_budget_bytes;
  std::vector<std::shared_ptr<LoadedModel>> doomed;
  if (!make_room_locked(index, footprint, doomed))
    return ApiError{503,
                    "cannot load model '" + id + "' now: --models-max-ram is reached and the loaded models are busy; "
                    "retry later",
                    "server_error", "model", "model_capacity"};
  e.loading = true;
  e.footprint = footprint;
  std::vector<AdapterSource> adapters;  // the model's, as they are now
  for (const AdapterSource& a : adapters_)
    if (a.base == id) adapters.push_back(a);
  lock.unlock();
  doomed.clear();  // unloaded models are destroyed here, outside the lock

  std::unique_ptr<LoadedModel> model;
  std::string error;
  say("loading model '" + id + "' from " + e.source.path);
  try {
    model = load(e.source, std::move(opened), adapters);
  } catch (const std::exception& ex) {
    error = ex.what();
  }

  lock.lock();
  e.loading = false;
  load_done_.notify_all();
  if (!model) {
    e.footprint = 0;
    say("failed to load model '" + id + "': " + error);
    return ApiError::server("failed to load model '" + id + "': " + error, "model_load_failed");
  }
  // Adapters removed while the model loaded leave it; those it read keep
  // what was read for its later loads.
  std::vector<ServedAdapter> served;
  for (const ServedAdapter& s : model->adapters())
    for (AdapterSource& a : adapters_)
      if (a.name == s.name && a.base == id) {
        if (!a.adapter) a.adapter = s.adapter;
        served.push_back(s);
      }
  model->set_adapters(std::move(served));
  // Once loaded, what the model may hold besides its file and KV budget
  // counts too: snapshot and encoder-cache budgets and a draft model's file.
  e.footprint = footprint + e_extra_bytes(*model);
  e.loaded = std::move(model);
  ++e.loads;
  ++e.in_flight;
  e.last_used = ++clock_;
  say("model '" + id + "' ready (" + mib(e.footprint) + " counted against --models-max-ram)");
  return ModelLease(this, index, e.loaded);
}

bool ModelRegistry::make_room_locked(size_t for_entry, uint64_t needed,
                                     std::vector<std::shared_ptr<LoadedModel>>& doomed) {
  if (options_.max_ram_bytes == 0) return true;
  uint64_t used = 0;
  for (size_t i = 0; i < entries_.size(); ++i)
    if (i != for_entry && (entries_[i].loaded || entries_[i].loading)) used += entries_[i].footprint;
  while (used + needed > options_.max_ram_bytes) {
    Entry* victim = nullptr;
    for (size_t i = 0; i < entries_.size(); ++i) {
      Entry& c = entries_[i];
      if (i == for_entry || !c.loaded || c.loading || c.in_flight > 0) continue;
      if (!victim || c.last_used < victim->last_used) victim = &c;
    }
    if (!victim) {
      if (used > 0) return false;
      say("warning: model '" + entries_[for_entry].source.id + "' needs " + mib(needed) +
          ", more than --models-max-ram on its own; loading it anyway");
      return true;
    }
    add_counters(victim->retired, victim->loaded->cache->stats());
    doomed.push_back(std::move(victim->loaded));
    victim->loaded.reset();
    ++victim->unloads;
    used -= victim->footprint;
    say("unloading model '" + victim->source.id + "' (least recently used) to stay within --models-max-ram");
    victim->footprint = 0;
  }
  return true;
}

void ModelRegistry::release(size_t entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = entries_[entry];
  --e.in_flight;
  e.last_used = ++clock_;
}

std::unique_ptr<LoadedModel> ModelRegistry::load(const ModelSource& source, std::unique_ptr<gguf::File> opened,
                                                 const std::vector<AdapterSource>& adapters) const {
  auto m = std::make_unique<LoadedModel>();
  m->id = source.id;
  const auto progress = [&](const std::string& step) { say("[" + source.id + "] " + step); };
  m->bundle = opened ? load_model_bundle(std::move(opened), source.path, progress)
                     : load_model_bundle(source.path, progress);
  m->pool = std::make_unique<ThreadPool>(std::max(1, options_.threads));
  PrefixCacheConfig cache_config;
  cache_config.budget_bytes = options_.cache_budget_bytes;
  m->cache = std::make_unique<PrefixCache>(m->bundle->model->state_spec(), cache_config);
  EngineOptions engine_options;
  engine_options.n_ctx = options_.n_ctx;
  engine_options.max_decode_batch = options_.max_decode_batch;
  engine_options.n_batch_while_decoding = options_.prefill_chunk_decoding;
  if (m->bundle->model->state_spec().has_recurrent()) {
    SnapshotConfig snapshot_config;
    snapshot_config.budget_bytes = options_.snapshot_budget_bytes;
    snapshot_config.max_entries = options_.snapshot_max_entries;
    snapshot_config.ttl_seconds = options_.snapshot_ttl_seconds;
    snapshot_config.chunk_tokens = m->cache->block_tokens();
    m->snapshots = std::make_unique<SnapshotStore>(m->bundle->model->state_spec(), snapshot_config);
  }
  m->engine = std::make_unique<Engine>(*m->bundle->model, *m->pool, m->cache.get(), engine_options,
                                       m->snapshots.get());
  const bool is_default = source.id == entries_.front().source.id;
  if (is_default && !options_.draft_model_path.empty()) {
    m->draft = load_model_bundle(options_.draft_model_path,
                                 [&](const std::string& step) { say("[" + source.id + " draft] " + step); });
    check_draft_compatible(*m->bundle, *m->draft);
    m->draft_cache = std::make_unique<PrefixCache>(m->draft->model->state_spec(), cache_config);
    m->engine->set_draft(*m->draft->model, m->draft_cache.get(), options_.draft_max);
  }
  std::vector<ServedAdapter> served;
  for (const AdapterSource& a : adapters) {
    served.push_back({a.name, a.path, a.adapter ? a.adapter : LoraAdapter::load(a.path)});
    m->bundle->model->check_adapter(*served.back().adapter);
    say("[" + source.id + "] LoRA adapter '" + a.name + "' loaded from " + a.path + " (" +
        std::to_string(served.back().adapter->pairs().size()) + " matrices)");
  }
  m->set_adapters(std::move(served));
  if (is_default && !options_.mmproj_path.empty()) {
    VisionOptions vision_options;
    vision_options.encoder_cache_bytes = options_.mm_cache_bytes;
    vision_options.engine = engine_options;
    // Image and text requests share passes, and compute a shared prefix once.
    vision_options.engine.batcher = &m->engine->pass_batcher();
    vision_options.engine.inflight = &m->engine->inflight_prefixes();
    m->vision = std::make_unique<VisionPipeline>(options_.mmproj_path, *m->bundle, *m->pool, m->cache.get(),
                                                 &m->engine->forward_mutex(), vision_options);
    say("[" + source.id + "] vision projector " + options_.mmproj_path + " loaded");
  }
  if (MemoryBudget* shared = shared_budget_.get()) {
    m->cache->share_budget(shared);
    if (m->snapshots) m->snapshots->share_budget(shared);
    if (m->draft_cache) m->draft_cache->share_budget(shared);
    if (m->vision) m->vision->share_encoder_cache_budget(shared);
  }
  m->chat = load_model_chat_template(*m->bundle, options_.chat_template_override);
  if (!m->chat.chat_template)
    say("[" + source.id + "] warning: chat template (" + m->chat.origin + ") does not parse: " + m->chat.error +
        "; chat requests will fail, completions work");
  else
    say("[" + source.id + "] chat template: " + m->chat.origin);
  const auto& fp = m->bundle->model->info().fingerprint;
  char hex[40];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fp[0] ^ fp[1]));
  m->fingerprint_hex = hex;
  return m;
}

std::vector<ModelStatus> ModelRegistry::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ModelStatus> out;
  for (const Entry& e : entries_) {
    ModelStatus s;
    s.id = e.source.id;
    s.path = e.source.path;
    s.loaded = e.loaded != nullptr;
    s.loading = e.loading;
    s.in_flight = e.in_flight;
    s.footprint_bytes = e.footprint;
    s.loads = e.loads;
    s.unloads = e.unloads;
    if (e.loaded) {
      s.cache = e.loaded->cache->stats();
      if (e.loaded->snapshots) s.snapshots = e.loaded->snapshots->stats();
      if (e.loaded->vision) s.encoder = e.loaded->vision->encoder_cache_stats();
      s.drafted_tokens = e.loaded->engine->counters().drafted_tokens;
      s.accepted_tokens = e.loaded->engine->counters().accepted_tokens;
      s.prefix_waits = e.loaded->engine->counters().prefix_waits;
      s.passes = e.loaded->engine->pass_stats();
      s.draft_passes = e.loaded->engine->draft_pass_stats();
      s.n_ctx = e.loaded->engine->n_ctx();
      s.block_tokens = e.loaded->cache->block_tokens();
      s.fingerprint_hex = e.loaded->fingerprint_hex;
      s.chat_template_origin = e.loaded->chat.origin;
    }
    add_counters(s.cache, e.retired);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace reprise
