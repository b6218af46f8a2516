// Splits template source into text and tag tokens, applying Jinja2's
// whitespace control while doing so: `-` on a tag strips whitespace beside it,
// trim_blocks drops the newline after a block or comment tag, lstrip_blocks
// drops the indentation before one (`+` opts a tag out). Raw blocks come out
// as plain text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/jinja/options.h"

namespace reprise::jinja {

enum class TokenKind : uint8_t {
  Text,
  VariableBegin,  // {{
  VariableEnd,    // }}
  BlockBegin,     // {%
  BlockEnd,       // %}
  Name,
  String,    // value holds the decoded literal
  Integer,   // value holds the digits (underscores removed)
  Float,
  Operator,  // value holds the operator spelling: "+", "//", "==", "(", ...
  EndOfInput,
};

struct Token {
  TokenKind kind;
  std::string value;
  size_t offset;  // byte offset into the normalized source, for error positions
};

// Jinja normalizes \r\n and \r to \n and (unless keep_trailing_newline)
// drops one trailing newline before lexing; offsets refer to this text.
std::string normalize_source(std::string_view source, const ParseOptions& options);

// Tokenizes normalized source. Throws reprise::Error for unterminated tags,
// strings or comments and for unexpected characters.
std::vector<Token> tokenize(std::string_view source, const ParseOptions& options);

// "line L, column C" of a byte offset, both 1-based.
std::string describe_position(std::string_view source, size_t offset);

// Throws reprise::Error("template syntax error at line L, column C: problem").
[[noreturn]] void throw_syntax_error(std::string_view source, size_t offset, const std::string& problem);

}  // namespace reprise::jinja
