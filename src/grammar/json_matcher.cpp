#include "grammar/json_matcher.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace reprise {

namespace {

// Phases.
enum DocumentPhase : uint8_t { kDocumentValue, kDocumentDone = 2 };
enum ObjectPhase : uint8_t { kObjectStart, kObjectKey, kObjectColon, kObjectValue, kObjectAfterValue, kObjectNext };
enum ArrayPhase : uint8_t { kArrayStart, kArrayAfterValue, kArrayNext };
enum NumberPhase : uint8_t { kSign, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

constexpr int32_t kMaxIntegerDigits = 16, kMaxFractionDigits = 16, kMaxExponentDigits = 2;  // nlohmann refuses doubles beyond 1e308
// Alternatives kept at once; past it the later ones are dropped (the
// accepted language shrinks but stays sound and free of dead ends).
constexpr size_t kMaxStacks = 256;

// Whether a value of a form needing `depth` more containers fits when its
// frame would be pushed onto `open` frames (JsonSchema::kMaxNesting).
bool fits(size_t open, int32_t depth) {
  return depth < SchemaNode::kUnsatisfiable && static_cast<int64_t>(open) + depth <= JsonSchema::kMaxNesting;
}

// Scratch for start_value (one call at a time per thread): the frames a byte
// starts, and which unions this call has expanded (a union reached twice, or
// through itself, is expanded once).
struct StartScratch {
  std::vector<JsonFrame> starts;
  std::vector<uint32_t> expanded;  // epoch per node
  uint32_t epoch = 0;
};
thread_local StartScratch start_scratch;

enum class Step { Consumed, Rejected, Closed, Done /* complete before this byte: reprocess it */ };

bool is_whitespace(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// A whitespace run between tokens: `whitespace` is 0 before any, 1 after a
// single space (no more), 2 + k after a newline and k indentation bytes.
bool whitespace_step(JsonFrame& f, uint8_t c) {
  if (c == '\n') {
    if (f.whitespace != 0) return false;
    f.whitespace = 2;
    return true;
  }
  if (c == ' ' && f.whitespace == 0) {
    f.whitespace = 1;
    return true;
  }
  if ((c == ' ' || c == '\t') && f.whitespace >= 2 && f.whitespace < 22) {
    ++f.whitespace;
    return true;
  }
  return false;
}

enum class Utf8 { Rejected, Partial, Char };

// One byte of UTF-8 text (ASCII included), rejecting overlong forms,
// surrogates and code points above U+10FFFF.
Utf8 utf8_step(JsonFrame& f, uint8_t c) {
  if (f.utf8_left > 0) {
    if (c < f.utf8_lo || c > f.utf8_hi) return Utf8::Rejected;
    f.utf8_lo = 0x80;
    f.utf8_hi = 0xBF;
    return --f.utf8_left > 0 ? Utf8::Partial : Utf8::Char;
  }
  if (c < 0x80) return Utf8::Char;
  if (c >= 0xC2 && c <= 0xDF) f.utf8_left = 1;
  else if (c == 0xE0) f.utf8_left = 2, f.utf8_lo = 0xA0;
  else if (c == 0xED) f.utf8_left = 2, f.utf8_hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) f.utf8_left = 2;
  else if (c == 0xF0) f.utf8_left = 3, f.utf8_lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) f.utf8_left = 3;
  else if (c == 0xF4) f.utf8_left = 3, f.utf8_hi = 0x8F;
  else return Utf8::Rejected;
  return Utf8::Partial;
}

// A string's pattern takes its decoded character bytes; a byte is allowed
// only where the string can still be finished (`count_after`: its code
// points with the one this byte belongs to).
bool pattern_step(JsonFrame& f, const SchemaNode& n, const JsonSchema& s, uint8_t decoded, int64_t count_after) {
  const int32_t next = s.pattern(n.pattern).dfa->next(f.pattern_state, decoded);
  if (next == RegexDfa::kDead || !s.pattern_can_finish(n, next, count_after)) return false;
  f.pattern_state = next;
  return true;
}

// The character a one-letter escape stands for, or -1.
int short_escape(uint8_t c) {
  switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return -1;
  }
}

