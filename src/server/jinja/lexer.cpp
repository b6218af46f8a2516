#include "server/jinja/lexer.h"

#include <array>

#include "server/jinja/text.h"
#include "util/error.h"

namespace reprise::jinja {

std::string describe_position(std::string_view source, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

void throw_syntax_error(std::string_view source, size_t offset, const std::string& problem) {
  throw Error("template syntax error at " + describe_position(source, offset) + ": " + problem);
}

std::string normalize_source(std::string_view source, const ParseOptions& options) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!options.keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

enum class Leading : uint8_t { Keep, StripWhitespace, TrimNewline };

class Lexer {
 public:
  Lexer(std::string_view src, const ParseOptions& options) : src_(src), options_(options) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag(pos_);
      if (tag == std::string_view::npos) {
        emit_text(src_.substr(pos_), /*strip_trailing=*/false, /*lstrip=*/false);
        pos_ = src_.size();
        break;
      }
      char kind = src_[tag + 1];
      char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      bool strip_before = modifier == '-';
      bool lstrip = options_.lstrip_blocks && modifier != '+' && (kind == '%' || kind == '#');
      emit_text(src_.substr(pos_, tag - pos_), strip_before, lstrip);
      pos_ = tag + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      if (kind == '#') {
        lex_comment(tag);
      } else if (kind == '{') {
        tokens_.push_back({TokenKind::VariableBegin, "{{", tag});
        lex_tag_body(tag, /*block=*/false);
      } else if (!try_raw_block(tag)) {
        tokens_.push_back({TokenKind::BlockBegin, "{%", tag});
        lex_tag_body(tag, /*block=*/true);
      }
    }
    tokens_.push_back({TokenKind::EndOfInput, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string_view::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string_view::npos;
  }

  // Emits literal text after applying the previous tag's trailing control and
  // this tag's leading control.
  void emit_text(std::string_view text, bool strip_trailing, bool lstrip) {
    bool line_starting = at_template_start_;
    at_template_start_ = false;
    if (leading_ == Leading::StripWhitespace) {
      size_t n = 0;
      while (n < text.size() && is_blank(text[n])) ++n;
      line_starting = n > 0 && text[n - 1] == '\n';
      text.remove_prefix(n);
    } else if (leading_ == Leading::TrimNewline) {
      if (!text.empty() && text[0] == '\n') {
        text.remove_prefix(1);
        line_starting = true;
      }
    }
    leading_ = Leading::Keep;
    if (strip_trailing) {
      while (!text.empty() && is_blank(text.back())) text.remove_suffix(1);
    } else if (lstrip) {
      size_t newline = text.rfind('\n');
      size_t line_begin = newline == std::string_view::npos ? 0 : newline + 1;
      if (newline != std::string_view::npos || line_starting) {
        bool only_blanks = true;
        for (size_t i = line_begin; i < text.size(); ++i) {
          if (!is_blank(text[i])) only_blanks = false;
        }
        if (only_blanks) text = text.substr(0, line_begin);
      }
    }
    if (!text.empty()) {
      tokens_.push_back({TokenKind::Text, std::string(text), static_cast<size_t>(text.data() - src_.data())});
    }
  }

  void set_leading_after_tag(char end_modifier, bool block_like) {
    if (end_modifier == '-') leading_ = Leading::StripWhitespace;
    else if (block_like && end_modifier != '+' && options_.trim_blocks) leading_ = Leading::TrimNewline;
    else leading_ = Leading::Keep;
  }

  void lex_comment(size_t tag) {
    size_t end = src_.find("#}", pos_);
    if (end == std::string_view::npos) throw_syntax_error(src_, tag, "missing end of comment tag '#}'");
    char modifier = end > pos_ && src_[end - 1] == '-' ? '-' : '\0';
    pos_ = end + 2;
    set_leading_after_tag(modifier, /*block_like=*/true);
  }

  // {% raw %}...{% endraw %}: the body is emitted verbatim.
  bool try_raw_block(size_t tag) {
    size_t p = pos_;
    while (p < src_.size() && is_blank(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3]))) return false;
    p += 3;
    while (p < src_.size() && is_blank(src_[p])) ++p;
    bool strip_body_start = false;
    if (src_.compare(p, 3, "-%}") == 0) {
      strip_body_start = true;
      p += 3;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    // Find {% endraw %} with optional modifiers and inner whitespace.
    for (size_t search = p;;) {
      size_t open = src_.find("{%", search);
      if (open == std::string_view::npos) throw_syntax_error(src_, tag, "missing '{% endraw %}'");
      size_t q = open + 2;
      char begin_modifier = q < src_.size() ? src_[q] : '\0';
      if (begin_modifier == '-' || begin_modifier == '+') ++q;
      while (q < src_.size() && is_blank(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_blank(src_[q])) ++q;
      char end_modifier = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_modifier = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) throw_syntax_error(src_, open, "malformed '{% endraw %}'");
      std::string_view body = src_.substr(p, open - p);
      if (strip_body_start) {
        while (!body.empty() && is_blank(body.front())) body.remove_prefix(1);
      }
      if (begin_modifier == '-') {
        while (!body.empty() && is_blank(body.back())) body.remove_suffix(1);
      } else if (begin_modifier != '+' && options_.lstrip_blocks) {
        size_t newline = body.rfind('\n');
        if (newline != std::string_view::npos) {
          bool only_blanks = true;
          for (size_t i = newline + 1; i < body.size(); ++i) {
            if (!is_blank(body[i])) only_blanks = false;
          }
          if (only_blanks) body = body.substr(0, newline + 1);
        }
      }
      if (!body.empty()) {
        tokens_.push_back({TokenKind::Text, std::string(body), static_cast<size_t>(body.data() - src_.data())});
      }
      pos_ = q + 2;
      set_leading_after_tag(end_modifier, /*block_like=*/true);
      return true;
    }
  }

  void lex_tag_body(size_t tag, bool block) {
    const char* end_text = block ? "%}" : "}}";
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && is_blank(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        throw_syntax_error(src_, tag, std::string("unexpected end of template, missing '") + end_text + "'");
      }
      if (depth == 0) {
        char m = src_[pos_];
        if ((m == '-' || (block && m == '+')) && src_.compare(pos_ + 1, 2, end_text) == 0) {
          tokens_.push_back({block ? TokenKind::BlockEnd : TokenKind::VariableEnd, end_text, pos_});
          pos_ += 3;
          set_leading_after_tag(m, block);
          return;
        }
        if (src_.compare(pos_, 2, end_text) == 0) {
          tokens_.push_back({block ? TokenKind::BlockEnd : TokenKind::VariableEnd, end_text, pos_});
          pos_ += 2;
          set_leading_after_tag('\0', block);
          return;
        }
      }
      char c = src_[pos_];
      if (is_name_start(c)) {
        size_t start = pos_;
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        tokens_.push_back({TokenKind::Name, std::string(src_.substr(start, pos_ - start)), start});
      } else if (is_digit(c)) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        lex_operator(depth);
      }
    }
  }

  void lex_number() {
    size_t start = pos_;
    std::string digits;
    auto take_digits = [&](auto accept) {
      while (pos_ < src_.size() && (accept(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                                           accept(src_[pos_ + 1])))) {
        if (src_[pos_] != '_') digits += src_[pos_];
        ++pos_;
      }
    };
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() &&
        (src_[pos_ + 1] == 'x' || src_[pos_ + 1] == 'X' || src_[pos_ + 1] == 'o' || src_[pos_ + 1] == 'O' ||
         src_[pos_ + 1] == 'b' || src_[pos_ + 1] == 'B')) {
      char base = static_cast<char>(src_[pos_ + 1] | 0x20);
      digits = std::string("0") + base;
      pos_ += 2;
      size_t before = digits.size();
      take_digits([&](char ch) {
        return base == 'x' ? is_hex(ch) : base == 'o' ? (ch >= '0' && ch <= '7') : (ch == '0' || ch == '1');
      });
      if (digits.size() == before) throw_syntax_error(src_, start, "invalid number literal");
      tokens_.push_back({TokenKind::Integer, digits, start});
      return;
    }
    take_digits(is_digit);
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      digits += '.';
      ++pos_;
      take_digits(is_digit);
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t q = pos_ + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        digits += 'e';
        digits.append(src_.substr(pos_ + 1, q - pos_ - 1));
        pos_ = q;
        take_digits(is_digit);
      }
    }
    tokens_.push_back({is_float ? TokenKind::Float : TokenKind::Integer, digits, start});
  }

  // Decodes a quoted literal with Python escape rules (Jinja uses Python's
  // unicode-escape codec); unknown escapes keep their backslash.
  void lex_string() {
    size_t start = pos_;
    char quote = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) throw_syntax_error(src_, start, "unterminated string literal");
      char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (pos_ >= src_.size()) throw_syntax_error(src_, start, "unterminated string literal");
      char e = src_[pos_++];
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'n': value += '\n'; break;
        case 'r': value += '\r'; break;
        case 't': value += '\t'; break;
        case 'v': value += '\v'; break;
        case 'x': case 'u': case 'U': {
          size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + width > src_.size()) throw_syntax_error(src_, pos_ - 2, "truncated \\" + std::string(1, e) + " escape");
          char32_t cp = 0;
          for (size_t i = 0; i < width; ++i) {
            char h = src_[pos_ + i];
            if (!is_hex(h)) throw_syntax_error(src_, pos_ - 2, "truncated \\" + std::string(1, e) + " escape");
            cp = cp * 16 + static_cast<char32_t>(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          if (cp > 0x10FFFF) throw_syntax_error(src_, pos_ - 2, "illegal Unicode character");
          pos_ += width;
          text::append_utf8(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++i) {
              cp = cp * 8 + static_cast<char32_t>(src_[pos_++] - '0');
            }
            text::append_utf8(value, cp);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    tokens_.push_back({TokenKind::String, std::move(value), start});
  }

  void lex_operator(int& depth) {
    static constexpr std::array<std::string_view, 6> kTwoChar = {"//", "**", "==", "!=", "<=", ">="};
    for (std::string_view op : kTwoChar) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({TokenKind::Operator, std::string(op), pos_});
        pos_ += 2;
        return;
      }
    }
    char c = src_[pos_];
    static constexpr std::string_view kSingle = "+-*/%~()[]{},.:|=<>;";
    if (kSingle.find(c) == std::string_view::npos) {
      throw_syntax_error(src_, pos_, std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
    tokens_.push_back({TokenKind::Operator, std::string(1, c), pos_});
    ++pos_;
  }

  std::string_view src_;
  const ParseOptions& options_;
  size_t pos_ = 0;
  Leading leading_ = Leading::Keep;
  bool at_template_start_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const ParseOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace reprise::jinja
