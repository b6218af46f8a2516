#include "server/choice_stream.h"

#include <utility>

namespace reprise {

ChoiceStream::ChoiceStream(const ResponseContext& ctx, ChoiceEvents& events)
    : ctx_(ctx), events_(events), gate_(ctx.tool_syntax) {
  if (ctx.split_reasoning) splitter_.emplace(ctx.opens_reasoning);
  if (ctx.harmony) harmony_.emplace(ctx.harmony_calls);
}

void ChoiceStream::add(std::vector<GenerationDelta>& deltas) {
  for (GenerationDelta& d : deltas) {
    if (splitter_) add_parts(splitter_->push(d.text), d);
    else if (harmony_) add_parts(harmony_->push(d.text), d);
    else add_content(d);
  }
}

void ChoiceStream::finish(const std::string& generation_finish) {
  GenerationDelta rest;
  if (splitter_) add_parts(splitter_->flush(), rest);
  if (harmony_) {
    add_parts(harmony_->flush(generation_finish == "stop"), rest);
    if (!harmony_->calls().empty()) {
      std::vector<ToolCall> calls = harmony_->calls();
      limit_calls(calls, ctx_);
      for (ToolCall& call : calls) call.id = make_tool_call_id(ctx_.id_syntax);
      events_.tool_calls(calls, std::nullopt);
      events_.finish("tool_calls");
      return;
    }
  }
  finish_content(generation_finish);
}

// A delta's text split into reasoning and content (ReasoningSplitter's or
// HarmonyStream's parts): the reasoning goes out first, with the delta's
// logprobs, then the content.
template <typename Parts>
void ChoiceStream::add_parts(Parts parts, GenerationDelta& d) {
  if (!parts.reasoning.empty()) reasoning_tokens_ += d.tokens;
  d.text = std::move(parts.content);
  add_reasoning(parts.reasoning, d.logprobs);
  add_content(d);
}

// Reasoning goes out as it comes, with the logprobs of the tokens that wrote it.
void ChoiceStream::add_reasoning(const std::string& reasoning, std::vector<LogprobEntry>& logprobs) {
  if (reasoning.empty()) return;
  events_.reasoning(reasoning, logprobs_of(std::exchange(logprobs, {})));
}

// Content goes out as it comes, except what tool calls hold back (a forced
// call is sent whole once complete; with the model's own syntax, text up
// to where a call may start).
void ChoiceStream::add_content(GenerationDelta& d) {
  if ((splitter_ || harmony_) && d.text.empty() && d.logprobs.empty()) return;
  if (ctx_.options.tool_call_reply) {
    held_ += d.text;
    for (LogprobEntry& e : d.logprobs) held_logprobs_.push_back(std::move(e));
    return;
  }
  if (ctx_.tool_syntax != ToolCallSyntax::None) {
    reply_ += d.text;
    for (LogprobEntry& e : d.logprobs) unsent_logprobs_.push_back(std::move(e));
    const size_t free = gate_.free_prefix(reply_);
    if (free <= sent_) return;
    d.text = reply_.substr(sent_, free - sent_);
    d.logprobs = std::exchange(unsent_logprobs_, {});
    sent_ = free;
  }
  events_.content(d.text, logprobs_of(std::move(d.logprobs)));
}

void ChoiceStream::finish_content(const std::string& generation_finish) {
  std::string finish_reason = generation_finish;
  if (ctx_.options.tool_call_reply) {
    const std::optional<ToolCall> call =
        finish_reason == "stop" ? forced_tool_call(held_, ctx_.id_syntax) : std::nullopt;
    if (call) {
      finish_reason = "tool_calls";
      events_.tool_calls({*call}, logprobs_of(std::move(held_logprobs_)));
    } else {
      events_.content(held_, logprobs_of(std::move(held_logprobs_)));
    }
  }
  if (ctx_.tool_syntax != ToolCallSyntax::None) {
    auto parsed =
        finish_reason == "stop" ? parse_tool_calls(ctx_.tool_syntax, reply_, ctx_.tool_names) : std::nullopt;
    if (parsed) limit_calls(parsed->calls, ctx_);
    // Text not sent yet: what follows the calls, or the held tail.
    const std::string rest = parsed ? parsed->content_from(sent_) : reply_.substr(sent_);
    if (!rest.empty() || !unsent_logprobs_.empty()) events_.content(rest, logprobs_of(std::move(unsent_logprobs_)));
    if (parsed) {
      events_.tool_calls(parsed->calls, std::nullopt);
      finish_reason = "tool_calls";
    }
  }
  events_.finish(finish_reason);
}

ChoiceEvents::Logprobs ChoiceStream::logprobs_of(std::vector<LogprobEntry>&& entries) const {
  if (!ctx_.options.logprobs) return std::nullopt;
  return std::move(entries);
}

namespace {

class ChunkEvents final : public ChoiceEvents {
 public:
  ChunkEvents(const ResponseContext& ctx, int index, std::string& out)
      : ctx_(ctx), index_(index), chat_(ctx.endpoint == Endpoint::Chat), out_(out) {}

  void reasoning(const std::string& text, Logprobs logprobs) override {
    out_ += sse_event(chat_chunk_json(ctx_.meta, {{"reasoning_content", text}}, "", std::move(logprobs), usage_field(),
                                      index_));
  }

  void content(const std::string& text, Logprobs logprobs) override {
    if (chat_) {
      out_ += sse_event(chat_chunk_json(ctx_.meta, {{"content", text}}, "", std::move(logprobs), usage_field(), index_));
      return;
    }
    out_ += sse_event(completion_chunk_json(ctx_.meta, text, "", std::move(logprobs), text_offset_, usage_field(), index_));
    text_offset_ += utf8_characters(text);
  }

  // One tool_calls delta per call; a forced call's logprobs with it.
  void tool_calls(const std::vector<ToolCall>& calls, Logprobs logprobs) override {
    for (size_t i = 0; i < calls.size(); ++i)
      out_ += sse_event(chat_chunk_json(ctx_.meta, tool_call_delta(calls[i], static_cast<int>(i)), "",
                                        i == 0 ? std::move(logprobs) : std::nullopt, usage_field(), index_));
  }

  void finish(const std::string& finish_reason) override {
    out_ += chat_ ? sse_event(chat_chunk_json(ctx_.meta, ordered_json::object(), finish_reason, std::nullopt,
                                              usage_field(), index_))
                  : sse_event(completion_chunk_json(ctx_.meta, "", finish_reason, std::nullopt, text_offset_,
                                                    usage_field(), index_));
  }

 private:
  bool usage_field() const { return ctx_.options.include_usage; }

  const ResponseContext& ctx_;
  const int index_;
  const bool chat_;
  std::string& out_;
  size_t text_offset_ = 0;  // text completions: characters sent so far
};

}  // namespace

std::unique_ptr<ChoiceEvents> make_chunk_events(const ResponseContext& ctx, int index, std::string& out) {
  return std::make_unique<ChunkEvents>(ctx, index, out);
}

}  // namespace reprise
