#include "server/jinja/text.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>

#include "util/error.h"

namespace reprise::jinja::text {

char32_t decode(std::string_view s, size_t pos, size_t& consumed) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char b0 = byte(pos);
  size_t need = 0;
  char32_t cp = 0;
  if (b0 < 0x80) {
    consumed = 1;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0 && b0 >= 0xC2) {
    need = 1;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    need = 2;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
  } else {
    consumed = 1;  // stray byte: one code point of its own
    return b0;
  }
  if (pos + need >= s.size()) {  // truncated sequence
    consumed = 1;
    return b0;
  }
  for (size_t i = 1; i <= need; ++i) {
    unsigned char b = byte(pos + i);
    if ((b & 0xC0) != 0x80) {
      consumed = 1;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms and surrogates the same way: byte by byte.
  if ((need == 2 && cp < 0x800) || (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    consumed = 1;
    return b0;
  }
  consumed = need + 1;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

static bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0;
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
    decode(s, pos, len);
    ++n;
  }
  return n;
}

std::vector<size_t> boundaries(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
    out.push_back(pos);
    decode(s, pos, len);
  }
  out.push_back(s.size());
  return out;
}

bool is_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

struct CodePoint {
  char32_t cp;
  size_t begin, end;
};

std::vector<CodePoint> code_points(std::string_view s) {
  std::vector<CodePoint> out;
  out.reserve(s.size());
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
    char32_t cp = decode(s, pos, len);
    out.push_back({cp, pos, pos + len});
  }
  return out;
}

// Runs an ICU full-case-mapping function over UTF-8 text.
template <typename Mapper>
std::string icu_map(std::string_view s, Mapper mapper) {
  UErrorCode status = U_ZERO_ERROR;
  int32_t len16 = 0;
  u_strFromUTF8Lenient(nullptr, 0, &len16, s.data(), static_cast<int32_t>(s.size()), &status);
  status = U_ZERO_ERROR;
  // The lenient preflight may overestimate; the real call reports the length.
  std::u16string src(static_cast<size_t>(len16) + 1, u'\0');
  u_strFromUTF8Lenient(src.data(), len16 + 1, &len16, s.data(), static_cast<int32_t>(s.size()), &status);
  if (U_FAILURE(status)) return std::string(s);
  src.resize(static_cast<size_t>(len16));
  std::u16string dst(src.size() * 3 + 4, u'\0');
  status = U_ZERO_ERROR;
  int32_t n = mapper(dst.data(), static_cast<int32_t>(dst.size()), src.data(), len16, &status);
  if (U_FAILURE(status)) return std::string(s);
  dst.resize(static_cast<size_t>(n));
  std::string out;
  int32_t len8 = 0;
  status = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &len8, dst.data(), n, &status);
  status = U_ZERO_ERROR;
  out.resize(static_cast<size_t>(len8));
  u_strToUTF8(out.data(), len8, nullptr, dst.data(), n, &status);
  if (U_FAILURE(status)) return std::string(s);
  return out;
}

bool is_cased(char32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_CASED); }

void append_mapped(std::string& out, char32_t cp, UChar32 (*map)(UChar32)) {
  append_utf8(out, static_cast<char32_t>(map(static_cast<UChar32>(cp))));
}

}  // namespace

std::string upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out) if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    return out;
  }
  return icu_map(s, [](UChar* d, int32_t dc, const UChar* src, int32_t sl, UErrorCode* st) {
    return u_strToUpper(d, dc, src, sl, "", st);
  });
}

std::string lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out) if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return out;
  }
  return icu_map(s, [](UChar* d, int32_t dc, const UChar* src, int32_t sl, UErrorCode* st) {
    return u_strToLower(d, dc, src, sl, "", st);
  });
}

std::string capitalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool first = true;
  for (const CodePoint& c : code_points(s)) {
    append_mapped(out, c.cp, first ? u_totitle : u_tolower);
    first = false;
  }
  return out;
}

