// Runs generation requests for one model: prefix-cache lookup, chunked
// prefill of the uncached rest, sampling and decode, and cache insertion of
// prompt and generated tokens as they complete.
//
// Forward passes of concurrent requests are serialised (the thread pool
// serves one pass at a time); the decode steps and prompt chunks of
// concurrent requests share passes (PassBatcher), with the same results as
// running alone.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cache/cache_key.h"
#include "cache/prefix_cache.h"
#include "cache/snapshot_store.h"
#include "engine/inflight_prefixes.h"
#include "engine/pass_batcher.h"
#include "engine/sampler.h"
#include "engine/token_constraint.h"
#include "model/model.h"
#include "tensor/thread_pool.h"

namespace reprise {

struct EngineOptions {
  int64_t n_ctx = 0;        // 0: the model's training context
  int64_t n_batch = 512;    // prefill chunk size
  // Continuous batching: the most concurrent sequences whose work (decode
  // steps, prompt chunks) shares one forward pass (1: every sequence runs on
  // its own).
  int max_decode_batch = 16;
  // Prefill chunk size while other sequences are decoding: they advance one
  // token per pass, so this bounds their inter-token latency during a long
  // prompt.
  int64_t n_batch_while_decoding = 128;
  // Lock held around forward passes; null: the engine's own. Share one lock
  // between everything that runs on the same thread pool.
  std::mutex* forward_mutex = nullptr;
  // Another engine's pass batcher to share (an engine on the same model and
  // thread pool, with the same forward lock, e.g. the one serving requests
  // with images), so both engines' requests share passes; null: its own.
  PassBatcher* batcher = nullptr;
  // Likewise another engine's list of prompts being prefilled (same cache),
  // so concurrent requests of both compute a shared prefix once; null: its own.
  InflightPrefixes* inflight = nullptr;
};

// Prompt positions [begin, end) fed as input embeddings instead of token
// embeddings (image soft tokens). The span is always computed as one batch,
// optionally attending bidirectionally within itself; a cached prefix that
// ends inside a span is cut back to its start.
struct EmbeddedSpan {
  int64_t begin = 0;
  int64_t end = 0;
  const float* values = nullptr;  // (end - begin) x n_embd floats
  bool bidirectional = true;
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  std::vector<Hash128> prompt_keys;  // optional per-position extra cache keys
  SamplingParams sampling;
  int64_t max_tokens = 128;
  std::vector<int32_t> stop_tokens;  // end-of-generation ids
  std::string cache_salt;
  // LoRA adapters the request runs with, applied in this order (none: the
  // base weights). Each must pass the model's check_adapter. Part of the
  // cache namespace with their scales: state computed under other adapters
  // or scales is never reused. The draft model runs without them.
  std::vector<LoraUse> loras;
  bool use_cache = true;
  // Speculative decoding: tokens the draft proposes per step; -1 uses the
  // engine's default, 0 disables it for this request (and requests with
  // embedded spans never use it).
  int draft_max = -1;
  std::vector<EmbeddedSpan> embedded;  // in position order, non-overlapping
  // Structured output: only tokens it allows are sampled, and stop tokens
  // only where it may end (a request with one never decodes speculatively).
  // Null: unconstrained. Used by one request at a time.
  std::shared_ptr<TokenConstraint> constraint;
  // Prompt log-probabilities (echo): called, when set, for each prompt
  // position p < n - 1 in order, with the logits after it (those that
  // predict prompt token p + 1). Such a request reuses no cached prefix (a
  // cached position's logits are not kept, and recomputing them is the
  // whole prefill), waits for no concurrent prefill and never decodes
  // speculatively; its positions still enter the cache for later requests.
  std::function<void(int64_t position, std::span<const float> logits)> on_prompt_logits;
  // Embeddings instead of a reply: when set, the prompt is prefilled,
  // nothing is sampled, and on_hidden receives final-norm hidden states
  // (n_embd floats per row): the last prompt position's, or with hidden_all
  // every position's, a prefill chunk's rows at a time, in order (which,
  // like on_prompt_logits, reuses no cached prefix: a cached position's
  // hidden state is not kept). The prompt's positions enter the cache as a
  // reply's would. The whole context may be prompt (nothing is generated).
  std::function<void(std::span<const float> rows)> on_hidden;
  bool hidden_all = false;
  const std::atomic<bool>* cancelled = nullptr;
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  std::string finish_reason;  // "stop", "length" or "cancelled"
  ReuseReport reuse;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t drafted_tokens = 0;   // proposed by the draft model
  int64_t accepted_tokens = 0;  // of those, accepted by the target
};

// Cumulative counters across requests (for /metrics).
struct EngineCounters {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> cached_tokens{0};
  std::atomic<uint64_t> generated_tokens{0};
  std::atomic<uint64_t> drafted_tokens{0};
  std::atomic<uint64_t> accepted_tokens{0};
  std::atomic<uint64_t> embedded_batches{0};  // prefill batches of embedded spans
  std::atomic<uint64_t> prefix_waits{0};  // requests that waited for a concurrent request's shared prefix
};

// Called with each sampled token and the logits it was sampled from; return
// false to stop generating (the token is kept).
using TokenCallback = std::function<bool(int32_t token, std::span<const float> logits)>;

class Engine {
 public:
  // `cache` may be null (no prefix caching). `snapshots` holds recurrent
  // state for models that have it; without it such models never reuse a
  // prefix (their state cannot be rebuilt from KV blocks). Everything passed
  // in must outlive the engine.
  Engine(Model& model, ThreadPool& pool, PrefixCache* cache, const EngineOptions& options = {},
         SnapshotStore* snapshots = nullptr);

