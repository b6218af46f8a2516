#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>

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
  const int draft_max = !req.embedded.empty() ? 0 : req.draft_max < 0 ? draft_max_ : std::min(req.draft_max, 64);
  const bool speculative = draft_ && draft_max > 0 && req.max_tokens > 1;

  GenerateResult result;
  result.prompt_tokens = n_prompt;
  const auto t0 = std::chrono::steady_clock::now();
  const bool use_cache = cache_ && req.use_cache;
  // A concurrent request computing the same leading prompt positions: wait
  // for its cache blocks instead of computing them a second time.
  std::unique_ptr<InflightPrefixes::Prefill> inflight;
  if (use_cache && cache_->enabled()) {
    bool waited = false;
    inflight = inflight_->begin(namespace_for(req.cache_salt).hash(), req.prompt, req.prompt_keys, &waited,
                                req.cancelled);
    if (waited) counters_.prefix_waits++;
    if (!inflight) {
      result.finish_reason = "cancelled";
      return result;
    }
  }
  ActiveSequence target(model_, pool_, *forward_mutex_, use_cache ? cache_ : nullptr, snapshots_,
                        namespace_for(req.cache_salt), batcher_);
  result.reuse = target.attach(req.prompt, req.prompt_keys);
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
  const std::vector<int64_t> checkpoints = target.checkpoints(target.position(), n_prompt);
  while (target.position() < n_prompt) {
    if (req.cancelled && req.cancelled->load()) {
      result.finish_reason = "cancelled";
      return result;
    }
    const int64_t pos = target.position();
    // Smaller chunks while others decode: each pass advances them one token.
    const bool others_decoding = batcher_->decoding() > 0 || speculating_.load(std::memory_order_relaxed) > 0;
    const int64_t chunk = others_decoding ? options_.n_batch_while_decoding : options_.n_batch;
    int64_t n = std::min(chunk, n_prompt - pos);
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
    target.feed(std::span<const int32_t>(req.prompt).subspan(pos, n), keys_of(pos, n),
                pos + n == n_prompt ? LogitsFor::Last : LogitsFor::None, logits,
                span ? span->values : nullptr, span && span->bidirectional);
    const int64_t end = target.position();
    if (end == n_prompt || std::binary_search(checkpoints.begin(), checkpoints.end(), end))
      target.snapshot(std::span<const int32_t>(req.prompt).subspan(0, end), keys_of(0, end));
    if (inflight) inflight->committed(end);
  }
  inflight.reset();  // the prompt is in the cache: requests sharing it may go on
  if (draft) {
    std::vector<float> unused;
    for (int64_t pos = draft->position(); pos < n_prompt; pos = draft->position()) {
      const bool others_drafting =
          draft_batcher_->decoding() > 0 || speculating_.load(std::memory_order_relaxed) > 0;
      const int64_t chunk = others_drafting ? options_.n_batch_while_decoding : options_.n_batch;
      const int64_t n = std::min(chunk, n_prompt - pos);
      draft->feed(std::span<const int32_t>(req.prompt).subspan(pos, n), keys_of(pos, n), LogitsFor::None, unused);
    }
  }
  result.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  if (draft) decode_speculative(req, target, *draft, logits, result, on_token, draft_max);
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