std::string python_title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (const CodePoint& c : code_points(s)) {
    append_mapped(out, c.cp, previous_cased ? u_tolower : u_totitle);
    previous_cased = is_cased(c.cp);
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  // Jinja splits on runs of [-\s({[<] and upper-cases the first character of
  // every piece, lower-casing the rest.
  std::string out;
  out.reserve(s.size());
  bool word_start = true;
  for (const CodePoint& c : code_points(s)) {
    bool separator = is_space(c.cp) || c.cp == '-' || c.cp == '(' || c.cp == '{' || c.cp == '[' ||
                     c.cp == '<';
    if (separator) {
      append_utf8(out, c.cp);
      word_start = true;
      continue;
    }
    append_mapped(out, c.cp, word_start ? u_toupper : u_tolower);
    word_start = false;
  }
  return out;
}

std::string strip(std::string_view s, Side side, const std::string* chars) {
  std::vector<CodePoint> cps = code_points(s);
  std::vector<char32_t> set;
  if (chars) {
    for (const CodePoint& c : code_points(*chars)) set.push_back(c.cp);
  }
  auto strippable = [&](char32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_space(cp);
  };
  size_t first = 0, last = cps.size();
  if (side != Side::Right) {
    while (first < last && strippable(cps[first].cp)) ++first;
  }
  if (side != Side::Left) {
    while (last > first && strippable(cps[last - 1].cp)) --last;
  }
  if (first == last) return {};
  return std::string(s.substr(cps[first].begin, cps[last - 1].end - cps[first].begin));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, long long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw Error("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<long long>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::vector<CodePoint> cps = code_points(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && is_space(cps[i].cp)) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<long long>(out.size()) == maxsplit) {
      // The remainder keeps its inner whitespace but loses trailing whitespace.
      size_t last = cps.size();
      while (last > i && is_space(cps[last - 1].cp)) --last;
      out.emplace_back(s.substr(cps[i].begin, cps[last - 1].end - cps[i].begin));
      break;
    }
    size_t start = i;
    while (i < cps.size() && !is_space(cps[i].cp)) ++i;
    out.emplace_back(s.substr(cps[start].begin, cps[i - 1].end - cps[start].begin));
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, long long maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw Error("empty separator");
    size_t end = s.size();
    while (static_cast<long long>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<CodePoint> cps = code_points(s);
  size_t i = cps.size();
  while (true) {
    while (i > 0 && is_space(cps[i - 1].cp)) --i;
    if (i == 0) break;
    if (static_cast<long long>(out.size()) == maxsplit) {
      size_t first = 0;
      while (first < i && is_space(cps[first].cp)) ++first;
      out.emplace_back(s.substr(cps[first].begin, cps[i - 1].end - cps[first].begin));
      break;
    }
    size_t end = i;
    while (i > 0 && !is_space(cps[i - 1].cp)) --i;
    out.emplace_back(s.substr(cps[i].begin, cps[end - 1].end - cps[i].begin));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  std::vector<CodePoint> cps = code_points(s);
  size_t line_start = 0;  // index into cps
  for (size_t i = 0; i < cps.size(); ++i) {
    char32_t cp = cps[i].cp;
    bool is_break = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C ||
                    cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) continue;
    size_t break_end = i;
    if (cp == '\r' && i + 1 < cps.size() && cps[i + 1].cp == '\n') break_end = i + 1;
    size_t begin = line_start < cps.size() ? cps[line_start].begin : s.size();
    size_t content_end = cps[i].begin;
    size_t with_break_end = cps[break_end].end;
    out.emplace_back(s.substr(begin, (keepends ? with_break_end : content_end) - begin));
    i = break_end;
    line_start = i + 1;
  }
  if (line_start < cps.size()) out.emplace_back(s.substr(cps[line_start].begin));
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to, long long count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    std::vector<size_t> b = boundaries(s);
    long long done = 0;
    for (size_t i = 0; i + 1 < b.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out.append(s.substr(b[i], b[i + 1] - b[i]));
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t pos = 0;
  long long done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace reprise::jinja::text