// Escapes: 1 after the backslash; \u's hex digits: 2 the first, 3 the second
// (4 when the first was d: 0-7 only, no surrogates), 5 and 6 the last two.
// Strings with a pattern take one-letter escapes only.
Step string_step(JsonFrame& f, const SchemaNode& n, const JsonSchema& s, uint8_t c) {
  const bool patterned = n.pattern >= 0;
  if (f.utf8_left > 0) {
    if (patterned && !pattern_step(f, n, s, c, f.count + 1)) return Step::Rejected;
    const Utf8 r = utf8_step(f, c);
    if (r == Utf8::Rejected) return Step::Rejected;
    if (r == Utf8::Char) ++f.count;
    return Step::Consumed;
  }
  switch (f.escape) {
    case 0: break;
    case 1: {
      if (c == 'u' && !patterned) {
        f.escape = 2;
        return Step::Consumed;
      }
      const int decoded = short_escape(c);
      if (decoded < 0) return Step::Rejected;
      if (patterned && !pattern_step(f, n, s, static_cast<uint8_t>(decoded), f.count + 1)) return Step::Rejected;
      f.escape = 0;
      ++f.count;
      return Step::Consumed;
    }
    case 2:
      if (!is_hex(c)) return Step::Rejected;
      f.escape = c == 'd' || c == 'D' ? 4 : 3;
      return Step::Consumed;
    case 4:
      if (c < '0' || c > '7') return Step::Rejected;
      f.escape = 5;
      return Step::Consumed;
    default:  // 3, 5, 6
      if (!is_hex(c)) return Step::Rejected;
      if (f.escape == 6) {
        f.escape = 0;
        ++f.count;
      } else {
        f.escape = f.escape == 3 ? 5 : 6;
      }
      return Step::Consumed;
  }
  if (c == '"') {
    if (patterned && !s.pattern(n.pattern).dfa->accepting(f.pattern_state)) return Step::Rejected;
    return f.count >= n.min_length ? Step::Closed : Step::Rejected;
  }
  if (n.max_length >= 0 && f.count >= n.max_length) return Step::Rejected;
  if (c == '\\') {
    if (patterned) {  // some escape must be able to follow
      bool any = false;
      for (uint8_t e : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) {
        JsonFrame probe = f;
        any = any || pattern_step(probe, n, s, static_cast<uint8_t>(short_escape(e)), f.count + 1);
      }
      if (!any) return Step::Rejected;
    }
    f.escape = 1;
    return Step::Consumed;
  }
  if (c < 0x20) return Step::Rejected;
  if (patterned && !pattern_step(f, n, s, c, f.count + 1)) return Step::Rejected;
  const Utf8 r = utf8_step(f, c);
  if (r == Utf8::Rejected) return Step::Rejected;
  if (r == Utf8::Char) ++f.count;
  return Step::Consumed;
}

// The number the frame's digits spell, as a JSON parser reads it (an
// integer exactly; a fraction as the double nearest its decimal), so bounds
// compare as validators compare them.
long double number_value(const JsonFrame& f) {
  long double v = static_cast<long double>(f.int_part);
  if (f.phase == kFrac) {
    char text[64];
    std::snprintf(text, sizeof text, "%llu.%0*llu", static_cast<unsigned long long>(f.int_part),
                  static_cast<int>(f.count), static_cast<unsigned long long>(f.frac_part));
    v = std::strtod(text, nullptr);
  }
  return f.negative ? -v : v;
}

