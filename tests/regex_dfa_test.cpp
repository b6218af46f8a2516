// RegexDfa: random patterns and strings against std::regex (ECMAScript),
// UTF-8 classes, distances to acceptance, intersections, what is refused,
// and the enforced string formats.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "grammar/regex_dfa.h"
#include "grammar/string_formats.h"
#include "util/error.h"

using namespace reprise;

namespace {

// A random pattern over the letters a-c: literals, classes, groups,
// alternation and every quantifier form.
std::string random_pattern(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::string out;
  const int items = 1 + pick(3);
  for (int i = 0; i < items; ++i) {
    std::string atom;
    const int kind = depth > 0 ? pick(7) : pick(5);
    switch (kind) {
      case 0: atom = std::string(1, static_cast<char>('a' + pick(3))); break;
      case 1: atom = std::vector<std::string>{"[ab]", "[^a]", "[a-c]", "[^bc]", "\\w", "\\d", "."}[pick(7)]; break;
      case 2: atom = "b"; break;
      case 3: atom = "[c-c]"; break;
      case 4: atom = "(?:a|bc)"; break;
      default: atom = "(" + random_pattern(rng, depth - 1) + (pick(2) ? "|" + random_pattern(rng, depth - 1) : "") + ")";
    }
    static const std::vector<std::string> quantifiers = {"", "", "?", "{2}", "{1,3}", "{2,2}", "*", "+", "{0,}", "*?"};
    // Groups repeat a bounded number of times: std::regex backtracks
    // exponentially through nested unbounded repeats.
    const int choices = kind >= 5 ? 6 : static_cast<int>(quantifiers.size());
    out += atom + quantifiers[pick(choices)];
  }
  return out;
}

std::string random_text(std::mt19937& rng) {
  std::string s;
  const int n = static_cast<int>(rng() % 7);
  for (int i = 0; i < n; ++i) s += "abcd1"[rng() % 5];
  return s;
}

}  // namespace

TEST(RegexDfa, RandomPatternsMatchWhatStdRegexMatches) {
  std::mt19937 rng(20261128);
  int compared = 0, matched = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    // One or two top-level alternatives, each anchored at either end or not.
    std::string pattern;
    for (int branch = 0, branches = 1 + static_cast<int>(rng() % 2); branch < branches; ++branch) {
      const std::string body = random_pattern(rng, trial % 3 == 0 ? 2 : 1);
      const unsigned anchoring = rng() % 4;
      pattern += std::string(branch ? "|" : "") + (anchoring & 1 ? "^" : "") + body + (anchoring & 2 ? "$" : "");
    }
    std::shared_ptr<const RegexDfa> dfa;
    try {
      dfa = RegexDfa::compile(pattern);
    } catch (const Error& e) {
      // Only a pattern too complex may be refused here.
      EXPECT_NE(std::string(e.what()).find("too complex"), std::string::npos) << pattern << ": " << e.what();
      continue;
    }
    const std::regex re(pattern, std::regex::ECMAScript);
    for (int k = 0; k < 30; ++k) {
      const std::string text = random_text(rng);
      const bool want = std::regex_search(text, re);
      ASSERT_EQ(dfa->matches(text), want) << "pattern " << pattern << " text '" << text << "'";
      ++compared;
      matched += want;
    }
  }
  EXPECT_GT(matched, compared / 10);
  EXPECT_LT(matched, compared * 9 / 10);
}

TEST(RegexDfa, CodePointsNotBytes) {
  auto dfa = RegexDfa::compile("^.$");
  EXPECT_TRUE(dfa->matches("a"));
  EXPECT_TRUE(dfa->matches("\xC3\xA9"));          // é
  EXPECT_TRUE(dfa->matches("\xE2\x82\xAC"));      // €
  EXPECT_TRUE(dfa->matches("\xF0\x9F\x98\x80"));  // U+1F600
  EXPECT_FALSE(dfa->matches("ab"));
  EXPECT_FALSE(dfa->matches("\n"));
  EXPECT_FALSE(dfa->matches(""));
  auto range = RegexDfa::compile("^[\xC3\xA0-\xC3\xBF\\u0100]+$");  // à-ÿ, Ā
  EXPECT_TRUE(range->matches("\xC3\xA9\xC3\xA0\xC4\x80"));
  EXPECT_FALSE(range->matches("e"));
  auto negated = RegexDfa::compile("^[^a]{2}$");
  EXPECT_TRUE(negated->matches("\xE2\x82\xAC" "b"));
  EXPECT_FALSE(negated->matches("ab"));
  auto escapes = RegexDfa::compile("^\\u00e9\\x41\\u{1F600}\\uD83D\\uDE00\\t\\/\\.$");
  EXPECT_TRUE(escapes->matches("\xC3\xA9" "A" "\xF0\x9F\x98\x80\xF0\x9F\x98\x80\t/."));
  // A whole range across the UTF-8 lengths, surrogates left out.
  auto wide = RegexDfa::compile("^[\\u0070-\\u{10FFFF}]$");
  for (const char* s : {"p", "\xDF\xBF", "\xE0\xA0\x80", "\xED\x9F\xBF", "\xEE\x80\x80", "\xF4\x8F\xBF\xBF"})
    EXPECT_TRUE(wide->matches(s)) << s;
  EXPECT_FALSE(wide->matches("o"));
  EXPECT_FALSE(wide->matches("\xED\xA0\x80"));  // a surrogate's bytes
}

