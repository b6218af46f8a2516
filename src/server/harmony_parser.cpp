#include "server/harmony_parser.h"

#include <nlohmann/json.hpp>

namespace reprise {

namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kCall = "<|call|>";
constexpr std::string_view kReturn = "<|return|>";
constexpr std::string_view kConstrain = "<|constrain|>";

// A header longer than this without <|message|> is no harmony header.
constexpr size_t kMaxHeader = 512;

// Where a marker may begin in the tail of `text`: an unclosed "<|".
size_t partial_marker(std::string_view text) {
  if (!text.empty() && text.back() == '<') return text.size() - 1;
  const size_t at = text.rfind("<|");
  if (at != std::string_view::npos && text.find("|>", at) == std::string_view::npos && text.size() - at < 16) return at;
  return text.size();
}

// The first of the body terminators in `text`, and its length.
std::pair<size_t, size_t> body_end(std::string_view text) {
  size_t best = std::string_view::npos, len = 0;
  for (std::string_view m : {kEnd, kCall, kReturn}) {
    const size_t at = text.find(m);
    if (at < best) best = at, len = m.size();
  }
  return {best, len};
}

}  // namespace

const std::vector<std::string>& HarmonyStream::markers() {
  static const std::vector<std::string> all = {std::string(kStart),  std::string(kChannel), std::string(kMessage),
                                               std::string(kEnd),    std::string(kCall),    std::string(kReturn),
                                               std::string(kConstrain)};
  return all;
}

void HarmonyStream::begin_body() {
  // The header: the channel's name after <|channel|>, and a recipient
  // "to=functions.NAME" before or after it.
  std::string_view h = header_;
  std::string channel;
  if (const size_t c = h.find(kChannel); c != std::string_view::npos) {
    size_t i = c + kChannel.size();
    while (i < h.size() && h[i] != ' ' && h[i] != '<') channel += h[i++];
  }
  call_name_.clear();
  if (const size_t to = h.find("to=functions."); to != std::string_view::npos) {
    size_t i = to + 13;
    while (i < h.size() && h[i] != ' ' && h[i] != '<') call_name_ += h[i++];
  }
  call_body_.clear();
  channel_ = !call_name_.empty() && read_calls_ ? Channel::Call
             : channel == "analysis"             ? Channel::Reasoning
                                                 : Channel::Content;
  header_.clear();
  state_ = State::Body;
}

void HarmonyStream::end_message() {
  first_message_ = false;
  if (channel_ == Channel::Call) {
    // Arguments that are not a JSON object are passed on as written, as
    // OpenAI passes a model's arguments string.
    ToolCall call;
    call.name = call_name_;
    const auto parsed = nlohmann::json::parse(call_body_, nullptr, false);
    call.arguments = !parsed.is_discarded() && parsed.is_object() ? parsed.dump() : call_body_;
    calls_.push_back(std::move(call));
  }
  state_ = State::Between;
}

void HarmonyStream::take(std::string_view text, Parts& out) {
  std::string replay;  // the reply's first bytes, held while undecided
  while (!text.empty()) {
    if (raw_) {
      out.content.append(text);
      return;
    }
    switch (state_) {
      case State::Header: {
        if (first_) {
          // The reply's first message: harmony starts it with a marker or a
          // recipient; anything else is plain text (streamed as it comes).
          // Undecided while what came is whitespace, or a start of "to=".
          header_.append(text);
          const size_t lead = header_.find_first_not_of(" \t\r\n");
          if (lead == std::string::npos) {
            if (header_.size() > kMaxHeader) {  // a run of whitespace is no header: text
              raw_ = true;
              out.content += std::exchange(header_, {});
            }
            return;
          }
          const std::string_view t = std::string_view(header_).substr(lead);
          constexpr std::string_view kRecipient = "to=";
          if (t.size() < kRecipient.size() && kRecipient.substr(0, t.size()) == t) return;
          first_ = false;
          const bool plain = t.front() != '<' && t.substr(0, kRecipient.size()) != kRecipient;
          replay = std::exchange(header_, {});  // read again, as text or as the header
          text = replay;
          if (plain) raw_ = true;
          continue;
        }
        const size_t m = text.find(kMessage);
        if (m == std::string_view::npos) {
          header_.append(text);
          if (header_.size() > kMaxHeader) {  // no harmony: the reply is text
            raw_ = true;
            out.content += std::exchange(header_, {});
          }
          return;
        }
        header_.append(text.substr(0, m));
        text.remove_prefix(m + kMessage.size());
        if (header_.find(kChannel) == std::string::npos && header_.find("to=functions.") == std::string::npos) {
          // Text before a message marker without a channel: not harmony.
          raw_ = true;
          out.content += std::exchange(header_, {});
          out.content.append(kMessage);
          continue;
        }
        begin_body();
        continue;
      }
      case State::Body: {
        const auto [at, len] = body_end(text);
        const std::string_view body = text.substr(0, at == std::string_view::npos ? text.size() : at);
        if (channel_ == Channel::Reasoning) out.reasoning.append(body);
        else if (channel_ == Channel::Content) out.content.append(body);
        else call_body_.append(body);
        if (at == std::string_view::npos) return;
        text.remove_prefix(at + len);
        end_message();
        continue;
      }
      case State::Between: {
        // The next message: <|start|>, its role and header.
        if (text.substr(0, kStart.size()) == kStart) {
          text.remove_prefix(kStart.size());
          state_ = State::Header;
          continue;
        }
        if (text.substr(0, kChannel.size()) == kChannel) {  // a header without <|start|>
          state_ = State::Header;
          continue;
        }
        // Text between messages (a model ending oddly): content.
        const size_t next = text.find("<|");
        out.content.append(text.substr(0, next));
        if (next == std::string_view::npos) return;
        text.remove_prefix(next);
        if (text.substr(0, kStart.size()) != kStart && text.substr(0, kChannel.size()) != kChannel) {
          out.content.append(text.substr(0, 2));
          text.remove_prefix(2);
        }
        continue;
      }
    }
  }
}

HarmonyStream::Parts HarmonyStream::push(std::string_view text) {
  Parts out;
  std::string pending = std::exchange(held_, {});
  pending.append(text);
  const size_t keep = raw_ ? pending.size() : partial_marker(pending);
  held_ = pending.substr(keep);
  take(std::string_view(pending).substr(0, keep), out);
  return out;
}

HarmonyStream::Parts HarmonyStream::flush(bool complete) {
  Parts out;
  take(std::exchange(held_, {}), out);
  if (state_ == State::Header && !header_.empty()) {
    // A header never finished: markup when it began one, else text (a short
    // reply that began like markup).
    const std::string header = std::exchange(header_, {});
    const bool markup = !first_message_ || header.find(kChannel) != std::string::npos ||
                        header.find("to=functions.") != std::string::npos;
    if (!markup) out.content += header;
  }
  if (state_ == State::Body) {
    if (channel_ == Channel::Call && !complete) {
      out.content += std::exchange(call_body_, {});  // a call cut short: its text
      state_ = State::Between;
    } else {
      end_message();
    }
  }
  return out;
}

}  // namespace reprise
