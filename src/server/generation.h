// One request's generation, run on a scheduler slot, and the channel that
// carries its output to the HTTP thread writing the response.
//
// The slot thread decodes tokens to text (complete UTF-8 only), removes
// end-of-generation tokens and stop strings, and pushes text deltas with
// their log-probabilities; the HTTP thread takes them at its own pace. A
// cancelled channel (client gone, server stopping) makes the engine stop at
// its next check and release the sequence's cache blocks.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/cache_key.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "grammar/json_schema.h"
#include "server/api_error.h"
#include "server/embeddings.h"
#include "server/openai_response.h"

namespace reprise {

struct LoadedModel;

struct GenerationPlan {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = -1;  // < 0: until end of generation or a full context
  std::vector<std::string> stop;
  bool logprobs = false;
  int top_logprobs = 0;
  std::string cache_salt;
  std::vector<LoraUse> loras;  // adapters the generation runs with (GenerateRequest::loras)
  int draft_max = -1;       // -1: the engine's default; 0: no speculative decoding
  bool ignore_eos = false;  // end-of-generation tokens neither stop nor show
  // Text completions' echo: the prompt's text, sent first; with logprobs,
  // preceded by the prompt tokens' log-probabilities (which makes the
  // engine compute every prompt position: no cached prefix is reused).
  std::optional<std::string> echo;
  // For the reply, not the generation: the chat prompt ends inside an opened
  // <think>, so the reply starts in its reasoning.
  bool opens_reasoning = false;
  std::shared_ptr<const JsonSchema> json_schema;  // structured output; null: free text
  // Control tokens shown as their text (a tool-call syntax's markers that
  // the vocabulary holds as control tokens, e.g. Mistral's [TOOL_CALLS]).
  std::vector<int32_t> visible_control_tokens;
  // Images: per-position cache keys (image digests), the embedded spans and
  // the embeddings they point into (kept alive by the plan).
  std::vector<Hash128> prompt_keys;
  std::vector<EmbeddedSpan> embedded;
  std::vector<std::shared_ptr<const void>> keep_alive;
  // Embeddings: the prompt is pooled into one vector (outcome.embedding),
  // cut to `embedding_dimensions` values when given, instead of replied to.
  std::optional<Pooling> embedding_pooling;
  std::optional<int64_t> embedding_dimensions;
};

struct GenerationDelta {
  std::string text;
  std::vector<LogprobEntry> logprobs;  // tokens whose text is in (or held back before) `text`
  int32_t tokens = 0;                  // generated tokens since the previous delta (an echo has none)
};

struct GenerationOutcome {
  std::string finish_reason;  // "stop", "length" or "cancelled"; "" when error is set
  std::string stop_string;    // the stop string that ended the reply ("" for another end)
  std::optional<ApiError> error;
  UsageCounts usage;
  std::string cache_report;   // ReuseReport::describe()
  std::vector<float> embedding;  // embeddings requests: the pooled, unit-length vector
  double queue_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
};

class GenerationChannel {
 public:
  GenerationChannel() : created_(std::chrono::steady_clock::now()) {}

  // Producer side (the slot thread).
  void push(GenerationDelta delta);
  void finish(GenerationOutcome outcome);
  double seconds_queued() const;

  // Consumer side: moves pending deltas into `out`, waiting up to `timeout`
  // when there are none. Returns true once the generation has finished and
  // everything was taken.
  //
  // With a `pace`, a take returns no sooner than `pace` after the previous
  // one, unless the generation finishes meanwhile: it first waits out the
  // rest of that interval, and the producer's pushes do not wake it, so a
  // fast generation wakes the consumer once per interval instead of once
  // per token, while the reply's end is not held back. Why: when the
  // model's threads occupy every CPU (decode teams spin at their barriers),
  // each wake of an HTTP thread takes a CPU from a team member for a while
  // and stalls the whole team: paced, a streamed 60M model decoded 1.16x
  // faster on the 2-vCPU host (docs/performance.md, Session 42).
  bool take(std::vector<GenerationDelta>& out, std::chrono::milliseconds timeout,
            std::chrono::milliseconds pace = std::chrono::milliseconds(0));
  // Valid once take() returned true.
  GenerationOutcome outcome() const;

  // Any thread. Idempotent.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  const std::atomic<bool>* cancel_flag() const { return &cancelled_; }

 private:
  std::atomic<bool> cancelled_{false};
  const std::chrono::steady_clock::time_point created_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;        // a delta or the end
  std::condition_variable finished_cv_;  // the end only (ends a paced wait)
  std::deque<GenerationDelta> deltas_;
  bool finished_ = false;
  GenerationOutcome outcome_;
  std::chrono::steady_clock::time_point last_take_{};  // consumer side only
};

// Runs the plan on the model, pushing deltas into the channel, and returns
// the outcome without finishing the channel: the caller releases what the
// generation held (the model lease) first, so a client that has its answer
// never sees the model still busy. Never throws (errors are in the outcome).
GenerationOutcome run_generation(LoadedModel& model, const GenerationPlan& plan, GenerationChannel& channel);

}  // namespace reprise