// Numbers with bounds: whether some number this prefix can still become lies
// within them. Each phase reaches a set of magnitudes (a union of intervals,
// one per count of digits still to come), signed by the prefix's sign.
bool number_feasible(const JsonFrame& f, const SchemaNode& n) {
  if (!n.has_bounds()) return true;
  if (n.types & kJsonNumber) {
    // On the grid of writable values (SchemaNode::grid_min): whether the
    // signed magnitudes [a, b] the prefix can still become meet the range.
    auto meets = [&](__int128 a, __int128 b) {
      const __int128 lo = f.negative ? -b : a, hi = f.negative ? -a : b;
      return std::max(lo, n.grid_min) <= std::min(hi, n.grid_max);
    };
    constexpr __int128 kUnit = SchemaNode::kGridUnit;
    const auto whole = static_cast<__int128>(f.int_part);
    switch (f.phase) {
      case kSign: return meets(0, SchemaNode::kGridLimit);
      case kZero: return meets(0, kUnit - 1);  // 0, or 0.x
      case kDot: return meets(whole * kUnit, (whole + 1) * kUnit - 1);
      case kInt: {
        __int128 scale = 1;
        for (int32_t digits = f.count; digits <= kMaxIntegerDigits; ++digits, scale *= 10)
          if (meets(whole * scale * kUnit, (whole + 1) * scale * kUnit - 1)) return true;
        return false;
      }
      case kFrac: {
        __int128 scale = 1, digits = whole;
        for (int32_t i = 0; i < kMaxFractionDigits - f.count; ++i) scale *= 10;
        for (int32_t i = 0; i < f.count; ++i) digits *= 10;
        digits += f.frac_part;
        return meets(digits * scale, (digits + 1) * scale - 1);
      }
      default: return true;  // exponents are not written under bounds
    }
  }
  // Integers only: whether signed magnitudes [a, b - 1] meet the bounds.
  const auto [min, max] = n.integer_range();
  auto meets = [&, min = min, max = max](long double a, long double b) {
    const long double lo = f.negative ? -(b - 1) : a, hi = f.negative ? -a : b - 1;
    return std::max(lo, min) <= std::min(hi, max);
  };
  switch (f.phase) {
    case kSign: return meets(0, 1e16L);
    case kZero: return meets(0, 1);
    case kInt: {
      long double scale = 1;
      for (int32_t digits = f.count; digits <= kMaxIntegerDigits; ++digits, scale *= 10)
        if (meets(f.int_part * scale, (f.int_part + 1.0L) * scale)) return true;
      return false;
    }
    default: return true;  // integers have no fraction or exponent
  }
}

Step number_step_unchecked(JsonFrame& f, const SchemaNode& n, uint8_t c);

// A number's next byte; under bounds, digits that would leave no way into
// them are refused, and the number ends only within them.
Step number_step(JsonFrame& f, const SchemaNode& n, uint8_t c) {
  const JsonFrame before = f;
  const Step r = number_step_unchecked(f, n, c);
  if (!n.has_bounds()) return r;
  if (r == Step::Done) return n.in_bounds(number_value(f)) ? Step::Done : Step::Rejected;
  if (r == Step::Consumed && !number_feasible(f, n)) {
    f = before;
    return Step::Rejected;
  }
  return r;
}

Step number_step_unchecked(JsonFrame& f, const SchemaNode& n, uint8_t c) {
  const bool fraction = n.types & kJsonNumber;
  const bool exponent_mark = fraction && !n.has_bounds() && (c == 'e' || c == 'E');
  switch (f.phase) {
    case kSign:
      if (!is_digit(c)) return Step::Rejected;
      f.phase = c == '0' ? kZero : kInt;
      f.count = 1;
      f.int_part = static_cast<uint64_t>(c - '0');
      return Step::Consumed;
    case kZero:
    case kInt:
      if (is_digit(c)) {
        if (f.phase == kZero || f.count >= kMaxIntegerDigits) return Step::Rejected;
        ++f.count;
        f.int_part = f.int_part * 10 + static_cast<uint64_t>(c - '0');
        return Step::Consumed;
      }
      if (fraction && c == '.') {
        f.phase = kDot;
        return Step::Consumed;
      }
      if (exponent_mark) {
        f.phase = kExp;
        return Step::Consumed;
      }
      return Step::Done;
    case kDot:
      if (!is_digit(c)) return Step::Rejected;
      f.phase = kFrac;
      f.count = 1;
      f.frac_part = static_cast<uint64_t>(c - '0');
      return Step::Consumed;
    case kFrac:
      if (is_digit(c)) {
        if (f.count >= kMaxFractionDigits) return Step::Rejected;
        ++f.count;
        f.frac_part = f.frac_part * 10 + static_cast<uint64_t>(c - '0');
        return Step::Consumed;
      }
      if (exponent_mark) {
        f.phase = kExp;
        return Step::Consumed;
      }
      return Step::Done;
    case kExp:
      if (c == '+' || c == '-') {
        f.phase = kExpSign;
        return Step::Consumed;
      }
      [[fallthrough]];
    case kExpSign:
      if (!is_digit(c)) return Step::Rejected;
      f.phase = kExpDigits;
      f.count = 1;
      return Step::Consumed;
    default:  // kExpDigits
      if (is_digit(c)) {
        if (f.count >= kMaxExponentDigits) return Step::Rejected;
        ++f.count;
        return Step::Consumed;
      }
      return Step::Done;
  }
}