void Engine::decode_plain(const GenerateRequest& req, ActiveSequence& target, std::vector<float>& logits,
                          GenerateResult& result, const TokenCallback& on_token) {
  Sampler sampler(req.sampling);
  std::vector<int32_t> history(req.prompt);
  const int64_t n_prompt = static_cast<int64_t>(req.prompt.size());
  result.finish_reason = "length";
  // A member of the batcher while more decode steps will follow: a pass
  // waits for members' steps, so a sequence leaves as soon as it knows its
  // last token is next (or at any other stop).
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    const bool last = i + 1 == req.max_tokens || target.position() + 1 >= n_ctx_;
    target.set_decoding(!last);
    const int32_t token = sampler.sample(logits, history);
    result.tokens.push_back(token);
    history.push_back(token);
    const bool keep_going = on_token ? on_token(token, logits) : true;
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), token) != req.stop_tokens.end() || !keep_going) {
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

// Draft proposes up to k tokens; the target scores [x, d1..dk] in one batch;
// the longest agreeing prefix is kept and both models roll back the rest.
// Greedy: accept d_i while it is the target's argmax. Sampling: accept d_i
// with probability min(1, p(d_i)/q(d_i)), else draw from max(0, p - q)
// renormalised, so the output follows the target's distribution exactly.
void Engine::decode_speculative(const GenerateRequest& req, ActiveSequence& target, ActiveSequence& draft,
                                std::vector<float>& logits, GenerateResult& result, const TokenCallback& on_token,
                                int draft_max) {
  Sampler target_sampler(req.sampling);
  SamplingParams draft_params = req.sampling;
  draft_params.seed ^= 0x9E3779B97F4A7C15ull;
  Sampler draft_sampler(draft_params);
  std::mt19937_64 accept_rng(req.sampling.seed * 0x2545F4914F6CDD1Dull + 1);
  const bool greedy = req.sampling.temperature <= 0;
  std::vector<int32_t> history(req.prompt);
  result.finish_reason = "length";
  std::vector<float> draft_logits, verify_logits;
  const int64_t n_vocab = model_.info().n_vocab;

  // Emits one token; returns false when generation must stop.
  auto emit = [&](int32_t token, std::span<const float> token_logits) {
    result.tokens.push_back(token);
    history.push_back(token);
    const bool keep_going = on_token ? on_token(token, token_logits) : true;
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), token) != req.stop_tokens.end() || !keep_going) {
      result.finish_reason = "stop";
      return false;
    }
    if (req.cancelled && req.cancelled->load()) {
      result.finish_reason = "cancelled";
      return false;
    }
    return static_cast<int64_t>(result.tokens.size()) < req.max_tokens;
  };

  // From a round's last draft batch through its verification: a member of
  // the target's batcher. Until the verification is submitted it is counted
  // in about_to_verify_, to which other greedy requests align their rounds.
  struct VerifyTurn {
    ActiveSequence& target;
    std::atomic<int>& about_to_verify;
    bool member = false, counted = false;
    void join() {
      if (member) return;
      member = counted = true;
      about_to_verify.fetch_add(1, std::memory_order_relaxed);
      target.set_decoding(true);
    }
    void submitting() {
      if (counted) about_to_verify.fetch_sub(1, std::memory_order_relaxed);
      counted = false;
    }
    void leave() {
      submitting();
      if (member) target.set_decoding(false);
      member = false;
    }
    ~VerifyTurn() { leave(); }
  } verify_turn{target, about_to_verify_};
  // Counted while speculating: new prompts then prefill in the smaller
  // chunks, as they do while others decode.
  struct Speculating {
    std::atomic<int>& n;
    explicit Speculating(std::atomic<int>& count) : n(count) { n.fetch_add(1, std::memory_order_relaxed); }
    ~Speculating() { n.fetch_sub(1, std::memory_order_relaxed); }
  } speculating{speculating_};
  // Each model's batch makes the other's membership away while it runs.
  target.set_partner(&draft);
  draft.set_partner(&target);
  bool cut_last_round = false;

  // `logits` holds the target's prediction for the token after history.
  int32_t x = target_sampler.sample(logits, history);
  if (!emit(x, logits)) return;
  for (;;) {
    // Room left: tokens still wanted and positions left in the context.
    const int64_t room_ctx = n_ctx_ - 1 - target.position() - 1;
    const int64_t room_out = req.max_tokens - static_cast<int64_t>(result.tokens.size());
    int k = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>({draft_max, room_ctx, room_out})));
    if (room_ctx < 0) break;
    // Draft catches up to the sequence (x and any accepted tokens it has not
    // seen), then proposes k tokens.
    std::vector<int32_t> proposals;
    std::vector<std::vector<float>> draft_probs;
    // Batcher memberships follow the round's phases (see set_decoding): the
    // draft's while its batches follow at once (from the verify, whose end
    // starts the next round's catch-up, through the last draft step), the
    // target's from the last draft step through the verify. Each phase's
    // last batch still runs as a member, so a pass does not miss it.
    // Concurrent requests in step thus share their draft and verify passes.
    // A greedy request out of step with others ends its drafting early when
    // they are at their last draft step, so its verification joins theirs
    // (its output does not depend on how many tokens it drafts; a sampling
    // request's would, so it never does).
    // Never two rounds in a row: with many requests someone is nearly always
    // about to verify, and every round would shrink to two tokens.
    bool cut = false;
    auto others_verify_next = [&] {
      return greedy && !cut_last_round && about_to_verify_.load(std::memory_order_relaxed) > 0;
    };
    if (k <= 1) verify_turn.join();
    if (k > 0) {
      draft.set_decoding(true);
      const int64_t seq_len = static_cast<int64_t>(history.size());
      draft.feed(std::span<const int32_t>(history).subspan(draft.position(), seq_len - draft.position()), {},
                 LogitsFor::Last, draft_logits);
      std::vector<int32_t> draft_history(history);
      for (int i = 0; i < k; ++i) {
        int32_t d;
        if (greedy) {
          d = argmax(draft_logits);
        } else {
          draft_probs.push_back(draft_sampler.distribution(draft_logits, draft_history));
          d = draft_sampler.draw(draft_probs.back());
        }
        proposals.push_back(d);
        draft_history.push_back(d);
        if (i + 1 < k) {
          if (i + 2 < k && others_verify_next()) {
            k = i + 2;
            cut = true;
          }
          if (i + 2 == k) verify_turn.join();
          draft.feed(std::span<const int32_t>(&proposals.back(), 1), {}, LogitsFor::Last, draft_logits);
        }
      }
    }
    k = static_cast<int>(proposals.size());
    cut_last_round = cut;
    draft.set_decoding(false);
    verify_turn.join();
    // Target verifies [x, d1..dk] in one pass.
    std::vector<int32_t> batch{x};
    batch.insert(batch.end(), proposals.begin(), proposals.end());
    const int64_t base = target.position();
    draft.set_decoding(true);
    verify_turn.submitting();
    target.feed(batch, {}, LogitsFor::All, verify_logits);
    verify_turn.leave();
    result.drafted_tokens += k;
    int accepted = 0;
    int32_t next = -1;
    std::vector<int32_t> verify_history(history);
    for (int i = 0; i <= k; ++i) {
      std::span<const float> row(verify_logits.data() + static_cast<size_t>(i) * n_vocab, n_vocab);
      if (i == k) {  // every proposal accepted: a bonus token from the target
        next = target_sampler.sample(row, verify_history);
        break;
      }
      const int32_t d = proposals[i];
      if (greedy) {
        const int32_t want = target_sampler.sample(row, verify_history);
        if (want != d) {
          next = want;
          break;
        }
      } else {
        std::vector<float> p = target_sampler.distribution(row, verify_history);
        const float q = draft_probs[i][d];
        const double u = static_cast<double>(accept_rng() >> 11) * (1.0 / 9007199254740992.0);
        if (q <= 0 || u >= std::min(1.0, static_cast<double>(p[d]) / q)) {
          for (int64_t v = 0; v < n_vocab; ++v) p[v] = std::max(0.0f, p[v] - draft_probs[i][v]);
          next = target_sampler.draw(p);
          break;
        }
      }
      ++accepted;
      verify_history.push_back(d);
    }
    result.accepted_tokens += accepted;
    // Keep x and the accepted proposals in both models; roll back the rest.
    target.truncate(base + 1 + accepted);
    draft.truncate(std::min<int64_t>(draft.position(), base + 1 + accepted));
    bool go_on = true;
    for (int i = 0; i < accepted && go_on; ++i)
      go_on = emit(proposals[i], std::span<const float>(verify_logits.data() + static_cast<size_t>(i) * n_vocab, n_vocab));
    if (!go_on) break;
    x = next;
    if (!emit(x, std::span<const float>(verify_logits.data() + static_cast<size_t>(accepted) * n_vocab, n_vocab)))
      break;
  }
  verify_turn.leave();
  draft.set_decoding(false);
  target.set_partner(nullptr);
  draft.set_partner(nullptr);
}

}  // namespace reprise
