#include "grammar/regex_dfa.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "util/error.h"

namespace reprise {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxNfaStates = 200000;
// NFA states and edges the subset construction may visit in all: bounds a
// pattern's compile time (a schema arrives with a request) to tens of
// milliseconds, whatever its size.
constexpr uint64_t kMaxCompileWork = 30'000'000;
constexpr int kMaxRepeat = 1000;
constexpr int kMaxGroupDepth = 64;

// Code points as sorted, disjoint, non-adjacent closed ranges.
using CodeSet = std::vector<std::pair<uint32_t, uint32_t>>;

CodeSet normalized(CodeSet s) {
  std::sort(s.begin(), s.end());
  CodeSet out;
  for (const auto& r : s) {
    if (!out.empty() && r.first <= out.back().second + 1) out.back().second = std::max(out.back().second, r.second);
    else out.push_back(r);
  }
  return out;
}

CodeSet complement(const CodeSet& s) {
  CodeSet out;
  uint32_t next = 0;
  for (const auto& r : normalized(s)) {
    if (r.first > next) out.push_back({next, r.first - 1});
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

CodeSet digits() { return {{'0', '9'}}; }
CodeSet word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
CodeSet space() {
  return {{'\t', '\r'}, {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
          {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}

struct Ast {
  enum Kind { Empty, Set, Concat, Alt, Repeat } kind = Empty;
  CodeSet set;
  std::vector<Ast> kids;
  int min = 0, max = 0;  // Repeat; max < 0: unbounded
};

Ast set_ast(CodeSet s) {
  Ast a;
  a.kind = Ast::Set;
  a.set = normalized(std::move(s));
  return a;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  // The whole pattern: each top-level alternative may open with '^' and
  // close with '$'; an unanchored side matches anything there (JSON
  // Schema's search semantics), i.e. gets any-text prepended or appended.
  Ast parse() {
    std::vector<Ast> branches;
    while (true) {
      const bool anchored_start = more() && peek() == '^';
      if (anchored_start) ++i_;
      Ast body = concatenation(0, /*top=*/true);
      const bool anchored_end = more() && peek() == '$';
      if (anchored_end) ++i_;
      Ast branch;
      branch.kind = Ast::Concat;
      if (!anchored_start) branch.kids.push_back(any_text());
      branch.kids.push_back(std::move(body));
      if (!anchored_end) branch.kids.push_back(any_text());
      branches.push_back(std::move(branch));
      if (!more()) break;
      if (peek() != '|') fail(peek() == ')' ? "unbalanced ')'" : "'$' is supported only at the end");
      ++i_;
    }
    if (branches.size() == 1) return std::move(branches[0]);
    Ast a;
    a.kind = Ast::Alt;
    a.kids = std::move(branches);
    return a;
  }

 private:
  std::string_view p_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("pattern: " + what + " (at offset " + std::to_string(i_) + ")");
  }
  bool more() const { return i_ < p_.size(); }
  char peek() const { return p_[i_]; }

  Ast alternation(int depth) {
    if (depth > kMaxGroupDepth) fail("groups nested too deep");
    std::vector<Ast> alts;
    alts.push_back(concatenation(depth));
    while (more() && peek() == '|') {
      ++i_;
      alts.push_back(concatenation(depth));
    }
    if (alts.size() == 1) return std::move(alts[0]);
    Ast a;
    a.kind = Ast::Alt;
    a.kids = std::move(alts);
    return a;
  }

  static Ast any_text() {
    Ast r;
    r.kind = Ast::Repeat;
    r.min = 0;
    r.max = -1;
    r.kids.push_back(set_ast({{0, kMaxCodePoint}}));
    return r;
  }

  // `top`: a top-level alternative, which a '$' followed by '|' or the
  // pattern's end closes.
  Ast concatenation(int depth, bool top = false) {
    std::vector<Ast> items;
    while (more() && peek() != '|' && peek() != ')') {
      if (top && peek() == '$' && (i_ + 1 == p_.size() || p_[i_ + 1] == '|')) break;
      items.push_back(quantified(atom(depth)));
    }
    if (items.empty()) return Ast{};
    if (items.size() == 1) return std::move(items[0]);
    Ast a;
    a.kind = Ast::Concat;
    a.kids = std::move(items);
    return a;
  }

  // {n}, {n,}, {n,m} at i_ (on '{'): true and the bounds, or false (then '{'
  // is a literal, as ECMAScript's web compatibility has it).
  bool braces(int& lo, int& hi) {
    size_t j = i_ + 1;
    auto number = [&](int& out) {
      const size_t from = j;
      long v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        v = std::min<long>(v * 10 + (p_[j] - '0'), 1000000);
        ++j;
      }
      out = static_cast<int>(v);
      return j > from;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(hi)) hi = -1;
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    i_ = j + 1;
    return true;
  }

  Ast quantified(Ast a) {
    if (!more()) return a;
    int lo = 0, hi = 0;
    const char c = peek();
    if (c == '*') lo = 0, hi = -1, ++i_;
    else if (c == '+') lo = 1, hi = -1, ++i_;
    else if (c == '?') lo = 0, hi = 1, ++i_;
    else if (c == '{' && braces(lo, hi)) {
    } else {
      return a;
    }
    if (lo > kMaxRepeat || hi > kMaxRepeat) fail("a repeat count above " + std::to_string(kMaxRepeat));
    if (hi >= 0 && hi < lo) fail("a repeat whose maximum is below its minimum");
    if (more() && peek() == '?') ++i_;  // lazy: the same language
    int ignored1 = 0, ignored2 = 0;
    if (more() && (peek() == '*' || peek() == '+' || peek() == '?' ||
                   (peek() == '{' && [&] {
                     const size_t at = i_;
                     const bool q = braces(ignored1, ignored2);
                     i_ = at;
                     return q;
                   }())))
      fail("nothing to repeat");
    Ast r;
    r.kind = Ast::Repeat;
    r.min = lo;
    r.max = hi;
    r.kids.push_back(std::move(a));
    return r;
  }

  uint32_t utf8_code_point() {
    const auto b = static_cast<unsigned char>(p_[i_]);
    int len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || i_ + len > p_.size()) fail("invalid UTF-8");
    uint32_t cp = len == 1 ? b : b & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const auto cb = static_cast<unsigned char>(p_[i_ + k]);
      if ((cb & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (cb & 0x3F);
    }
    i_ += static_cast<size_t>(len);
    return cp;
  }

  uint32_t hex(size_t digits) {
    if (i_ + digits > p_.size()) fail("a short hex escape");
    uint32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      const char h = p_[i_ + k];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("a bad hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    i_ += digits;
    return v;
  }

  // After a backslash: a class escape (\d ...) into `set` (true), or one
  // code point into `cp` (false).
  bool escape(bool in_class, CodeSet& set, uint32_t& cp) {
    if (!more()) fail("a pattern ending in '\\'");
    const char c = p_[i_++];
    switch (c) {
      case 'd': set = digits(); return true;
      case 'D': set = complement(digits()); return true;
      case 'w': set = word(); return true;
      case 'W': set = complement(word()); return true;
      case 's': set = space(); return true;
      case 'S': set = complement(space()); return true;
      case 't': cp = '\t'; return false;
      case 'n': cp = '\n'; return false;
      case 'r': cp = '\r'; return false;
      case 'f': cp = '\f'; return false;
      case 'v': cp = '\v'; return false;
      case '0':
        if (more() && peek() >= '0' && peek() <= '9') fail("octal escapes are not supported");
        cp = 0;
        return false;
      case 'x': cp = hex(2); return false;
      case 'u': {
        if (more() && peek() == '{') {
          ++i_;
          const size_t end = p_.find('}', i_);
          if (end == std::string_view::npos || end == i_ || end - i_ > 6) fail("a bad \\u{...} escape");
          cp = hex(end - i_);
          ++i_;
          if (cp > kMaxCodePoint) fail("a code point above U+10FFFF");
          return false;
        }
        cp = hex(4);
        if (cp >= 0xD800 && cp <= 0xDBFF && i_ + 6 <= p_.size() && p_[i_] == '\\' && p_[i_ + 1] == 'u') {
          const size_t at = i_;
          i_ += 2;
          const uint32_t low = hex(4);
          if (low >= 0xDC00 && low <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          else i_ = at;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) fail("a lone surrogate");
        return false;
      }
      case 'b':
        if (in_class) {
          cp = '\b';
          return false;
        }
        fail("word boundaries (\\b) are not supported");
      case 'B': fail("word boundaries (\\B) are not supported");
      case 'p':
      case 'P': fail("Unicode property escapes are not supported");
      case 'k': fail("backreferences are not supported");
      case 'c': fail("control escapes (\\c) are not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail(std::string("an unknown escape \\") + c);
        --i_;
        cp = utf8_code_point();
        return false;
    }
  }

  Ast char_class() {
    ++i_;  // '['
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++i_;
    }
    CodeSet set;
    bool first = true;
    while (true) {
      if (!more()) fail("missing ']'");
      if (peek() == ']' ) {
        ++i_;
        break;
      }
      // One class atom: a code point, or an escape's set.
      auto class_atom = [&](CodeSet& s, uint32_t& cp) {
        if (peek() == '\\') {
          ++i_;
          return escape(true, s, cp);
        }
        cp = utf8_code_point();
        return false;
      };
      CodeSet s;
      uint32_t lo = 0;
      const bool is_set = class_atom(s, lo);
      (void)first;
      first = false;
      if (is_set) {
        set.insert(set.end(), s.begin(), s.end());
        continue;
      }
      if (more() && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        CodeSet s2;
        uint32_t hi = 0;
        if (class_atom(s2, hi)) fail("a class escape as a range's end");
        if (hi < lo) fail("a range out of order");
        set.push_back({lo, hi});
      } else {
        set.push_back({lo, lo});
      }
    }
    return set_ast(negate ? complement(set) : set);
  }

  Ast atom(int depth) {
    const char c = peek();
    switch (c) {
      case '(': {
        ++i_;
        if (more() && peek() == '?') {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
            i_ += 2;
          } else if (i_ + 2 < p_.size() && p_[i_ + 1] == '<' && p_[i_ + 2] != '=' && p_[i_ + 2] != '!') {
            const size_t end = p_.find('>', i_);
            if (end == std::string_view::npos) fail("an unterminated group name");
            i_ = end + 1;
          } else {
            fail("lookaround and group flags are not supported");
          }
        }
        Ast inner = alternation(depth + 1);
        if (!more() || peek() != ')') fail("missing ')'");
        ++i_;
        return inner;
      }
      case '[': return char_class();
      case '.': ++i_; return set_ast(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
      case '\\': {
        ++i_;
        CodeSet s;
        uint32_t cp = 0;
        if (escape(false, s, cp)) return set_ast(std::move(s));
        return set_ast({{cp, cp}});
      }
      case '^': fail("'^' is supported only at the start of a top-level alternative");
      case '$': fail("'$' is supported only at the end of a top-level alternative");
      case '*':
      case '+':
      case '?': fail("nothing to repeat");
      default: {
        if (c == '{') {
          int lo = 0, hi = 0;
          const size_t at = i_;
          if (braces(lo, hi)) {
            i_ = at;
            fail("nothing to repeat");
          }
        }
        const uint32_t cp = utf8_code_point();
        return set_ast({{cp, cp}});
      }
    }
  }
};

// A Thompson NFA over bytes.
struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    int32_t to;
  };
  struct State {
    std::vector<int32_t> eps;
    std::vector<Edge> edges;
  };
  std::vector<State> states;

  int32_t add() {
    if (states.size() >= kMaxNfaStates) throw Error("pattern: too large (its automaton exceeds the limit)");
    states.emplace_back();
    return static_cast<int32_t>(states.size() - 1);
  }
};

struct Frag {
  int32_t start, end;
};

// UTF-8 byte-range sequences covering code points [lo, hi] (no surrogates).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // cut the surrogates out
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  const int len = hi <= 0x7F ? 1 : hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  for (int k = 1; k < len; ++k) {
    const uint32_t m = (1u << (6 * k)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  auto encode = [len](uint32_t cp, uint8_t* b) {
    if (len == 1) {
      b[0] = static_cast<uint8_t>(cp);
    } else if (len == 2) {
      b[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      b[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    } else if (len == 3) {
      b[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    } else {
      b[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      b[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      b[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    }
  };
  uint8_t a[4], b[4];
  encode(lo, a);
  encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int k = 0; k < len; ++k) seq.push_back({a[k], b[k]});
  out.push_back(std::move(seq));
}

Frag build(Nfa& nfa, const Ast& a) {
  switch (a.kind) {
    case Ast::Empty: {
      const int32_t s = nfa.add();
      return {s, s};
    }
    case Ast::Set: {
      const int32_t s = nfa.add(), e = nfa.add();
      std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
      for (const auto& r : a.set) utf8_sequences(r.first, std::min(r.second, kMaxCodePoint), seqs);
      for (const auto& seq : seqs) {
        int32_t cur = s;
        for (size_t k = 0; k < seq.size(); ++k) {
          const int32_t to = k + 1 == seq.size() ? e : nfa.add();
          nfa.states[cur].edges.push_back({seq[k].first, seq[k].second, to});
          cur = to;
        }
      }
      return {s, e};
    }
    case Ast::Concat: {
      Frag f = build(nfa, a.kids[0]);
      for (size_t k = 1; k < a.kids.size(); ++k) {
        const Frag g = build(nfa, a.kids[k]);
        nfa.states[f.end].eps.push_back(g.start);
        f.end = g.end;
      }
      return f;
    }
    case Ast::Alt: {
      const int32_t s = nfa.add(), e = nfa.add();
      for (const Ast& kid : a.kids) {
        const Frag g = build(nfa, kid);
        nfa.states[s].eps.push_back(g.start);
        nfa.states[g.end].eps.push_back(e);
      }
      return {s, e};
    }
    case Ast::Repeat: {
      const int32_t s = nfa.add();
      Frag f{s, s};
      auto append = [&](Frag g) {
        nfa.states[f.end].eps.push_back(g.start);
        f.end = g.end;
      };
      for (int k = 0; k < a.min; ++k) append(build(nfa, a.kids[0]));
      if (a.max < 0) {
        const int32_t loop = nfa.add();
        const Frag g = build(nfa, a.kids[0]);
        nfa.states[loop].eps.push_back(g.start);
        nfa.states[g.end].eps.push_back(loop);
        append({loop, loop});
      } else {
        const int32_t e = nfa.add();
        for (int k = a.min; k < a.max; ++k) {
          nfa.states[f.end].eps.push_back(e);
          append(build(nfa, a.kids[0]));
        }
        nfa.states[f.end].eps.push_back(e);
        f.end = e;
      }
      return f;
    }
  }
  return {nfa.add(), 0};
}

void closure(const Nfa& nfa, std::vector<int32_t>& set, std::vector<uint32_t>& mark, uint32_t epoch) {
  for (int32_t s : set) mark[s] = epoch;
  for (size_t k = 0; k < set.size(); ++k)
    for (int32_t t : nfa.states[set[k]].eps)
      if (mark[t] != epoch) {
        mark[t] = epoch;
        set.push_back(t);
      }
  std::sort(set.begin(), set.end());
}

bool char_start(uint8_t b) { return (b & 0xC0) != 0x80; }

// A DFA's transitions between two states, with the code points their byte
// adds (1 for a character's first byte, 0 for a continuation byte), each
// (state, other state, cost) once: out of each state (`to` the successor)
// and into each (`to` the predecessor).
struct Arc {
  int32_t to;
  int32_t cost;
};
struct Arcs {
  std::vector<std::vector<Arc>> out, in;
};

Arcs distinct_arcs(const std::vector<int32_t>& table, size_t states) {
  Arcs arcs{std::vector<std::vector<Arc>>(states), std::vector<std::vector<Arc>>(states)};
  // Per target and cost, the last state that added an arc to it.
  std::vector<int64_t> added[2] = {std::vector<int64_t>(states, -1), std::vector<int64_t>(states, -1)};
  for (size_t s = 0; s < states; ++s)
    for (int b = 0; b < 256; ++b) {
      const int32_t t = table[s * 256 + static_cast<size_t>(b)];
      if (t == RegexDfa::kDead) continue;
      const int32_t cost = char_start(static_cast<uint8_t>(b)) ? 1 : 0;
      if (added[cost][t] == static_cast<int64_t>(s)) continue;
      added[cost][t] = static_cast<int64_t>(s);
      arcs.out[s].push_back({t, cost});
      arcs.in[t].push_back({static_cast<int32_t>(s), cost});
    }
  return arcs;
}

}  // namespace

std::shared_ptr<const RegexDfa> RegexDfa::compile(std::string_view pattern, uint64_t* work_budget) {
  if (pattern.size() > kMaxPatternBytes)
    throw Error("pattern: longer than " + std::to_string(kMaxPatternBytes) + " bytes");
  const Ast ast = Parser(pattern).parse();
  Nfa nfa;
  const Frag f = build(nfa, ast);

  auto dfa = std::make_shared<RegexDfa>();
  dfa->source_ = std::string(pattern);
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> sets;
  std::vector<uint32_t> mark(nfa.states.size(), 0);
  uint32_t epoch = 0;
  std::vector<int32_t> start{f.start};
  closure(nfa, start, mark, ++epoch);
  ids.emplace(start, 0);
  sets.push_back(start);
  std::vector<std::vector<int32_t>> buckets(256);
  uint64_t work = 0;
  auto spend = [&](uint64_t amount) {
    work += amount;
    if (work > kMaxCompileWork) throw Error("pattern: too complex (its automaton takes too long to build)");
    if (work_budget) {
      if (amount > *work_budget) throw Error("pattern: the schema's patterns together take too long to build");
      *work_budget -= amount;
    }
  };
  for (size_t d = 0; d < sets.size(); ++d) {
    const std::vector<int32_t> set = sets[d];
    spend(set.size());
    dfa->accepting_.push_back(std::binary_search(set.begin(), set.end(), f.end));
    dfa->table_.resize(sets.size() * 256 + 256, kDead);
    // The NFA states each byte leads to; runs of bytes with the same
    // targets (UTF-8 ranges) share one lookup.
    for (auto& bucket : buckets) bucket.clear();
    for (int32_t s : set) {
      spend(nfa.states[s].edges.size());
      for (const Nfa::Edge& e : nfa.states[s].edges) {
        spend(static_cast<uint64_t>(e.hi - e.lo + 1));
        for (int b = e.lo; b <= e.hi; ++b) buckets[b].push_back(e.to);
      }
    }
    int32_t previous = kDead;
    for (int b = 0; b < 256; ++b) {
      std::vector<int32_t>& next = buckets[b];
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
      if (b > 0 && next == buckets[b - 1]) {
        dfa->table_[d * 256 + static_cast<size_t>(b)] = previous;
        continue;
      }
      previous = kDead;
      if (next.empty()) continue;
      std::vector<int32_t> closed = next;
      spend(next.size());
      closure(nfa, closed, mark, ++epoch);
      spend(closed.size() * 8);  // the closure, its sort and the lookup's comparisons
      auto [it, added] = ids.emplace(closed, static_cast<int32_t>(sets.size()));
      if (added) {
        if (sets.size() >= kMaxStates)
          throw Error("pattern: too complex (its automaton exceeds " + std::to_string(kMaxStates) + " states)");
        sets.push_back(std::move(closed));
      }
      previous = it->second;
      dfa->table_[d * 256 + static_cast<size_t>(b)] = previous;
    }
  }
  dfa->table_.resize(sets.size() * 256);
  dfa->finish();
  return dfa;
}

std::shared_ptr<const RegexDfa> RegexDfa::intersect(const RegexDfa& a, const RegexDfa& b, uint64_t* work_budget) {
  auto dfa = std::make_shared<RegexDfa>();
  dfa->source_ = "(" + a.source_ + ")&(" + b.source_ + ")";
  if (a.empty() || b.empty()) return dfa;
  std::map<std::pair<int32_t, int32_t>, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs{{0, 0}};
  ids.emplace(pairs[0], 0);
  for (size_t d = 0; d < pairs.size(); ++d) {
    if (work_budget) {
      if (*work_budget < 256) throw Error("pattern: the schema's patterns together take too long to build");
      *work_budget -= 256;
    }
    const auto [sa, sb] = pairs[d];
    dfa->accepting_.push_back(a.accepting(sa) && b.accepting(sb));
    dfa->table_.resize(pairs.size() * 256 + 256, kDead);
    for (int c = 0; c < 256; ++c) {
      const int32_t na = a.next(sa, static_cast<uint8_t>(c)), nb = b.next(sb, static_cast<uint8_t>(c));
      if (na == kDead || nb == kDead) continue;
      auto [it, added] = ids.emplace(std::make_pair(na, nb), static_cast<int32_t>(pairs.size()));
      if (added) {
        if (pairs.size() >= kMaxStates) throw Error("pattern: too complex beside the format");
        pairs.push_back({na, nb});
      }
      dfa->table_[d * 256 + static_cast<size_t>(c)] = it->second;
    }
  }
  dfa->table_.resize(pairs.size() * 256);
  dfa->finish();
  return dfa;
}

void RegexDfa::finish() {
  const size_t n = accepting_.size();
  // Live: can reach acceptance.
  const std::vector<std::vector<Arc>> preds = distinct_arcs(table_, n).in;
  std::vector<bool> live(n, false);
  std::vector<int32_t> work;
  for (size_t s = 0; s < n; ++s)
    if (accepting_[s]) {
      live[s] = true;
      work.push_back(static_cast<int32_t>(s));
    }
  while (!work.empty()) {
    const int32_t t = work.back();
    work.pop_back();
    for (const Arc& a : preds[t])
      if (!live[a.to]) {
        live[a.to] = true;
        work.push_back(a.to);
      }
  }
  if (n == 0 || !live[0]) {  // no string matches
    table_.clear();
    accepting_.clear();
    min_chars_.clear();
    max_chars_.clear();
    return;
  }
  // Renumber the live states reachable from the start.
  std::vector<int32_t> id(n, kDead);
  std::vector<int32_t> order{0};
  id[0] = 0;
  for (size_t k = 0; k < order.size(); ++k)
    for (int b = 0; b < 256; ++b) {
      const int32_t t = table_[static_cast<size_t>(order[k]) * 256 + static_cast<size_t>(b)];
      if (t != kDead && live[t] && id[t] == kDead) {
        id[t] = static_cast<int32_t>(order.size());
        order.push_back(t);
      }
    }
  std::vector<int32_t> table(order.size() * 256, kDead);
  std::vector<bool> accepting(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    accepting[k] = accepting_[order[k]];
    for (int b = 0; b < 256; ++b) {
      const int32_t t = table_[static_cast<size_t>(order[k]) * 256 + static_cast<size_t>(b)];
      if (t != kDead && live[t]) table[k * 256 + static_cast<size_t>(b)] = id[t];
    }
  }
  table_ = std::move(table);
  accepting_ = std::move(accepting);
  const size_t m = accepting_.size();

  const Arcs all = distinct_arcs(table_, m);
  const std::vector<std::vector<Arc>>& arcs = all.out;
  const std::vector<std::vector<Arc>>& back = all.in;
  // Fewest code points to acceptance: 0-1 BFS from the accepting states.
  min_chars_.assign(m, kUnbounded);
  std::deque<int32_t> queue;
  for (size_t s = 0; s < m; ++s)
    if (accepting_[s]) {
      min_chars_[s] = 0;
      queue.push_back(static_cast<int32_t>(s));
    }
  while (!queue.empty()) {
    const int32_t t = queue.front();
    queue.pop_front();
    for (const Arc& a : back[t])
      if (min_chars_[t] + a.cost < min_chars_[a.to]) {
        min_chars_[a.to] = min_chars_[t] + a.cost;
        if (a.cost == 0) queue.push_front(a.to);
        else queue.push_back(a.to);
      }
  }
  // Most: states whose successors are all settled are settled (a state on
  // or before a loop never is: unbounded).
  max_chars_.assign(m, kUnbounded);
  std::vector<int32_t> remaining(m, 0);
  for (size_t s = 0; s < m; ++s) {
    std::vector<int32_t> targets;
    for (const Arc& a : arcs[s]) targets.push_back(a.to);
    std::sort(targets.begin(), targets.end());
    remaining[s] = static_cast<int32_t>(std::unique(targets.begin(), targets.end()) - targets.begin());
  }
  std::vector<std::vector<int32_t>> distinct_preds(m);
  for (size_t t = 0; t < m; ++t) {
    std::vector<int32_t> ps;
    for (const Arc& a : back[t]) ps.push_back(a.to);
    std::sort(ps.begin(), ps.end());
    ps.erase(std::unique(ps.begin(), ps.end()), ps.end());
    distinct_preds[t] = std::move(ps);
  }
  for (size_t s = 0; s < m; ++s)
    if (remaining[s] == 0) work.push_back(static_cast<int32_t>(s));
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    int32_t best = accepting_[s] ? 0 : -1;
    for (const Arc& a : arcs[s]) best = std::max(best, a.cost + max_chars_[a.to]);
    max_chars_[s] = best;
    for (int32_t p : distinct_preds[s])
      if (--remaining[p] == 0) work.push_back(p);
  }
}

bool RegexDfa::matches(std::string_view utf8) const {
  if (empty()) return false;
  int32_t s = start();
  for (char c : utf8) {
    s = next(s, static_cast<uint8_t>(c));
    if (s == kDead) return false;
  }
  return accepting(s);
}

std::vector<std::vector<uint64_t>> RegexDfa::lengths_up_to(int32_t cap) const {
  // Layer k: the states that reach acceptance with exactly k code points.
  // Layer 0 is the accepting states and those reaching them by
  // continuation bytes alone (which add no code point); layer k + 1 the
  // states with a character-start byte into layer k, and those reaching
  // them by continuation bytes. O(cap x transitions).
  const size_t m = accepting_.size();
  const size_t words = static_cast<size_t>(cap) / 64 + 1;
  std::vector<std::vector<uint64_t>> reach(m, std::vector<uint64_t>(words, 0));
  const std::vector<std::vector<Arc>> back = distinct_arcs(table_, m).in;
  std::vector<uint8_t> in_layer(m, 0), next(m, 0);
  std::vector<int32_t> members, work;
  auto close_over_continuations = [&](std::vector<uint8_t>& layer) {
    work.clear();
    for (size_t s = 0; s < m; ++s)
      if (layer[s]) work.push_back(static_cast<int32_t>(s));
    while (!work.empty()) {
      const int32_t t = work.back();
      work.pop_back();
      for (const Arc& a : back[t])
        if (a.cost == 0 && !layer[a.to]) {
          layer[a.to] = 1;
          work.push_back(a.to);
        }
    }
  };
  for (size_t s = 0; s < m; ++s) in_layer[s] = accepting_[s] ? 1 : 0;
  close_over_continuations(in_layer);
  for (int32_t k = 0; k <= cap; ++k) {
    bool any = false;
    std::fill(next.begin(), next.end(), 0);
    for (size_t s = 0; s < m; ++s) {
      if (!in_layer[s]) continue;
      any = true;
      reach[s][static_cast<size_t>(k) / 64] |= uint64_t{1} << (k % 64);
      for (const Arc& a : back[s])
        if (a.cost == 1) next[a.to] = 1;
    }
    if (!any) break;
    close_over_continuations(next);
    std::swap(in_layer, next);
  }
  return reach;
}

}  // namespace reprise