bool number_complete(const JsonFrame& f) {
  return f.phase == kZero || f.phase == kInt || f.phase == kFrac || f.phase == kExpDigits;
}

// Narrows [lo, hi) of sorted strings sharing their first `pos` bytes to
// those whose byte at `pos` is `c`.
template <typename Strings>
bool narrow(const Strings& strings, int32_t& lo, int32_t& hi, int32_t pos, uint8_t c) {
  int32_t first = lo;
  while (first < hi && !(static_cast<int32_t>(strings[first].size()) > pos &&
                         static_cast<uint8_t>(strings[first][pos]) == c))
    ++first;
  int32_t last = first;
  while (last < hi && static_cast<int32_t>(strings[last].size()) > pos &&
         static_cast<uint8_t>(strings[last][pos]) == c)
    ++last;
  lo = first;
  hi = last;
  return lo < hi;
}

Step literal_step(JsonFrame& f, const std::vector<std::string>& literals, uint8_t c) {
  int32_t lo = f.lo, hi = f.hi;
  if (narrow(literals, lo, hi, f.pos, c)) {
    f.lo = lo;
    f.hi = hi;
    ++f.pos;
    return Step::Consumed;
  }
  return static_cast<int32_t>(literals[f.lo].size()) == f.pos ? Step::Done : Step::Rejected;
}

bool literal_complete(const JsonFrame& f, const std::vector<std::string>& literals) {
  return static_cast<int32_t>(literals[f.lo].size()) == f.pos;
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
  stacks_.push_back({JsonFrame{}});  // a Document frame expecting the value
}

void JsonMatcher::collect_starts(int32_t id, uint8_t c, size_t open, std::vector<JsonFrame>& out) const {
  const SchemaNode& node = schema_->node(id);
  if (!fits(open, node.depth_needed)) return;
  if (!node.any_of.empty()) {
    StartScratch& scratch = start_scratch;
    if (scratch.expanded[id] == scratch.epoch) return;
    scratch.expanded[id] = scratch.epoch;
    for (int32_t alt : node.any_of) collect_starts(alt, c, open, out);
    return;
  }
  JsonFrame f;
  f.node = id;
  auto literal = [&](int32_t set) {
    const auto& lits = schema_->literals(set);
    f.kind = JsonFrame::Literal;
    f.node = set;
    f.lo = 0;
    f.hi = static_cast<int32_t>(lits.size());
    if (!narrow(lits, f.lo, f.hi, 0, c)) return;
    f.pos = 1;
    out.push_back(f);
  };
  if (node.literal_set >= 0) return literal(node.literal_set);
  if (c == '{' && (node.types & kJsonObject) && fits(open, node.object_depth_needed)) {
    f.kind = JsonFrame::Object;
    out.push_back(f);
  } else if (c == '[' && (node.types & kJsonArray) && fits(open, node.array_depth_needed)) {
    f.kind = JsonFrame::Array;
    out.push_back(f);
  } else if (c == '"' && (node.types & kJsonString) &&
             (node.max_length < 0 || node.min_length <= node.max_length)) {
    f.kind = JsonFrame::String;
    out.push_back(f);
  } else if ((c == '-' || is_digit(c)) && (node.types & (kJsonInteger | kJsonNumber)) && node.numbers_possible()) {
    f.kind = JsonFrame::Number;
    f.phase = c == '-' ? kSign : c == '0' ? kZero : kInt;
    f.count = c == '-' ? 0 : 1;
    f.negative = c == '-';
    f.int_part = c == '-' ? 0 : static_cast<uint64_t>(c - '0');
    if (number_feasible(f, node)) out.push_back(f);
  } else if ((c == 't' || c == 'f') && (node.types & kJsonBoolean)) {
    literal(JsonSchema::kBooleanLiterals);
  } else if (c == 'n' && (node.types & kJsonNull)) {
    literal(JsonSchema::kNullLiterals);
  }
}

