#include "server/generation.h"

#include <algorithm>
#include <utility>

#include "grammar/json_constraint.h"
#include "server/model_registry.h"
#include "server/stop_matcher.h"
#include "util/error.h"

namespace reprise {

void GenerationChannel::push(GenerationDelta delta) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    deltas_.push_back(std::move(delta));
  }
  ready_.notify_all();
}

void GenerationChannel::finish(GenerationOutcome outcome) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    outcome_ = std::move(outcome);
    finished_ = true;
  }
  ready_.notify_all();
  finished_cv_.notify_all();
}

double GenerationChannel::seconds_queued() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
}

bool GenerationChannel::take(std::vector<GenerationDelta>& out, std::chrono::milliseconds timeout,
                             std::chrono::milliseconds pace) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Pushes notify ready_ only, so they do not end the paced wait; the end
  // of the generation does (finished_cv_), so a reply's last events are not
  // held back by up to a pace.
  if (pace.count() > 0 && last_take_ != std::chrono::steady_clock::time_point{})
    finished_cv_.wait_until(lock, last_take_ + pace, [&] { return finished_; });
  ready_.wait_for(lock, timeout, [&] { return finished_ || !deltas_.empty(); });
  while (!deltas_.empty()) {
    out.push_back(std::move(deltas_.front()));
    deltas_.pop_front();
  }
  last_take_ = std::chrono::steady_clock::now();
  return finished_;
}

GenerationOutcome GenerationChannel::outcome() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outcome_;
}

