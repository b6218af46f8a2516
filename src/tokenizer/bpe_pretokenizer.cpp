#include "tokenizer/bpe_pretokenizer.h"

#include <algorithm>
#include <array>
#include <functional>
#include <span>

#include "tokenizer/unicode_text.h"
#include "util/error.h"

namespace reprise::tok {
namespace {

// The text being split, one entry per code point.
struct Text {
  std::vector<uint32_t> cpts;         // lenient decode of the input
  std::vector<uint32_t> units;        // what literal character classes see: llama.cpp
                                      // replaces non-ASCII whitespace by U+000B first
  std::vector<CodepointFlags> flags;  // categories of the original code point
};

Text analyse(std::string_view utf8) {
  Text t;
  t.cpts = decode_utf8_lenient(utf8);
  t.units.resize(t.cpts.size());
  t.flags.resize(t.cpts.size());
  for (size_t i = 0; i < t.cpts.size(); ++i) {
    t.flags[i] = codepoint_flags(t.cpts[i]);
    t.units[i] = (t.cpts[i] > 0x7F && t.flags[i].whitespace()) ? 0x0B : t.cpts[i];
  }
  return t;
}

// A regex of the pre-tokenizer, as a function giving the length of its
// (leftmost-alternative) match starting at `pos` inside the piece
// [pos, end), or 0 when nothing matches there.
using Matcher = std::function<size_t(const Text&, size_t pos, size_t end)>;

struct Range {
  uint32_t lo, hi;
};

bool in_ranges(std::span<const Range> ranges, uint32_t c) {
  for (const Range& r : ranges)
    if (c >= r.lo && c <= r.hi) return true;
  return false;
}

template <typename Pred>
size_t run_length(const Text& t, size_t pos, size_t end, Pred pred) {
  size_t i = pos;
  while (i < end && pred(t, i)) ++i;
  return i - pos;
}

// Character classes. "Collapsed" classes (\p{..}) use the categories; literal
// ranges use the code units. Both see non-ASCII whitespace only as \s.
bool is_ws(const Text& t, size_t i) { return t.flags[i].whitespace(); }
bool is_letter(const Text& t, size_t i) { return t.flags[i].letter(); }
bool is_number(const Text& t, size_t i) { return t.flags[i].number(); }
bool is_punct(const Text& t, size_t i) { return t.flags[i].punctuation(); }
bool is_letter_or_mark(const Text& t, size_t i) { return t.flags[i].letter() || t.flags[i].mark(); }
bool is_newline(const Text& t, size_t i) { return t.cpts[i] == '\r' || t.cpts[i] == '\n'; }
bool is_ascii_digit(const Text& t, size_t i) { return t.units[i] >= '0' && t.units[i] <= '9'; }
bool is_ascii_alpha(const Text& t, size_t i) {
  uint32_t c = t.units[i];
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}
// [^\s\p{L}\p{N}]
bool is_other(const Text& t, size_t i) { return !(is_ws(t, i) || is_letter(t, i) || is_number(t, i)); }
// llama.cpp's collapsed \p{S} lists the ASCII symbols without '~'.
bool is_symbol_collapsed(const Text& t, size_t i) { return t.flags[i].symbol() && t.cpts[i] != '~'; }

uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// 's|'t|'re|'ve|'m|'ll|'d, optionally ASCII-case-insensitive.
size_t match_contraction(const Text& t, size_t p, size_t e, bool any_case) {
  if (t.cpts[p] != '\'' || p + 1 >= e) return 0;
  auto fold = [&](uint32_t c) { return any_case ? ascii_lower(c) : c; };
  uint32_t a = fold(t.cpts[p + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (p + 2 >= e) return 0;
  uint32_t b = fold(t.cpts[p + 2]);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// " ?X+" : an optional single space followed by a run of X.
template <typename Pred>
size_t match_space_then_run(const Text& t, size_t p, size_t e, Pred pred) {
  if (t.cpts[p] == ' ' && p + 1 < e && pred(t, p + 1)) return 1 + run_length(t, p + 1, e, pred);
  return run_length(t, p, e, pred);
}

// "\s?X+" : an optional whitespace character followed by a run of X.
template <typename Pred>
size_t match_ws_then_run(const Text& t, size_t p, size_t e, Pred pred) {
  if (is_ws(t, p) && p + 1 < e && pred(t, p + 1)) return 1 + run_length(t, p + 1, e, pred);
  return run_length(t, p, e, pred);
}

// "\s*[\r\n]+|\s+(?!\S)|\s+" (with_newlines) or "\s+(?!\S)" (GPT-2 style).
size_t match_whitespace(const Text& t, size_t p, size_t e, bool with_newlines) {
  size_t k = run_length(t, p, e, is_ws);
  if (k == 0) return 0;
  if (with_newlines) {
    for (size_t j = p + k; j > p; --j)
      if (is_newline(t, j - 1)) return j - p;
  }
  if (p + k < e) return k > 1 ? k - 1 : (with_newlines ? 1 : 0);
  return k;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
size_t match_gpt2(const Text& t, size_t p, size_t e) {
  if (size_t m = match_contraction(t, p, e, false)) return m;
  if (size_t m = match_space_then_run(t, p, e, is_letter)) return m;
  if (size_t m = match_space_then_run(t, p, e, is_number)) return m;
  if (size_t m = match_space_then_run(t, p, e, is_other)) return m;
  return match_whitespace(t, p, e, false);
}

// The llama3 family:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with variants: D (3 for llama3, 1 for qwen2) and, for qwen35, marks
// counted with letters ([\p{L}\p{M}]+ and [^\s\p{L}\p{M}\p{N}]).
struct Llama3Style {
  size_t max_digits = 3;
  bool marks_join_letters = false;
};

size_t match_llama3(const Text& t, size_t p, size_t e, Llama3Style style) {
  if (size_t m = match_contraction(t, p, e, true)) return m;
  auto word = [&](const Text& x, size_t i) {
    return style.marks_join_letters ? is_letter_or_mark(x, i) : is_letter(x, i);
  };
  if (!is_newline(t, p) && !is_letter(t, p) && !is_number(t, p) && p + 1 < e && word(t, p + 1))
    return 1 + run_length(t, p + 1, e, word);
  if (word(t, p)) return run_length(t, p, e, word);
  if (is_number(t, p)) return std::min(run_length(t, p, e, is_number), style.max_digits);
  auto other = [&](const Text& x, size_t i) { return is_other(x, i) && !(style.marks_join_letters && x.flags[i].mark()); };
  if (size_t m = match_space_then_run(t, p, e, other)) return m + run_length(t, p + m, e, is_newline);
  return match_whitespace(t, p, e, true);
}

// deepseek-v3:
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_deepseek3(const Text& t, size_t p, size_t e) {
  uint32_t c = t.cpts[p];
  bool ascii_punct = (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                     (c >= 0x7B && c <= 0x7E);
  if (ascii_punct && p + 1 < e && is_ascii_alpha(t, p + 1)) return 1 + run_length(t, p + 1, e, is_ascii_alpha);
  bool prefix = !is_newline(t, p) && !is_letter(t, p) && !is_punct(t, p) && !is_symbol_collapsed(t, p);
  if (prefix && p + 1 < e && is_letter_or_mark(t, p + 1)) return 1 + run_length(t, p + 1, e, is_letter_or_mark);
  if (is_letter_or_mark(t, p)) return run_length(t, p, e, is_letter_or_mark);
  auto punct_or_symbol = [](const Text& x, size_t i) { return is_punct(x, i) || is_symbol_collapsed(x, i); };
  if (size_t m = match_space_then_run(t, p, e, punct_or_symbol)) return m + run_length(t, p + m, e, is_newline);
  return match_whitespace(t, p, e, true);
}

// Literal classes from the DeepSeek tokenizers (code point ranges).
constexpr Range kDeepseekLetters[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
    {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
    {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
constexpr Range kDeepseekPunct[] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
                                    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002}};
constexpr Range kDeepseekCjk[] = {{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}};
constexpr Range kDeepseek3Cjk[] = {{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}};
// Poro/BLOOM: " ?[^(\s|.,!?…。，、।۔،)]+"
constexpr uint32_t kPoroStops[] = {'(', '|', '.', ',', '!', '?', 0x2026, 0x3002, 0xFF0C, 0x3001, 0x0964, 0x06D4, 0x060C, ')'};

template <size_t N>
auto unit_in(const Range (&ranges)[N]) {
  return [&ranges](const Text& t, size_t i) { return in_ranges(ranges, t.units[i]); };
}

Matcher newline_char() {
  return [](const Text& t, size_t p, size_t) -> size_t { return is_newline(t, p) ? 1 : 0; };
}
template <typename Pred>
Matcher run_of(Pred pred) {
  return [pred](const Text& t, size_t p, size_t e) { return run_length(t, p, e, pred); };
}
template <typename Pred>
Matcher ws_then_run_of(Pred pred) {
  return [pred](const Text& t, size_t p, size_t e) { return match_ws_then_run(t, p, e, pred); };
}
Matcher numbers_up_to(size_t n) {
  return [n](const Text& t, size_t p, size_t e) { return std::min(run_length(t, p, e, is_number), n); };
}
// [0-9][0-9][0-9]
Matcher three_ascii_digits() {
  return [](const Text& t, size_t p, size_t e) -> size_t {
    return (p + 3 <= e && is_ascii_digit(t, p) && is_ascii_digit(t, p + 1) && is_ascii_digit(t, p + 2)) ? 3 : 0;
  };
}
// [\p{P}\$\+<=>\^~\|`]+ (falcon) and the same without the backtick (default)
Matcher punct_and_ascii_symbols(bool with_backtick) {
  return [with_backtick](const Text& t, size_t p, size_t e) {
    return run_length(t, p, e, [with_backtick](const Text& x, size_t i) {
      uint32_t c = x.cpts[i];
      return is_punct(x, i) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
             c == '~' || c == '|' || (with_backtick && c == '`');
    });
  };
}
// \s+$
Matcher trailing_whitespace() {
  return [](const Text& t, size_t p, size_t e) -> size_t {
    size_t k = run_length(t, p, e, is_ws);
    return (k > 0 && p + k == e) ? k : 0;
  };
}
Matcher poro_words() {
  return [](const Text& t, size_t p, size_t e) {
    return match_space_then_run(t, p, e, [](const Text& x, size_t i) {
      if (is_ws(x, i)) return false;
      return std::find(std::begin(kPoroStops), std::end(kPoroStops), x.units[i]) == std::end(kPoroStops);
    });
  };
}
Matcher gpt2() { return match_gpt2; }
Matcher llama3(Llama3Style style) {
  return [style](const Text& t, size_t p, size_t e) { return match_llama3(t, p, e, style); };
}

std::vector<Matcher> passes_for(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::Default:
      return {punct_and_ascii_symbols(false), gpt2(), run_of(is_number), three_ascii_digits()};
    case PreTokenizerKind::Gpt2:
      return {gpt2()};
    case PreTokenizerKind::Llama3:
      return {llama3({3, false})};
    case PreTokenizerKind::Qwen2:
      return {llama3({1, false})};
    case PreTokenizerKind::Qwen35:
      return {llama3({1, true})};
    case PreTokenizerKind::DeepseekLlm:
      return {newline_char(),        ws_then_run_of(unit_in(kDeepseekLetters)), ws_then_run_of(unit_in(kDeepseekPunct)),
              trailing_whitespace(), run_of(unit_in(kDeepseekCjk)),             run_of(is_number)};
    case PreTokenizerKind::DeepseekCoder:
      return {newline_char(), ws_then_run_of(is_letter), ws_then_run_of(is_punct), run_of(unit_in(kDeepseekCjk)),
              numbers_up_to(1)};
    case PreTokenizerKind::Deepseek3:
      return {numbers_up_to(3), run_of(unit_in(kDeepseek3Cjk)), match_deepseek3};
    case PreTokenizerKind::Falcon:
      return {punct_and_ascii_symbols(true), gpt2(), three_ascii_digits()};
    case PreTokenizerKind::Starcoder:
      return {numbers_up_to(1), gpt2()};
    case PreTokenizerKind::Poro:
      return {poro_words()};
    case PreTokenizerKind::Viking:
      return {poro_words(), numbers_up_to(1)};
  }
  return {};
}

// One regex pass: every piece is split into matches and the gaps between them
// (std::regex_iterator semantics: leftmost match, then continue after it).
std::vector<size_t> split_pass(const Text& t, const std::vector<size_t>& pieces, const Matcher& match) {
  std::vector<size_t> out;
  out.reserve(pieces.size() * 2);
  size_t start = 0;
  for (size_t len : pieces) {
    const size_t end = start + len;
    size_t gap = start;
    size_t p = start;
    while (p < end) {
      size_t m = match(t, p, end);
      if (m == 0) {
        ++p;
        continue;
      }
      if (gap < p) out.push_back(p - gap);
      out.push_back(m);
      p += m;
      gap = p;
    }
    if (gap < end) out.push_back(end - gap);
    start = end;
  }
  return out;
}

struct NamedConfig {
  std::string_view name;
  PreTokenizerConfig config;
};

PreTokenizerConfig make(PreTokenizerKind kind, bool clean_spaces = true) {
  PreTokenizerConfig c;
  c.kind = kind;
  c.clean_spaces = clean_spaces;
  return c;
}

}  // namespace

PreTokenizerConfig pretokenizer_config(std::string_view name) {
  using K = PreTokenizerKind;
  if (name.empty() || name == "default") return make(K::Default);
  for (std::string_view n : {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                             "lfm2", "jina-v5-nano"}) {
    if (name == n) {
      PreTokenizerConfig c = make(K::Llama3);
      c.ignore_merges = true;
      c.add_bos = true;
      return c;
    }
  }
  if (name == "glm4" || name == "chatglm-bpe") {
    PreTokenizerConfig c = make(K::Llama3);
    c.clear_bos = true;
    return c;
  }
  for (std::string_view n : {"jina-v1-en", "jina-v2-code", "roberta-bpe"}) {
    if (name == n) {
      PreTokenizerConfig c = make(K::Gpt2);
      c.add_sep = true;
      return c;
    }
  }
  static const NamedConfig table[] = {
      {"dbrx", make(K::Llama3)},
      {"smaug-bpe", make(K::Llama3)},
      {"deepseek-llm", make(K::DeepseekLlm, false)},
      {"deepseek-coder", make(K::DeepseekCoder, false)},
      {"deepseek-v3", make(K::Deepseek3, false)},
      {"hunyuan-dense", make(K::Deepseek3, false)},
      {"hy_v4", make(K::Deepseek3, false)},
      {"joyai-llm", make(K::Deepseek3, false)},
      {"falcon", make(K::Falcon)},
      {"mpt", make(K::Gpt2)},
      {"gpt-2", make(K::Gpt2)},
      {"phi-2", make(K::Gpt2)},
      {"jina-es", make(K::Gpt2)},
      {"jina-de", make(K::Gpt2)},
      {"gigachat", make(K::Gpt2)},
      {"jina-v2-es", make(K::Gpt2)},
      {"jina-v2-de", make(K::Gpt2)},
      {"a.x-4.0", make(K::Gpt2)},
      {"mellum", make(K::Gpt2)},
      {"modern-bert", make(K::Gpt2)},
      {"exaone4", make(K::Gpt2)},
      {"olmo", make(K::Gpt2)},
      {"jais", make(K::Gpt2)},
      {"trillion", make(K::Gpt2, false)},
      {"granite-docling", make(K::Gpt2, false)},
      {"starcoder", make(K::Starcoder)},
      {"refact", make(K::Starcoder)},
      {"command-r", make(K::Starcoder, false)},
      {"smollm", make(K::Starcoder, false)},
      {"codeshell", make(K::Starcoder)},
      {"exaone", make(K::Starcoder)},
      {"minerva-7b", make(K::Starcoder)},
      {"mellum2", make(K::Starcoder)},
      {"qwen2", make(K::Qwen2, false)},
      {"deepseek-r1-qwen", make(K::Qwen2, false)},
      {"kormo", make(K::Qwen2, false)},
      {"f2llmv2", make(K::Qwen2, false)},
      {"stablelm2", make(K::Qwen2)},
      {"megrez", make(K::Qwen2)},
      {"hunyuan", make(K::Qwen2, false)},
      {"solar-open", make(K::Qwen2, false)},
      {"grok-2", make(K::Qwen2, false)},
      {"bailingmoe", make(K::Qwen2, false)},
      {"bailingmoe2", make(K::Qwen2, false)},
      {"llada-moe", make(K::Qwen2, false)},
      {"qwen35", make(K::Qwen35, false)},
      {"poro-chat", make(K::Poro, false)},
      {"bloom", make(K::Poro)},
      {"gpt3-finnish", make(K::Poro)},
      {"viking", make(K::Viking, false)},
  };
  for (const NamedConfig& entry : table)
    if (entry.name == name) return entry.config;
  throw Error("unsupported BPE pre-tokenizer '" + std::string(name) +
              "' (tokenizer.ggml.pre); see docs/tokenizers.md for the supported ones");
}

std::vector<std::string> pretokenize(PreTokenizerKind kind, std::string_view text) {
  const Text t = analyse(text);
  std::vector<size_t> pieces;
  if (!t.cpts.empty()) pieces.push_back(t.cpts.size());
  for (const Matcher& pass : passes_for(kind)) pieces = split_pass(t, pieces, pass);

  std::vector<std::string> words;
  words.reserve(pieces.size());
  size_t start = 0;
  std::string utf8;
  for (size_t len : pieces) {
    utf8.clear();
    for (size_t i = start; i < start + len; ++i) append_utf8(utf8, t.cpts[i]);
    std::string word;
    word.reserve(utf8.size() * 2);
    for (char c : utf8) word += byte_to_gpt2_char(static_cast<uint8_t>(c));
    words.push_back(std::move(word));
    start += len;
  }
  return words;
}

}  // namespace reprise::tok
