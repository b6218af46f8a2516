#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <limits>

#include "engine/active_sequence.h"
#include "util/error.h"

namespace reprise {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Engine::Engine(Model& model, ThreadPool& pool, PrefixCache* cache, const EngineOptions& options,
               SnapshotStore* snapshots)
    : model_(model), pool_(pool), cache_(cache), snapshots_(snapshots), options_(options),
      forward_mutex_(options.forward_mutex ? options.forward_mutex : &own_forward_mutex_) {
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : model.info().n_ctx_train;
  if (options_.n_batch <= 0) options_.n_batch = 512;
  if (options_.n_batch_while_decoding <= 0) options_.n_batch_while_decoding = options_.n_batch;
  if (options_.batcher) {
    batcher_ = options_.batcher;
  } else {
    own_batcher_ = std::make_unique<PassBatcher>(model_, pool_, *forward_mutex_, options_.max_decode_batch,
                                                 options_.n_batch_while_decoding);
    batcher_ = own_batcher_.get();
  }
  if (options_.inflight) {
    inflight_ = options_.inflight;
  } else {
    own_inflight_ = std::make_unique<InflightPrefixes>(cache_ ? cache_->block_tokens() : 1);
    inflight_ = own_inflight_.get();
  }
}

void Engine::set_draft(Model& draft, PrefixCache* draft_cache, int draft_max) {
  if (draft.info().n_vocab != model_.info().n_vocab)
    throw Error("draft model vocabulary (" + std::to_string(draft.info().n_vocab) +
                " tokens) differs from the target's (" + std::to_string(model_.info().n_vocab) + ")");
  if (model_.state_spec().has_recurrent() || draft.state_spec().has_recurrent())
    throw Error("speculative decoding with recurrent (SSM/hybrid) models is not supported yet: rejected "
                "tokens cannot be rolled back exactly without per-step snapshots");
  if (draft_max < 1 || draft_max > 64) throw Error("--draft-max must be between 1 and 64");
  draft_ = &draft;
  draft_cache_ = draft_cache;
  draft_max_ = draft_max;
  // Concurrent speculative requests share the draft's passes too.
  draft_batcher_ = std::make_unique<PassBatcher>(draft, pool_, *forward_mutex_, options_.max_decode_batch,
                                                 options_.n_batch_while_decoding);
}

void Engine::prepare_scratch() {
  std::lock_guard<std::mutex> lock(*forward_mutex_);  // the pool's caller state
  const int64_t rows = options_.n_batch + std::max<int64_t>(options_.max_decode_batch, 1);
  model_.prepare_scratch(rows, pool_);
  if (draft_) draft_->prepare_scratch(rows, pool_);
}

void Engine::expect_request() {
  // Long enough to cover building the prompt and reaching the first pass;
  // the pass's first job ends it (ThreadPool::keep_awake).
  constexpr double kRequestLeadMicros = 5000;
  pool_.keep_awake(kRequestLeadMicros);
}

int64_t Engine::prefill_chunk(const PassBatcher& batcher) const {
  return batcher.decoding() > 0 ? options_.n_batch_while_decoding : options_.n_batch;
}

NamespaceKey Engine::namespace_for(const std::string& cache_salt, const std::vector<LoraUse>& loras) const {
  NamespaceKey ns;
  ns.model_fingerprint = model_.info().fingerprint;
  ns.adapter_id = lora_identity(loras);
  ns.cache_salt = cache_salt;
  return ns;
}

GenerateResult Engine::generate(const GenerateRequest& req, const TokenCallback& on_token) {
  const int64_t n_prompt = static_cast<int64_t>(req.prompt.size());
  const bool hidden = static_cast<bool>(req.on_hidden);
  if (n_prompt == 0) throw Error("empty prompt");
  if (n_prompt > n_ctx_ || (n_prompt == n_ctx_ && !hidden))
    throw Error("prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                std::to_string(n_ctx_));
  if (auto err = req.sampling.validate(); !err.empty()) throw Error(err);
  for (int32_t t : req.prompt)
    if (t < 0 || t >= model_.info().n_vocab) throw Error("token id " + std::to_string(t) + " out of range");
  if (!req.prompt_keys.empty() && req.prompt_keys.size() != req.prompt.size())
    throw Error("prompt_keys must match the prompt length");
  if (req.max_tokens < 0) throw Error("max_tokens must be >= 0");
  for (size_t i = 0; i < req.embedded.size(); ++i) {
    const EmbeddedSpan& e = req.embedded[i];
    if (e.begin < 0 || e.end <= e.begin || e.end > n_prompt || !e.values ||
        (i > 0 && e.begin < req.embedded[i - 1].end))
      throw Error("embedded spans must be ordered, non-overlapping ranges inside the prompt");
  }
  if (!req.embedded.empty() && model_.state_spec().has_recurrent())
    throw Error("inputs with embeddings (images) need an attention-only model; '" + model_.info().arch +
                "' has recurrent layers");
  auto span_at = [&](int64_t pos) -> const EmbeddedSpan* {
    for (const auto& e : req.embedded)
      if (e.begin <= pos && pos < e.end) return &e;
    return nullptr;
  };
  const bool prompt_logits = static_cast<bool>(req.on_prompt_logits);
  const bool hidden_all = hidden && req.hidden_all;
  const bool every_position = prompt_logits || hidden_all;  // no cached prefix can serve
  if (hidden && prompt_logits) throw Error("hidden states and prompt logits cannot both be asked for");
  for (const LoraUse& use : req.loras) {
    if (!use.adapter) throw Error("a LoRA use without an adapter");
    if (!std::isfinite(use.scale)) throw Error("LoRA scales must be finite");
    model_.check_adapter(*use.adapter);
  }
  const int draft_max = !req.embedded.empty() || req.constraint || prompt_logits || hidden ? 0
                        : req.draft_max < 0                                      ? draft_max_
                                                                                 : std::min(req.draft_max, 64);
  const bool speculative = draft_ && draft_max > 0 && req.max_tokens > 1;

  GenerateResult result;
  result.prompt_tokens = n_prompt;
  const auto t0 = std::chrono::steady_clock::now();
  const bool use_cache = cache_ && req.use_cache;
  // A concurrent request computing the same leading prompt positions: wait
  // for its cache blocks instead of computing them a second time.
  std::unique_ptr<InflightPrefixes::Prefill> inflight;
  if (use_cache && cache_->enabled() && !every_position) {
    bool waited = false;
    inflight = inflight_->begin(namespace_for(req.cache_salt, req.loras).hash(), req.prompt, req.prompt_keys, &waited,
                                req.cancelled);
    if (waited) counters_.prefix_waits++;
    if (!inflight) {
      result.finish_reason = "cancelled";
      return result;
    }
  }
  ActiveSequence target(model_, pool_, *forward_mutex_, use_cache ? cache_ : nullptr, snapshots_,
                        namespace_for(req.cache_salt, req.loras), batcher_, req.loras);
  result.reuse = target.attach(req.prompt, req.prompt_keys, /*reuse=*/!every_position);
  if (const EmbeddedSpan* e = span_at(target.position()); e && e->begin < target.position()) {
    // The cached prefix ends inside an image: recompute the whole image.
    target.truncate(e->begin);
    result.reuse.reused_tokens = e->begin;
    result.reuse.stop_reason = "image-boundary";
    result.reuse.stop_position = e->begin;
  }

  std::unique_ptr<ActiveSequence> draft;
  if (speculative) {
    NamespaceKey dns;
    dns.model_fingerprint = draft_->info().fingerprint;
    dns.cache_salt = req.cache_salt;
    draft = std::make_unique<ActiveSequence>(*draft_, pool_, *forward_mutex_, use_cache ? draft_cache_ : nullptr,
                                             nullptr, dns, draft_batcher_.get());
    draft->attach(req.prompt, req.prompt_keys);
    // Both models continue from the same prefix length, so a partial restore
    // can never leave them out of step.
    const int64_t common = std::min(target.position(), draft->position());
    target.truncate(common);
    draft->truncate(common);
    if (common < result.reuse.reused_tokens) {
      result.reuse.reused_tokens = common;
      result.reuse.stop_reason = "draft-prefix";
      result.reuse.stop_position = common;
    }
  }
  result.cached_tokens = target.position();
  if (inflight) inflight->committed(target.position());  // what the cache already held

  auto keys_of = [&](int64_t from, int64_t n) {
    return req.prompt_keys.empty() ? std::span<const Hash128>{}
                                   : std::span<const Hash128>(req.prompt_keys).subspan(from, n);
  };

  // Prefill the uncached rest in chunks, stopping at snapshot checkpoints.
  std::vector<float> logits;
  std::vector<int64_t> checkpoints = target.checkpoints(target.position(), n_prompt);
  // A recurrent state cannot be rebuilt from KV blocks, and a request
  // reuses at most all of its prompt but the last token (whose logits it
  // needs): a snapshot one position before the prompt's end lets the same
  // prompt again (a regenerated reply, the other choices of n) restore all
  // of it but that token, instead of only up to the last checkpoint. It
  // costs one more (one-token) prefill batch, so it is taken only when a
  // later request could restore it and it saves at least a chunk's
  // recomputation.
  const int64_t last_restore_point = checkpoints.empty() ? target.position() : checkpoints.back();
  if (target.snapshots_restorable() && n_prompt - 1 - last_restore_point >= target.snapshot_chunk_tokens())
    checkpoints.push_back(n_prompt - 1);
  while (target.position() < n_prompt) {
    if (req.cancelled && req.cancelled->load()) {
      result.finish_reason = "cancelled";
      return result;
    }
    const int64_t pos = target.position();
    int64_t n = std::min(prefill_chunk(*batcher_), n_prompt - pos);
    auto next = std::upper_bound(checkpoints.begin(), checkpoints.end(), pos);
    if (next != checkpoints.end()) n = std::min(n, *next - pos);
    const EmbeddedSpan* span = span_at(pos);
    if (span) {
      n = span->end - pos;  // one span, whole, in its own batch
      counters_.embedded_batches++;
    } else {
      for (const auto& e : req.embedded)
        if (e.begin > pos) {
          n = std::min(n, e.begin - pos);
          break;
        }
    }
    const bool last_chunk = pos + n == n_prompt;
    target.feed(std::span<const int32_t>(req.prompt).subspan(pos, n), keys_of(pos, n),
                every_position ? LogitsFor::All : last_chunk ? LogitsFor::Last : LogitsFor::None, logits,
                span ? span->values : nullptr, span && span->bidirectional, hidden);
    if (hidden && (hidden_all || last_chunk)) req.on_hidden(logits);
    if (prompt_logits) {
      const size_t width = logits.size() / static_cast<size_t>(n);
      for (int64_t i = 0; i < n && pos + i + 1 < n_prompt; ++i)
        req.on_prompt_logits(pos + i, std::span<const float>(logits).subspan(static_cast<size_t>(i) * width, width));
      if (last_chunk) {  // decode goes on from the last position's logits
        std::copy(logits.end() - static_cast<std::ptrdiff_t>(width), logits.end(), logits.begin());
        logits.resize(width);
      }
    }
    const int64_t end = target.position();
    if (end == n_prompt || std::binary_search(checkpoints.begin(), checkpoints.end(), end))
      target.snapshot(std::span<const int32_t>(req.prompt).subspan(0, end), keys_of(0, end));
    if (inflight) inflight->committed(end);
  }
  inflight.reset();  // the prompt is in the cache: requests sharing it may go on
  if (draft) {
    std::vector<float> unused;
    for (int64_t pos = draft->position(); pos < n_prompt; pos = draft->position()) {
      const int64_t n = std::min(prefill_chunk(*draft_batcher_), n_prompt - pos);
      draft->feed(std::span<const int32_t>(req.prompt).subspan(pos, n), keys_of(pos, n), LogitsFor::None, unused);
    }
  }
  result.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  if (hidden) result.finish_reason = "stop";  // embeddings: nothing to generate
  else if (draft) decode_speculative(req, target, *draft, logits, result, on_token, draft_max);
  else decode_plain(req, target, logits, result, on_token);
  result.decode_seconds = seconds_since(t1);

  counters_.requests++;
  counters_.prompt_tokens += n_prompt;
  counters_.cached_tokens += result.cached_tokens;
  counters_.generated_tokens += result.tokens.size();
  counters_.drafted_tokens += result.drafted_tokens;
  counters_.accepted_tokens += result.accepted_tokens;
  return result;
}

namespace {

// The logits with every token the constraint does not allow next at -inf.
struct ConstrainedLogits {
  std::vector<float> logits;
  std::vector<uint8_t> allowed;

  // False when no token may follow (the output is complete and there are no
  // stop tokens to end it with); throws when the output is incomplete and
  // no token continues it (a vocabulary without the bytes it needs).
  bool mask(TokenConstraint& constraint, std::span<const float> raw, std::span<const int32_t> stop_tokens) {
    bool may_end = false;
    constraint.allowed_tokens(allowed, may_end);
    logits.assign(raw.begin(), raw.end());
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < logits.size(); ++i)
      if (i >= allowed.size() || !allowed[i]) logits[i] = kNever;
    for (int32_t t : stop_tokens)
      if (t >= 0 && static_cast<size_t>(t) < logits.size()) logits[t] = may_end ? raw[t] : kNever;
    if (std::any_of(logits.begin(), logits.end(), [](float v) { return v != kNever; })) return true;
    if (may_end) return false;
    throw Error("structured output: no token of the vocabulary continues the output");
  }
};

}  // namespace

void Engine::decode_plain(const GenerateRequest& req, ActiveSequence& target, std::vector<float>& logits,
                          GenerateResult& result, const TokenCallback& on_token) {
  Sampler sampler(req.sampling);
  std::vector<int32_t> history(req.prompt);
  const int64_t n_prompt = static_cast<int64_t>(req.prompt.size());
  result.finish_reason = "length";
  // A member of the batcher while more decode steps will follow: a pass
  // waits for members' steps, so a sequence leaves as soon as it knows its
  // last token is next (or at any other stop).
  PassBatcher::Decoder decoder(*batcher_);
  ConstrainedLogits constrained;
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    const bool last = i + 1 == req.max_tokens || target.position() + 1 >= n_ctx_;
    target.set_decoding(!last);
    std::span<const float> choose_from = logits;
    if (req.constraint) {
      if (!constrained.mask(*req.constraint, logits, req.stop_tokens)) {
        result.finish_reason = "stop";  // the output is complete and nothing may follow
        break;
      }
      choose_from = constrained.logits;
    }
    const int32_t token = sampler.sample(choose_from, history);
    const bool stop = std::find(req.stop_tokens.begin(), req.stop_tokens.end(), token) != req.stop_tokens.end();
    if (req.constraint && !stop && !req.constraint->accept(token))
      throw Error("structured output: sampled a token the constraint does not allow");
    result.tokens.push_back(token);
    history.push_back(token);
    const bool keep_going = on_token ? on_token(token, logits) : true;
    if (stop || !keep_going) {
      result.finish_reason = "stop";
      break;
    }
    if (req.cancelled && req.cancelled->load()) {
      result.finish_reason = "cancelled";
      break;
    }
    if (last) break;  // max_tokens, or the context is full: "length"
    // Feed the sampled token so its state is cached and the next logits exist.
    target.feed(std::span<const int32_t>(&history.back(), 1), {}, LogitsFor::Last, logits);
  }
  target.set_decoding(false);
  // The end of the generated text is the next turn's likely restore point.
  if (target.position() > n_prompt)
    target.snapshot(std::span<const int32_t>(history).subspan(0, target.position()), {});
}

}  // namespace reprise