namespace {

LogprobEntry make_logprob_entry(const Tokenizer& tokenizer, int32_t token, std::span<const float> logits, int top_n) {
  LogprobEntry e;
  e.token = model_token_piece(tokenizer, token);
  const LogitNormaliser z = logit_normaliser(logits);
  e.logprob = token_logprob(logits, token, z);
  if (top_n > 0) {
    for (const TokenProb& p : top_logprobs(logits, top_n, z)) {
      // The model's output can be wider than the vocabulary (padding rows).
      std::string text = model_token_piece(tokenizer, p.id);
      e.top.push_back({std::move(text), p.logprob});
    }
  }
  return e;
}

std::shared_ptr<JsonVocabulary> json_vocabulary(LoadedModel& model) {
  std::lock_guard<std::mutex> lock(model.json_vocabulary_mutex);
  if (!model.json_vocabulary)
    model.json_vocabulary = std::make_shared<JsonVocabulary>(output_pieces(*model.bundle->tokenizer));
  return model.json_vocabulary;
}

void generate(LoadedModel& model, const GenerationPlan& plan, GenerationChannel& channel, GenerationOutcome& outcome) {
  const Tokenizer& tokenizer = *model.bundle->tokenizer;
  GenerateRequest request;
  request.prompt = plan.prompt;
  request.sampling = plan.sampling;
  request.max_tokens = plan.max_tokens >= 0 ? plan.max_tokens : model.engine->n_ctx();
  if (!plan.ignore_eos) request.stop_tokens = model.bundle->eog_tokens;
  request.cache_salt = plan.cache_salt;
  request.loras = plan.loras;
  request.draft_max = plan.draft_max;
  request.prompt_keys = plan.prompt_keys;
  request.embedded = plan.embedded;
  request.cancelled = channel.cancel_flag();
  if (plan.embedding_pooling) {
    EmbeddingPooler pooler(model.bundle->model->info().n_embd, *plan.embedding_pooling);
    request.on_hidden = [&](std::span<const float> rows) { pooler.add(rows); };
    request.hidden_all = *plan.embedding_pooling == Pooling::Mean;
    const GenerateResult result = model.engine->generate(request);
    outcome.finish_reason = result.finish_reason;
    outcome.usage.prompt_tokens = result.prompt_tokens;
    outcome.usage.cached_tokens = result.cached_tokens;
    outcome.cache_report = result.reuse.describe();
    outcome.prefill_seconds = result.prefill_seconds;
    if (outcome.finish_reason != "cancelled") outcome.embedding = pooler.result(plan.embedding_dimensions);
    return;
  }
  if (plan.json_schema) request.constraint = std::make_shared<JsonConstraint>(plan.json_schema, json_vocabulary(model));

  // Echo: the prompt's text (and its tokens' logprobs) go out as the first
  // delta, before the first generated token's.
  std::vector<LogprobEntry> prompt_logprobs;
  if (plan.echo && plan.logprobs) {
    LogprobEntry first;
    first.token = model_token_piece(tokenizer, plan.prompt.front());
    first.predicted = false;
    prompt_logprobs.push_back(std::move(first));
    request.on_prompt_logits = [&](int64_t position, std::span<const float> logits) {
      prompt_logprobs.push_back(make_logprob_entry(tokenizer, plan.prompt[position + 1], logits, plan.top_logprobs));
    };
  }
  bool echoed = !plan.echo;
  auto echo = [&] {
    if (echoed) return;
    echoed = true;
    channel.push({*plan.echo, std::move(prompt_logprobs)});
  };

  StreamDecoder decoder(tokenizer);
  StopMatcher matcher(plan.stop);
  std::vector<LogprobEntry> pending_logprobs;
  int32_t pending_tokens = 0;
  auto emit = [&](std::string text) {
    if (text.empty() && pending_logprobs.empty()) return;
    channel.push({std::move(text), std::exchange(pending_logprobs, {}), std::exchange(pending_tokens, 0)});
  };

  GenerateResult result = model.engine->generate(request, [&](int32_t token, std::span<const float> logits) {
    echo();
    if (tokenizer.is_eog(token) || token >= tokenizer.n_vocab()) return true;  // never shown
    ++pending_tokens;
    const bool visible_control =
        std::find(plan.visible_control_tokens.begin(), plan.visible_control_tokens.end(), token) !=
        plan.visible_control_tokens.end();
    if (plan.logprobs) {
      pending_logprobs.push_back(make_logprob_entry(tokenizer, token, logits, plan.top_logprobs));
      if (visible_control) pending_logprobs.back().token = tokenizer.token_to_piece(token, true);
    }
    std::string text =
        matcher.push(visible_control ? decoder.flush() + tokenizer.token_to_piece(token, true) : decoder.push(token));
    if (!text.empty() || matcher.stopped()) emit(std::move(text));
    return !matcher.stopped() && !channel.cancelled();
  });
  if (result.finish_reason != "cancelled") echo();  // nothing was generated (max_tokens 0, or an end at once)
  if (!matcher.stopped()) {
    std::string tail = matcher.push(decoder.flush());
    if (!matcher.stopped()) tail += matcher.flush();
    emit(std::move(tail));
  }

  outcome.finish_reason = channel.cancelled() ? "cancelled" : matcher.stopped() ? "stop" : result.finish_reason;
  if (matcher.stopped()) outcome.stop_string = matcher.matched();
  outcome.usage.prompt_tokens = result.prompt_tokens;
  outcome.usage.cached_tokens = result.cached_tokens;
  outcome.usage.completion_tokens = static_cast<int64_t>(result.tokens.size());
  outcome.cache_report = result.reuse.describe();
  outcome.prefill_seconds = result.prefill_seconds;
  outcome.decode_seconds = result.decode_seconds;
}

}  // namespace

GenerationOutcome run_generation(LoadedModel& model, const GenerationPlan& plan, GenerationChannel& channel) {
  GenerationOutcome outcome;
  outcome.queue_seconds = channel.seconds_queued();
  if (channel.cancelled()) {
    outcome.finish_reason = "cancelled";  // the client left while queued
    return outcome;
  }
  try {
    generate(model, plan, channel, outcome);
  } catch (const Error& e) {
    outcome.error = ApiError::invalid(e.what());
  } catch (const std::exception& e) {
    outcome.error = ApiError::server(std::string("generation failed: ") + e.what());
  }
  if (outcome.error) outcome.finish_reason.clear();
  return outcome;
}

}  // namespace reprise