bool JsonMatcher::start_value(JsonStack& stack, int32_t node, uint8_t c, std::vector<JsonStack>& forks) const {
  if (node < 0) return false;
  StartScratch& scratch = start_scratch;
  if (scratch.expanded.size() < schema_->node_count()) scratch.expanded.resize(schema_->node_count(), 0);
  if (++scratch.epoch == 0) {  // wrapped: forget every mark
    std::fill(scratch.expanded.begin(), scratch.expanded.end(), 0);
    scratch.epoch = 1;
  }
  std::vector<JsonFrame>& starts = scratch.starts;
  starts.clear();
  collect_starts(node, c, stack.size(), starts);
  if (starts.empty()) return false;
  for (size_t i = 1; i < starts.size(); ++i) {
    forks.push_back(stack);
    forks.back().push_back(starts[i]);
  }
  stack.push_back(starts[0]);
  return true;
}

void JsonMatcher::child_done(JsonStack& stack) const {
  JsonFrame& parent = stack.back();
  switch (parent.kind) {
    case JsonFrame::Document: parent.phase = kDocumentDone; break;
    case JsonFrame::Object:
      if (parent.property >= 0) parent.seen |= uint64_t{1} << parent.property;
      parent.phase = kObjectAfterValue;
      parent.whitespace = 0;
      break;
    case JsonFrame::Array:
      ++parent.count;
      parent.phase = kArrayAfterValue;
      parent.whitespace = 0;
      break;
    default: break;  // scalars have no children
  }
}

bool JsonMatcher::value_fits(int32_t node, size_t open) const {
  return node >= 0 && fits(open, schema_->node(node).depth_needed);
}

bool JsonMatcher::can_add_key(const JsonFrame& f, size_t open) const {
  const SchemaNode& n = schema_->node(f.node);
  if (value_fits(n.additional, open)) return true;
  for (size_t i = 0; i < n.property_names.size(); ++i)
    if (!(f.seen >> i & 1) && value_fits(n.property_nodes[i], open)) return true;
  return false;
}

bool JsonMatcher::object_step(JsonStack& stack, uint8_t c, std::vector<JsonStack>& forks) const {
  JsonFrame& f = stack.back();
  const SchemaNode& n = schema_->node(f.node);
  const size_t open = stack.size();  // where the member's value would be pushed
  auto open_key = [&] {
    if (!can_add_key(f, open)) return false;
    f.phase = kObjectKey;
    f.lo = 0;
    f.hi = static_cast<int32_t>(n.property_names.size());
    f.pos = 0;
    return true;
  };
  auto close = [&] {
    if ((f.seen & n.required) != n.required) return false;
    stack.pop_back();
    child_done(stack);
    return true;
  };
  const bool others_allowed = value_fits(n.additional, open);
  switch (f.phase) {
    case kObjectKey: {
      if (f.utf8_left == 0 && c == '"') {
        const bool exact = f.lo < f.hi && static_cast<int32_t>(n.property_names[f.lo].size()) == f.pos;
        if (exact) {
          if ((f.seen >> f.lo & 1) || !value_fits(n.property_nodes[f.lo], open)) return false;
          f.property = f.lo;
        } else {
          if (!others_allowed) return false;
          f.property = -2;
        }
        f.phase = kObjectColon;
        f.whitespace = 0;
        return true;
      }
      if (f.utf8_left == 0 && (c == '\\' || c < 0x20)) return false;
      if (utf8_step(f, c) == Utf8::Rejected) return false;
      narrow(n.property_names, f.lo, f.hi, f.pos, c);
      ++f.pos;
      if (others_allowed) return true;
      for (int32_t i = f.lo; i < f.hi; ++i)
        if (!(f.seen >> i & 1) && value_fits(n.property_nodes[i], open)) return true;
      return false;
    }
    case kObjectStart:
    case kObjectAfterValue:
    case kObjectNext:
    case kObjectColon:
    case kObjectValue:
      if (is_whitespace(c)) return whitespace_step(f, c);
      break;
  }
  switch (f.phase) {
    case kObjectStart:
      if (c == '"') return open_key();
      return c == '}' && close();
    case kObjectColon:
      if (c != ':') return false;
      f.phase = kObjectValue;
      f.whitespace = 0;
      return true;
    case kObjectValue: {
      const int32_t child = f.property >= 0 ? n.property_nodes[f.property] : n.additional;
      return start_value(stack, child, c, forks);  // `f` may dangle from here
    }
    case kObjectAfterValue:
      if (c == ',') {
        if (!can_add_key(f, open)) return false;
        f.phase = kObjectNext;
        f.whitespace = 0;
        return true;
      }
      return c == '}' && close();
    default:  // kObjectNext
      return c == '"' && open_key();
  }
}

