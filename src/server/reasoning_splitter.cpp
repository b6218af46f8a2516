#include "server/reasoning_splitter.h"

namespace reprise {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::Reasoning : State::Start) {}

bool ReasoningSplitter::prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.size() >= kOpen.size() && prompt.substr(prompt.size() - kOpen.size()) == kOpen;
}

ReasoningSplitter::Parts ReasoningSplitter::push(std::string_view text) {
  Parts out;
  std::string pending = std::move(held_);
  held_.clear();
  pending.append(text);
  std::string_view rest = pending;
  while (!rest.empty()) {
    switch (state_) {
      case State::Start: {
        // (rest is all of pending here: nothing came before it. Its first
        // held_whitespace_ bytes were whitespace already.)
        size_t lead = held_whitespace_;
        while (lead < rest.size() && is_space(rest[lead])) ++lead;
        held_whitespace_ = lead;
        const std::string_view after = rest.substr(lead);
        if (after.empty()) {  // only whitespace so far
          held_ = std::move(pending);
          return out;
        }
        if (after.substr(0, kOpen.size()) == kOpen) {
          state_ = State::Reasoning;
          rest = after.substr(kOpen.size());
          continue;
        }
        if (after.size() < kOpen.size() && kOpen.substr(0, after.size()) == after) {
          held_ = std::move(pending);  // may still become the opening tag
          return out;
        }
        state_ = State::Content;
        continue;  // the whitespace belongs to the content
      }
      case State::Reasoning: {
        const size_t close = rest.find(kClose);
        if (close == std::string_view::npos) {
          const size_t partial = partial_tag_suffix(rest, kClose);
          out.reasoning.append(rest.substr(0, rest.size() - partial));
          held_ = std::string(rest.substr(rest.size() - partial));
          return out;
        }
        out.reasoning.append(rest.substr(0, close));
        rest = rest.substr(close + kClose.size());
        state_ = State::AfterReasoning;
        continue;
      }
      case State::AfterReasoning: {
        size_t lead = 0;
        while (lead < rest.size() && is_space(rest[lead])) ++lead;
        rest = rest.substr(lead);
        if (!rest.empty()) state_ = State::Content;
        continue;
      }
      case State::Content:
        out.content.append(rest);
        return out;
    }
  }
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::flush() {
  Parts out;
  if (state_ == State::Reasoning) out.reasoning = std::move(held_);
  else out.content = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace reprise
