// StreamDecoder: token pieces in, complete UTF-8 out.
#include "tokenizer/tokenizer.h"

namespace reprise {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

enum class Utf8Status { Complete, Truncated, Invalid };

struct Utf8Step {
  Utf8Status status;
  size_t length;  // bytes consumed (Complete) or bytes of the invalid prefix
};

// Strict UTF-8 (no overlongs, surrogates or values above U+10FFFF): looks at
// the sequence starting at s[i]. A sequence cut short by the end of the
// buffer is Truncated; an ill-formed one is Invalid over its maximal prefix.
Utf8Step inspect(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return {Utf8Status::Complete, 1};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Status::Invalid, 1};
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) return {Utf8Status::Truncated, k};
    const uint8_t b = byte(i + k);
    const uint8_t min = k == 1 ? lo : 0x80;
    const uint8_t max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return {Utf8Status::Invalid, k};
  }
  return {Utf8Status::Complete, need};
}

// Moves the decodable part of `pending` to the result; a truncated tail stays
// in `pending` unless `final`.
std::string drain(std::string& pending, bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending.size()) {
    Utf8Step step = inspect(pending, i);
    if (step.status == Utf8Status::Complete) {
      out.append(pending, i, step.length);
      i += step.length;
    } else if (step.status == Utf8Status::Truncated && !final) {
      break;
    } else {
      out += kReplacement;
      i += step.length;
    }
  }
  pending.erase(0, i);
  return out;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool render_special)
    : tokenizer_(tokenizer), render_special_(render_special) {}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tokenizer_.token_to_piece(id, render_special_);
  return drain(pending_, false);
}

std::string StreamDecoder::flush() { return drain(pending_, true); }

}  // namespace reprise