bool JsonMatcher::array_step(JsonStack& stack, uint8_t c, std::vector<JsonStack>& forks) const {
  JsonFrame& f = stack.back();
  const SchemaNode& n = schema_->node(f.node);
  if (is_whitespace(c)) return whitespace_step(f, c);
  auto next_item = [&]() -> int32_t {
    if (n.max_items >= 0 && f.count >= n.max_items) return -1;
    const int32_t item = n.item_node(f.count);
    return value_fits(item, stack.size()) ? item : -1;
  };
  auto close = [&] {
    if (f.count < n.min_items) return false;
    stack.pop_back();
    child_done(stack);
    return true;
  };
  switch (f.phase) {
    case kArrayStart:
      if (c == ']') return close();
      return start_value(stack, next_item(), c, forks);
    case kArrayAfterValue:
      if (c == ',') {
        if (next_item() < 0) return false;
        f.phase = kArrayNext;
        f.whitespace = 0;
        return true;
      }
      return c == ']' && close();
    default:  // kArrayNext
      return start_value(stack, next_item(), c, forks);
  }
}

bool JsonMatcher::step(JsonStack& stack, uint8_t c, std::vector<JsonStack>& forks) const {
  for (;;) {
    JsonFrame& f = stack.back();
    Step r;
    switch (f.kind) {
      case JsonFrame::Document:
        if (f.phase != kDocumentValue) return false;
        return start_value(stack, schema_->root(), c, forks);
      case JsonFrame::Object: return object_step(stack, c, forks);
      case JsonFrame::Array: return array_step(stack, c, forks);
      case JsonFrame::String: r = string_step(f, schema_->node(f.node), *schema_, c); break;
      case JsonFrame::Number: r = number_step(f, schema_->node(f.node), c); break;
      default: r = literal_step(f, schema_->literals(f.node), c); break;
    }
    switch (r) {
      case Step::Consumed: return true;
      case Step::Rejected: return false;
      case Step::Closed:
        stack.pop_back();
        child_done(stack);
        return true;
      case Step::Done:
        stack.pop_back();
        child_done(stack);
        continue;  // the byte belongs to the enclosing value
    }
  }
}

bool JsonMatcher::stack_can_end(JsonStack stack) const {
  for (;;) {
    const JsonFrame& f = stack.back();
    const bool complete = (f.kind == JsonFrame::Number && number_complete(f) &&
                           (!schema_->node(f.node).has_bounds() || schema_->node(f.node).in_bounds(number_value(f)))) ||
                          (f.kind == JsonFrame::Literal && literal_complete(f, schema_->literals(f.node)));
    if (!complete) break;
    stack.pop_back();
    child_done(stack);
  }
  return stack.back().kind == JsonFrame::Document && stack.back().phase == kDocumentDone;
}

bool JsonMatcher::in_free_text(const JsonFrame& f) {
  return f.kind == JsonFrame::String || (f.kind == JsonFrame::Object && f.phase == kObjectKey && f.lo >= f.hi);
}

bool JsonMatcher::can_end() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [&](const JsonStack& s) { return stack_can_end(s); });
}

void JsonMatcher::dedupe(std::vector<JsonStack>& stacks) {
  std::vector<JsonStack> kept;
  for (auto& s : stacks) {
    if (kept.size() >= kMaxStacks) break;
    if (std::find(kept.begin(), kept.end(), s) == kept.end()) kept.push_back(std::move(s));
  }
  stacks = std::move(kept);
}

bool JsonMatcher::step_all(const std::vector<JsonStack>& stacks, uint8_t c, std::vector<JsonStack>& next) const {
  next.clear();
  std::vector<JsonStack> forks;
  for (const JsonStack& s : stacks) {
    JsonStack stepped = s;
    forks.clear();
    if (step(stepped, c, forks)) next.push_back(std::move(stepped));
    for (auto& f : forks) next.push_back(std::move(f));
  }
  if (next.size() > 1) dedupe(next);
  return !next.empty();
}

bool JsonMatcher::advance(std::string_view bytes) {
  std::vector<JsonStack> current = stacks_, next;
  for (char ch : bytes) {
    if (!step_all(current, static_cast<uint8_t>(ch), next)) return false;
    std::swap(current, next);
  }
  stacks_ = std::move(current);
  return true;
}

}  // namespace reprise
