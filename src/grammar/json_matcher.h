// Byte-at-a-time recognizer of the JSON documents a compiled JsonSchema
// allows, for constraining a model's output to them.
//
// It accepts a subset of the valid documents, chosen so that every prefix it
// accepts can still be finished and so that a model cannot stall in filler:
// no whitespace before or after the document; between tokens at most one
// space, or a newline and up to 20 spaces or tabs; keys without escapes;
// \u escapes outside the surrogate range (other characters as UTF-8), and in
// strings with a pattern one-letter escapes only; up to
// 16 integer and 16 fraction digits and 2 exponent digits (none for numbers
// with bounds, whose digits are steered into them); declared keys
// once each (other keys are not checked for repeats); enum and const
// values written as JsonSchema::literals spells them (compact); at most
// JsonSchema::kMaxNesting frames deep (a value is started only if it can be
// finished within that).
//
// The state is a set of stacks of frames, one per open value. Most schemas
// keep one stack; a union whose alternatives both accept a byte keeps one per
// alternative until the bytes tell them apart (at most 256 at once: past
// that, later alternatives are dropped, which can refuse a valid document
// of a pathological schema but never accept an invalid one).
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/json_schema.h"

namespace reprise {

struct JsonFrame {
  enum Kind : uint8_t { Document, Object, Array, String, Number, Literal };
  Kind kind = Document;
  uint8_t phase = 0;
  uint8_t whitespace = 0;  // containers: the current run (see json_matcher.cpp)
  uint8_t escape = 0;      // strings: where in an escape sequence
  uint8_t utf8_left = 0;   // strings and keys: continuation bytes still to come
  uint8_t utf8_lo = 0x80, utf8_hi = 0xBF;  // the next continuation byte's range
  int32_t node = -1;       // schema node (Literal: literal set)
  int32_t count = 0;       // array items, string code points, number digits
  int32_t pattern_state = 0;  // strings with a pattern: its automaton's state
  int32_t lo = 0, hi = 0, pos = 0;  // declared keys / literals still matching, bytes matched
  int32_t property = -1;   // objects: whose value is being read (-2: another key's)
  uint64_t seen = 0;       // objects: declared properties written
  // Numbers: the digits so far, as integer and fraction parts (the fraction's
  // digit count is `count` while in it), and the sign.
  uint64_t int_part = 0, frac_part = 0;
  bool negative = false;

  bool operator==(const JsonFrame&) const = default;
};

using JsonStack = std::vector<JsonFrame>;

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonSchema> schema);

  // Advances by the bytes; on false (some byte is not allowed) the state is
  // unchanged.
  bool advance(std::string_view bytes);
  // Whether the bytes so far are a whole document.
  bool can_end() const;
  const JsonSchema& schema() const { return *schema_; }

  // For TokenMask: the stacks, and one-stack steps it can undo.
  const std::vector<JsonStack>& stacks() const { return stacks_; }
  // Advances one stack by `c`. When the byte starts a value of a union in
  // several ways, the first is applied to `stack` and the others appended to
  // `forks`. Frames below the top three are never changed.
  bool step(JsonStack& stack, uint8_t c, std::vector<JsonStack>& forks) const;
  // Every stack of `stacks` stepped by `c` (forks included, deduplicated)
  // into `next`; false when none accepts it.
  bool step_all(const std::vector<JsonStack>& stacks, uint8_t c, std::vector<JsonStack>& next) const;
  bool stack_can_end(JsonStack stack) const;
  // Whether `f` is inside text whose next bytes depend on nothing but `f`'s
  // own state until the text closes: a string value, or a key that no
  // declared property name begins like.
  static bool in_free_text(const JsonFrame& f);
  // Replaces the stacks (deduplicated); for TokenMask's multi-stack walk.
  static void dedupe(std::vector<JsonStack>& stacks);
  void set_stacks(std::vector<JsonStack> stacks) { stacks_ = std::move(stacks); }

 private:
  std::shared_ptr<const JsonSchema> schema_;
  std::vector<JsonStack> stacks_;

  bool start_value(JsonStack& stack, int32_t node, uint8_t c, std::vector<JsonStack>& forks) const;
  // The frames that start a value of `node` with byte `c` (unions give one
  // per alternative accepting it) on a stack of `open` frames.
  void collect_starts(int32_t node, uint8_t c, size_t open, std::vector<JsonFrame>& out) const;
  // Whether a value of `node` can be finished when pushed onto `open` frames.
  bool value_fits(int32_t node, size_t open) const;
  void child_done(JsonStack& stack) const;
  bool object_step(JsonStack& stack, uint8_t c, std::vector<JsonStack>& forks) const;
  bool array_step(JsonStack& stack, uint8_t c, std::vector<JsonStack>& forks) const;
  bool can_add_key(const JsonFrame& f, size_t open) const;
};

}  // namespace reprise
