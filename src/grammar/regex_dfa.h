// A regular expression compiled to a DFA over a string's UTF-8 bytes: what
// structured output needs to enforce JSON Schema's `pattern` (and the
// formats it enforces) while a model writes a string byte by byte.
//
// Syntax: the ECMAScript subset that schemas use in practice: literals,
// `.`, classes `[...]` (ranges, negation, `\d \w \s` and their negations
// inside and out), escapes (`\t \n \r \f \v \0 \xHH \uHHHH \u{H...}` and
// escaped punctuation), groups `(...)`, `(?:...)`, `(?<name>...)`,
// alternation, quantifiers `* + ? {n} {n,} {n,m}` (lazy forms too: the
// language is the same). `^` only at the start and `$` only at the end of
// a top-level alternative. As JSON Schema says, a pattern matches a string
// when it matches some part of it, unless anchored. Backreferences,
// lookaround, `\b`, `\p{...}` and flags are refused (reprise::Error), as
// are patterns longer than 16 KiB and patterns whose DFA would exceed a few
// thousand states or take too much work to build.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace reprise {

class RegexDfa {
 public:
  // Throws reprise::Error saying what is not supported or too large. A
  // pattern no string matches compiles to an empty() automaton.
  // `work_budget` (optional) is shared by several compiles and intersections
  // (one schema's) and drawn down by each: the whole set is refused once it
  // runs out, so no request costs more than a bounded time.
  static std::shared_ptr<const RegexDfa> compile(std::string_view pattern, uint64_t* work_budget = nullptr);
  // The strings both match (for a pattern beside a format).
  static std::shared_ptr<const RegexDfa> intersect(const RegexDfa& a, const RegexDfa& b,
                                                   uint64_t* work_budget = nullptr);
  static constexpr size_t kMaxPatternBytes = 16384;
  static constexpr size_t kMaxStates = 4096;

  // No string matches (there are no states: nothing below may be asked).
  bool empty() const { return accepting_.empty(); }

  static constexpr int32_t kDead = -1;
  static constexpr int32_t kUnbounded = 1 << 30;
  int32_t start() const { return 0; }
  // Every state kept can still reach acceptance: a byte that could not
  // leads to kDead.
  int32_t next(int32_t state, uint8_t byte) const { return table_[static_cast<size_t>(state) * 256 + byte]; }
  bool accepting(int32_t state) const { return accepting_[state]; }
  size_t state_count() const { return accepting_.size(); }
  // The fewest and most code points from `state` to acceptance (most:
  // kUnbounded when a loop is on the way).
  int32_t min_chars(int32_t state) const { return min_chars_[state]; }
  int32_t max_chars(int32_t state) const { return max_chars_[state]; }
  // Whether the whole UTF-8 string matches.
  bool matches(std::string_view utf8) const;
  // The pattern it was compiled from (for intersections: both, joined).
  const std::string& source() const { return source_; }

  // Per state, a bit set over 0..cap: the code-point lengths by which it can
  // reach acceptance (for maxLength beside a pattern). Words of 64 bits.
  std::vector<std::vector<uint64_t>> lengths_up_to(int32_t cap) const;

  // Public for the builders in regex_dfa.cpp.
  RegexDfa() = default;
  std::vector<int32_t> table_;  // state x 256
  std::vector<bool> accepting_;
  std::vector<int32_t> min_chars_, max_chars_;
  std::string source_;
  void finish();  // prunes dead states (all of them when no string matches), renumbers, computes the distances
};

}  // namespace reprise
