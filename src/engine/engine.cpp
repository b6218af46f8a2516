#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "engine/flat_memory.h"
#include "util/error.h"

namespace reprise {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Engine::Engine(Model& model, ThreadPool& pool, PrefixCache* cache, const EngineOptions& options,
               SnapshotStore* snapshots)
    : model_(model), pool_(pool), cache_(cache), snapshots_(snapshots), options_(options) {
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : model.info().n_ctx_train;
  if (options_.n_batch <= 0) options_.n_batch = 512;
}

NamespaceKey Engine::namespace_for(const std::string& cache_salt) const {
  NamespaceKey ns;
  ns.model_fingerprint = model_.info().fingerprint;
  ns.cache_salt = cache_salt;
  return ns;
}

GenerateResult Engine::generate(const GenerateRequest& req, const TokenCallback& on_token) {
  const int64_t n_prompt = static_cast<int64_t>(req.prompt.size());
  if (n_prompt == 0) throw Error("empty prompt");
  if (n_prompt >= n_ctx_)
    throw Error("prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                std::to_string(n_ctx_));
  if (auto err = req.sampling.validate(); !err.empty()) throw Error(err);
  for (int32_t t : req.prompt)
    if (t < 0 || t >= model_.info().n_vocab) throw Error("token id " + std::to_string(t) + " out of range");
  if (!req.prompt_keys.empty() && req.prompt_keys.size() != req.prompt.size())
    throw Error("prompt_keys must match the prompt length");

  GenerateResult result;
  result.prompt_tokens = n_prompt;
  const auto t0 = std::chrono::steady_clock::now();

  // Sequence state: cached (paged, shared) or flat.
  std::unique_ptr<CachedSequence> cached;
  std::unique_ptr<FlatMemory> flat;
  SequenceMemory* memory;
  int64_t pos = 0;
  if (cache_ && req.use_cache) {
    cached = cache_->open(namespace_for(req.cache_salt));
    result.reuse = cached->attach_prefix(req.prompt, req.prompt_keys);
    pos = result.reuse.reused_tokens;
    memory = cached.get();
    if (model_.state_spec().has_recurrent()) {
      // Recurrent state is restored whole from a snapshot at some position
      // P <= the KV prefix (never trimmed or partially restored); the KV
      // blocks are cut back to the same P so both describe one prefix.
      const int64_t restored =
          snapshots_ && pos > 0
              ? snapshots_->restore_longest(cached->namespace_hash(), req.prompt, req.prompt_keys, pos, *cached)
              : 0;
      if (restored < pos) {
        cached->truncate(restored);
        result.reuse.stop_reason = snapshots_ ? "no-snapshot-beyond" : "recurrent-state-not-cached";
        result.reuse.stop_position = restored;
        result.reuse.reused_tokens = restored;
        pos = restored;
      }
    }
  } else {
    flat = std::make_unique<FlatMemory>(model_.state_spec());
    result.reuse.prompt_tokens = n_prompt;
    result.reuse.stop_reason = "disabled";
    memory = flat.get();
  }
  result.cached_tokens = pos;

  auto keys_slice = [&](int64_t from, int64_t n) {
    return req.prompt_keys.empty() ? std::span<const Hash128>{}
                                   : std::span<const Hash128>(req.prompt_keys).subspan(from, n);
  };

  const bool snapshotting = cached && snapshots_ && model_.state_spec().has_recurrent();
  std::vector<int64_t> checkpoints = snapshotting ? snapshots_->checkpoints(pos, n_prompt) : std::vector<int64_t>{};
  auto take_snapshot = [&](std::span<const int32_t> prefix) {
    snapshots_->put(cached->namespace_hash(), prefix,
                    req.prompt_keys.empty() ? std::span<const Hash128>{}
                                            : std::span<const Hash128>(req.prompt_keys).subspan(
                                                  0, std::min(prefix.size(), req.prompt_keys.size())),
                    *cached);
  };

  std::vector<float> logits;
  size_t next_checkpoint = 0;
  while (pos < n_prompt) {
    if (req.cancelled && req.cancelled->load()) {
      result.finish_reason = "cancelled";
      return result;
    }
    int64_t n = std::min(options_.n_batch, n_prompt - pos);
    while (next_checkpoint < checkpoints.size() && checkpoints[next_checkpoint] <= pos) ++next_checkpoint;
    if (next_checkpoint < checkpoints.size()) n = std::min(n, checkpoints[next_checkpoint] - pos);
    ForwardBatch batch;
    batch.tokens = std::span<const int32_t>(req.prompt).subspan(pos, n);
    batch.pos0 = pos;
    batch.logits_for = pos + n == n_prompt ? LogitsFor::Last : LogitsFor::None;
    {
      std::lock_guard<std::mutex> lock(forward_mutex_);
      model_.forward(batch, *memory, logits, pool_);
    }
    if (cached) cached->commit(batch.tokens, keys_slice(pos, n));
    pos += n;
    if (snapshotting && (pos == n_prompt || std::binary_search(checkpoints.begin(), checkpoints.end(), pos)))
      take_snapshot(std::span<const int32_t>(req.prompt).subspan(0, pos));
  }
  result.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  Sampler sampler(req.sampling);
  std::vector<int32_t> history(req.prompt);
  result.finish_reason = "length";
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    const int32_t token = sampler.sample(logits, history);
    result.tokens.push_back(token);
    history.push_back(token);
    bool keep_going = on_token ? on_token(token, logits) : true;
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), token) != req.stop_tokens.end()) {
      result.finish_reason = "stop";
      break;
    }
    if (!keep_going) {
      result.finish_reason = "stop";
      break;
    }
    if (req.cancelled && req.cancelled->load()) {
      result.finish_reason = "cancelled";
      break;
    }
    if (i + 1 == req.max_tokens) break;
    if (pos + 1 >= n_ctx_) break;  // context full: finish with "length"
    // Feed the sampled token so its state is cached and the next logits exist.
    ForwardBatch batch;
    batch.tokens = std::span<const int32_t>(&history.back(), 1);
    batch.pos0 = pos;
    batch.logits_for = LogitsFor::Last;
    {
      std::lock_guard<std::mutex> lock(forward_mutex_);
      model_.forward(batch, *memory, logits, pool_);
    }
    if (cached) cached->commit(batch.tokens);
    ++pos;
  }
  // The end of the generated text is the next turn's likely restore point.
  if (snapshotting && pos > n_prompt) take_snapshot(std::span<const int32_t>(history).subspan(0, pos));
  result.decode_seconds = seconds_since(t1);
  return result;
}

}  // namespace reprise