  // Throws reprise::Error for invalid requests (empty prompt, prompt longer
  // than the context, bad sampling parameters, out-of-range token ids).
  GenerateResult generate(const GenerateRequest& request, const TokenCallback& on_token = {});

  // Enables speculative decoding with `draft` (same vocabulary; checked by
  // the caller, see check_draft_compatible) proposing up to draft_max tokens
  // per step. The draft keeps its own prefix cache (its own namespace).
  // Throws reprise::Error for models with recurrent layers (their state
  // cannot be rolled back after rejected tokens yet).
  void set_draft(Model& draft, PrefixCache* draft_cache, int draft_max);
  bool has_draft() const { return draft_ != nullptr; }
  // Sizes the models' per-pass scratch for the largest pass this engine
  // runs (a prefill chunk beside a full decode batch) now
  // (Model::prepare_scratch), for a server whose model is loaded before its
  // first request.
  void prepare_scratch();
  // A request for this engine has arrived and its first pass will follow:
  // wakes the thread pool's sleeping workers now, so that their wake-up
  // (~0.5-2 ms after an idle spell on this VM) overlaps the request's
  // parsing and tokenizing rather than its first pass.
  void expect_request();

  const EngineCounters& counters() const { return counters_; }
  PassBatchStats pass_stats() const { return batcher_->stats(); }
  // The draft model's passes (zeros without a draft).
  PassBatchStats draft_pass_stats() const { return draft_batcher_ ? draft_batcher_->stats() : PassBatchStats{}; }
  PassBatcher& pass_batcher() { return *batcher_; }
  InflightPrefixes& inflight_prefixes() { return *inflight_; }
  // The lock held around every forward pass on this engine's thread pool.
  // Other users of the same pool (the vision pipeline) must hold it too.
  std::mutex& forward_mutex() { return *forward_mutex_; }
  Model& model() { return model_; }
  PrefixCache* cache() { return cache_; }
  SnapshotStore* snapshots() { return snapshots_; }
  int64_t n_ctx() const { return n_ctx_; }
  NamespaceKey namespace_for(const std::string& cache_salt, const std::vector<LoraUse>& loras = {}) const;

 private:
  Model& model_;
  ThreadPool& pool_;
  PrefixCache* cache_;
  SnapshotStore* snapshots_;
  EngineOptions options_;
  int64_t n_ctx_;
  std::mutex own_forward_mutex_;
  std::mutex* forward_mutex_;
  Model* draft_ = nullptr;
  PrefixCache* draft_cache_ = nullptr;
  int draft_max_ = 0;
  EngineCounters counters_;
  std::unique_ptr<PassBatcher> own_batcher_;
  PassBatcher* batcher_;
  std::unique_ptr<PassBatcher> draft_batcher_;  // with a draft model
  std::atomic<int> about_to_verify_{0};  // speculative requests at their round's last draft batch
  std::unique_ptr<InflightPrefixes> own_inflight_;
  InflightPrefixes* inflight_;

  // Prompt tokens per prefill batch on `batcher`'s model: smaller while
  // other sequences decode there (each pass advances them one token).
  int64_t prefill_chunk(const PassBatcher& batcher) const;
  void decode_plain(const GenerateRequest& req, class ActiveSequence& target, std::vector<float>& logits,
                    GenerateResult& result, const TokenCallback& on_token);
  void decode_speculative(const GenerateRequest& req, class ActiveSequence& target, class ActiveSequence& draft,
                          std::vector<float>& logits, GenerateResult& result, const TokenCallback& on_token,
                          int draft_max);
};

}  // namespace reprise
