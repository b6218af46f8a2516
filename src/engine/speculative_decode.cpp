// Engine::decode_speculative: the draft/verify loop of speculative decoding,
// and how concurrent speculative requests keep their rounds in step so they
// share the draft's and the target's passes.
#include <algorithm>
#include <atomic>
#include <random>

#include "engine/active_sequence.h"
#include "engine/engine.h"

namespace reprise {

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
  // The target's logits for position i of the last verify batch.
  auto verify_row = [&](int i) {
    return std::span<const float>(verify_logits.data() + static_cast<size_t>(i) * n_vocab, n_vocab);
  };

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
  // Decoding on both models for the whole loop (it is a member of each
  // batcher only in its phases): new prompts prefill in the smaller chunks.
  PassBatcher::Decoder target_decoder(*batcher_), draft_decoder(*draft_batcher_);
  // Each model's batch makes the other's membership away while it runs.
  target.set_partner(&draft);
  draft.set_partner(&target);
  bool cut_last_round = false;

  // Per-round buffers, kept across rounds: a sampling request's
  // distributions are vocabulary-sized, two per drafted token.
  std::vector<int32_t> proposals, draft_history, verify_history;
  std::vector<std::vector<float>> draft_probs;
  std::vector<float> target_probs;

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
    proposals.clear();
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
      draft.hold_index_from(seq_len);  // its proposals, until verified
      draft_history.assign(history.begin(), history.end());
      for (int i = 0; i < k; ++i) {
        int32_t d;
        if (greedy) {
          d = argmax(draft_logits);
        } else {
          if (draft_probs.size() <= static_cast<size_t>(i)) draft_probs.resize(i + 1);
          draft_sampler.distribution(draft_logits, draft_history, draft_probs[i]);
          d = draft_sampler.draw(draft_probs[i]);
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
    target.hold_index_from(base + 1);  // x is settled; the proposals are not yet
    draft.set_decoding(true);
    verify_turn.submitting();
    target.feed(batch, {}, LogitsFor::All, verify_logits);
    verify_turn.leave();
    result.drafted_tokens += k;
    int accepted = 0;
    int32_t next = -1;
    verify_history.assign(history.begin(), history.end());
    for (int i = 0; i <= k; ++i) {
      const std::span<const float> row = verify_row(i);
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
        std::vector<float>& p = target_probs;
        target_sampler.distribution(row, verify_history, p);
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
    target.settle();
    draft.settle();
    bool go_on = true;
    for (int i = 0; i < accepted && go_on; ++i)
      go_on = emit(proposals[i], verify_row(i));
    if (!go_on) break;
    x = next;
    if (!emit(x, verify_row(accepted)))
      break;
  }
  verify_turn.leave();
  draft.set_decoding(false);
  target.set_partner(nullptr);
  draft.set_partner(nullptr);
}

}  // namespace reprise