TEST(RegexDfa, DistancesToAcceptance) {
  auto counted = RegexDfa::compile("^a{2,5}$");
  EXPECT_EQ(counted->min_chars(counted->start()), 2);
  EXPECT_EQ(counted->max_chars(counted->start()), 5);
  auto open = RegexDfa::compile("^\xC3\xA9+$");
  EXPECT_EQ(open->min_chars(open->start()), 1);  // code points, not bytes
  EXPECT_EQ(open->max_chars(open->start()), RegexDfa::kUnbounded);
  // Lengths with a gap: 1 or 4.
  auto gap = RegexDfa::compile("^(a|aaaa)$");
  const auto lengths = gap->lengths_up_to(6);
  EXPECT_EQ(lengths[gap->start()][0], (uint64_t{1} << 1) | (uint64_t{1} << 4));
  // Intersections.
  auto both = RegexDfa::intersect(*RegexDfa::compile("^[a-c]+$"), *RegexDfa::compile("^..$"));
  EXPECT_TRUE(both->matches("ab"));
  EXPECT_FALSE(both->matches("abc"));
  EXPECT_FALSE(both->matches("ad"));
  EXPECT_TRUE(RegexDfa::intersect(*RegexDfa::compile("^a+$"), *RegexDfa::compile("^b+$"))->empty());
}

TEST(RegexDfa, RefusesWhatItDoesNotSupport) {
  for (const char* p : {"(?=a)", "(?!a)b", "(?<=a)b", "(a)\\1", "\\k<x>", "\\bword", "\\p{L}", "a**", "+a", "(a",
                        "a)", "[b-a]", "a^b", "a$b", "(^a)", "(a$)", "\\q", "a{3,2}", "x{1001}", "[a-\\d]", "\\",
                        "\\cA", "[a"}) {
    EXPECT_THROW(RegexDfa::compile(p), Error) << p;
  }
  EXPECT_THROW(RegexDfa::compile(std::string(RegexDfa::kMaxPatternBytes + 1, 'a')), Error);
  EXPECT_TRUE(RegexDfa::compile("^[^\\s\\S]$")->empty());  // nothing matches
  EXPECT_FALSE(RegexDfa::compile("^[^\\s\\S]$")->matches(""));
  // Anchors belong to their top-level alternative.
  auto either = RegexDfa::compile("^a|b$");
  EXPECT_TRUE(either->matches("abc"));
  EXPECT_TRUE(either->matches("xyb"));
  EXPECT_FALSE(either->matches("xa"));
  // A budget shared by several compiles refuses the set once spent.
  uint64_t budget = 2000;
  EXPECT_NO_THROW(RegexDfa::compile("^ab$", &budget));
  EXPECT_LT(budget, 2000u);
  EXPECT_THROW(RegexDfa::compile("^[a-z]{1,40}@[a-z]{1,40}$", &budget), Error);
  // A pattern whose automaton is too large is refused, not built.
  EXPECT_THROW(RegexDfa::compile("a.{14}b"), Error);
  // Web-compatible literals: a brace that is no quantifier.
  EXPECT_TRUE(RegexDfa::compile("^a{,2}$")->matches("a{,2}"));
  EXPECT_TRUE(RegexDfa::compile("^(?<year>\\d{4})$")->matches("2026"));
  EXPECT_TRUE(RegexDfa::compile("^[\\d-z]+$")->matches("1-z"));  // a class escape, then '-' as itself
}

TEST(StringFormats, EnforcedFormatsTakeWhatClientsParse) {
  struct Case {
    const char* format;
    std::vector<const char*> good, bad;
  };
  const std::vector<Case> cases = {
      {"date", {"2026-11-28", "1999-02-28", "2000-04-30"}, {"2026-02-30", "2026-13-01", "2026-4-01", "0999-01-01", "2026-04-31"}},
      {"time", {"12:30:00Z", "23:59:59.123456+05:30", "00:00:00-00:00"}, {"24:00:00Z", "12:30:00", "12:60:00Z", "12:30:00.1234567Z"}},
      {"date-time", {"2026-11-28T14:00:00Z", "2026-01-31T00:00:00.5+01:00"}, {"2026-11-28 14:00:00Z", "2026-11-28T14:00Z"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000", "123E4567-E89B-12D3-A456-426614174000"}},
      {"email", {"a@b.io", "first.last+tag@mail.example.com"},
       {"a@b", "@b.io", "a..b@c.io", "a@-b.io", "a b@c.io", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa@b.io"}},
      {"hostname", {"example.com", "a", "x-1.y"}, {"-a.com", "a-.com", "a..b", "a_b.com", "a.123", "1"}},
      {"ipv4", {"192.168.0.1", "0.0.0.0", "255.255.255.255"}, {"256.1.1.1", "01.2.3.4", "1.2.3"}},
      {"uri", {"https://example.com/a/b?x=1", "http://localhost:8080"},
       {"ftp://x.io", "https://", "https://a.io/a b", "https://L.1", "http://a.123"}},
  };
  for (const Case& c : cases) {
    const char* pattern = string_format_pattern(c.format);
    ASSERT_NE(pattern, nullptr) << c.format;
    auto dfa = RegexDfa::compile(pattern);
    const std::regex re(pattern, std::regex::ECMAScript);
    for (const char* s : c.good) {
      EXPECT_TRUE(dfa->matches(s)) << c.format << " " << s;
      EXPECT_TRUE(std::regex_search(s, re)) << c.format << " " << s;
    }
    for (const char* s : c.bad) {
      EXPECT_FALSE(dfa->matches(s)) << c.format << " " << s;
      EXPECT_FALSE(std::regex_search(s, re)) << c.format << " " << s;
    }
  }
  EXPECT_EQ(string_format_pattern("ipv6"), nullptr);  // not enforced: an annotation
}
