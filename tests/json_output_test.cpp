// Structured output: the schema compiler, the byte-level JSON matcher and
// the token-level constraint.
//
// Randomized properties, over random schemas:
// * soundness: every document the matcher accepts whole parses (nlohmann)
//   and validates against the schema, including documents produced by a
//   random walk over the matcher's own allowed bytes and mutants of valid
//   documents;
// * no dead ends: every prefix the walk reaches has an allowed byte or is a
//   whole document, and a steered walk always finishes;
// * completeness: random documents that satisfy the schema, written in the
//   documented style, are accepted whole;
// * the trie walk with remembered string states allows exactly the tokens
//   that trying every token on its own allows.
#include <gtest/gtest.h>

#include <chrono>

#include <nlohmann/json.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include <xxhash.h>

#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "grammar/json_constraint.h"
#include "grammar/json_matcher.h"
#include "grammar/json_schema.h"
#include "model_fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

using namespace reprise;
using nlohmann::json;

namespace {

std::shared_ptr<const JsonSchema> compile(const std::string& text) { return JsonSchema::compile(json::parse(text)); }

bool accepts_whole(const std::shared_ptr<const JsonSchema>& schema, const std::string& doc) {
  JsonMatcher m(schema);
  return m.advance(doc) && m.can_end();
}

// Whether every byte of `doc` is accepted (a prefix of some document).
bool accepts_prefix(const std::shared_ptr<const JsonSchema>& schema, const std::string& doc) {
  JsonMatcher m(schema);
  return m.advance(doc);
}

// ---- random schemas --------------------------------------------------------

const std::vector<std::string> kNames = {"a", "ab", "abc", "b", "name", "names", "id", "x_y", "\xC3\xA9t\xC3\xA9", "n"};

json random_scalar_value(std::mt19937& rng) {
  switch (rng() % 6) {
    case 0: return json(nullptr);
    case 1: return json(rng() % 2 == 0);
    case 2: return json(static_cast<int>(rng() % 2000) - 1000);
    case 3: return json(static_cast<double>(static_cast<int>(rng() % 4000) - 2000) / 8.0);
    case 4: return json(kNames[rng() % kNames.size()]);
    default: return json::array({static_cast<int>(rng() % 3), "v"});
  }
}

json random_schema(std::mt19937& rng, int depth) {
  const int kind = static_cast<int>(rng() % (depth <= 0 ? 7 : 12));
  switch (kind) {
    case 0: return {{"type", "string"}};
    case 1: {
      json s = {{"type", "string"}};
      const int lo = static_cast<int>(rng() % 3);
      s["minLength"] = lo;
      if (rng() % 2) s["maxLength"] = lo + static_cast<int>(rng() % (rng() % 3 ? 4 : 40));
      if (rng() % 2) {
        // Patterns and enforced formats (a few with nothing in their lengths).
        static const std::vector<json> patterns = {
            {{"pattern", "^[a-c]+$"}}, {{"pattern", "^(ab|c)*d$"}}, {{"pattern", "x"}},
            {{"pattern", "^\\d{2,4}$"}}, {{"pattern", "^[a-z]{1,3}(-[a-z]{1,3})*$"}}, {{"pattern", "\u00e9"}},
            {{"pattern", "^.$"}}, {{"pattern", "^(a|aaaa)$"}}, {{"pattern", "^[^\"\\\\]*\\n$"}},
            {{"pattern", "^\\s?[\u20ac-\u20ad]\\/$"}}, {{"pattern", "^(?:\"|\\\\)+$"}},
            {{"format", "date"}}, {{"format", "uuid"}}, {{"format", "email"}}, {{"format", "date-time"}},
            {{"format", "ipv4"}}, {{"pattern", "^\\w+$"}, {"format", "hostname"}}};
        s.update(patterns[rng() % patterns.size()]);
      }
      return s;
    }
    case 2: {
      json s = {{"type", rng() % 2 ? "integer" : "number"}};
      // Bounds, sometimes exclusive, sometimes a single point or fractional.
      const double lo = static_cast<double>(static_cast<int>(rng() % 400) - 200) / (rng() % 2 ? 1 : 4);
      switch (rng() % 5) {
        case 0: s["minimum"] = lo; break;
        case 1: s["maximum"] = lo; break;
        case 2: s["minimum"] = lo, s["maximum"] = lo + static_cast<double>(rng() % 50) / (rng() % 2 ? 1 : 8); break;
        case 3: s["exclusiveMinimum"] = lo, s["exclusiveMaximum"] = lo + 1 + static_cast<double>(rng() % 30); break;
        default: break;
      }
      return s;
    }
    case 3: return {{"type", "boolean"}};
    case 4: return {{"type", "null"}};
    case 5: {
      json values = json::array();
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) values.push_back(random_scalar_value(rng));
      return {{"enum", values}};
    }
    case 6: return json::object();  // anything
    case 7:
    case 8: {
      json s = {{"type", "object"}};
      json props = json::object();
      json required = json::array();
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) {
        const std::string& name = kNames[rng() % kNames.size()];
        props[name] = random_schema(rng, depth - 1);
        if (rng() % 2) required.push_back(name);
      }
      s["properties"] = props;
      if (!required.empty()) {
        std::sort(required.begin(), required.end());
        required.erase(std::unique(required.begin(), required.end()), required.end());
        s["required"] = required;
      }
      switch (rng() % 4) {
        case 0: break;
        case 1: s["additionalProperties"] = true; break;
        case 2: s["additionalProperties"] = false; break;
        default: s["additionalProperties"] = random_schema(rng, depth - 1); break;
      }
      return s;
    }
    case 9: {
      json s = {{"type", "array"}};
      if (rng() % 3 == 0) {
        s["prefixItems"] = json::array({random_schema(rng, depth - 1), random_schema(rng, depth - 1)});
        if (rng() % 2) s["items"] = false;
      }
      if (rng() % 4) s["items"] = random_schema(rng, depth - 1);
      if (rng() % 2) s["minItems"] = static_cast<int>(rng() % 3);
      if (rng() % 2) s["maxItems"] = 1 + static_cast<int>(rng() % 3);
      return s;
    }
    case 10: return {{"anyOf", json::array({random_schema(rng, depth - 1), random_schema(rng, depth - 1)})}};
    default: {
      json s = random_schema(rng, depth - 1);
      if (s.contains("type") && s["type"].is_string()) s["type"] = json::array({s["type"], "null"});
      return s;
    }
  }
}

// A schema that compiles (random ones may be unsatisfiable: drawn again).
std::shared_ptr<const JsonSchema> random_compiled(std::mt19937& rng, json& source) {
  for (;;) {
    source = random_schema(rng, 3);
    if (rng() % 5 == 0) {  // a recursive tree through $defs
      source = {{"$defs", {{"node", {{"type", "object"},
                                     {"properties", {{"v", random_schema(rng, 1)},
                                                     {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}},
                                     {"required", json::array({"v"})}}}}},
                {"$ref", "#/$defs/node"}};
    }
    try {
      return JsonSchema::compile(source);
    } catch (const Error&) {
      // unsatisfiable (e.g. maxItems below minItems) or an empty enum after filtering
    }
  }
}

// ---- random valid documents, in the matcher's style ------------------------

std::string whitespace(std::mt19937& rng) {
  switch (rng() % 6) {
    case 0: return " ";
    case 1: return "\n" + std::string(rng() % 5, ' ');
    case 2: return "\n\t";
    default: return "";
  }
}

std::string random_string_content(std::mt19937& rng, int64_t min_len, int64_t max_len) {
  const int64_t hi = max_len >= 0 ? max_len : min_len + 6;
  const int64_t len = min_len + static_cast<int64_t>(rng() % (hi - min_len + 1));
  static const std::vector<std::string> chars = {"a", "Z", " ", "\\n", "\\\"", "\\\\", "\\u00e9", "\\uD7FF",
                                                 "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "/", "\\/", "{"};
  std::string s;
  for (int64_t i = 0; i < len; ++i) s += chars[rng() % chars.size()];
  return s;
}

// A document for `node`, or nullopt when the draw failed (a union's pick or a
// depth limit); callers retry.
// A JSON string a patterned node allows, found by a random walk over its
// automaton (the automaton itself is checked against std::regex in
// regex_dfa_test.cpp), escaped as JSON.
std::optional<std::string> random_pattern_string(const JsonSchema& schema, const SchemaNode& n, std::mt19937& rng) {
  const RegexDfa& dfa = *schema.pattern(n.pattern).dfa;
  int32_t state = dfa.start();
  int64_t count = 0;
  int left = 0;  // continuation bytes still to come
  std::string text;
  for (int step = 0; step < 200; ++step) {
    if (left == 0 && dfa.accepting(state) && count >= n.min_length && (rng() % 4 == 0 || step > 120)) break;
    std::vector<int> options;
    for (int b = 0; b < 256; ++b) {
      const bool continuation = (b & 0xC0) == 0x80;
      if (continuation != (left > 0)) continue;
      const int32_t next = dfa.next(state, static_cast<uint8_t>(b));
      if (next != RegexDfa::kDead && schema.pattern_can_finish(n, next, count + 1)) options.push_back(b);
    }
    if (options.empty()) return std::nullopt;
    const int b = options[rng() % options.size()];
    state = dfa.next(state, static_cast<uint8_t>(b));
    if (left > 0) --left;
    else left = b < 0x80 ? 0 : b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
    if (left == 0) ++count;
    text += static_cast<char>(b);
  }
  if (left != 0 || !dfa.accepting(state) || count < n.min_length) return std::nullopt;
  return json(text).dump();
}

std::optional<std::string> random_document(const JsonSchema& schema, int32_t id, std::mt19937& rng, int depth) {
  const SchemaNode& n = schema.node(id);
  if (!n.satisfiable || depth > 8) return std::nullopt;
  if (!n.any_of.empty()) return random_document(schema, n.any_of[rng() % n.any_of.size()], rng, depth + 1);
  if (n.literal_set >= 0) {
    const auto& lits = schema.literals(n.literal_set);
    return lits[rng() % lits.size()];
  }
  std::vector<uint8_t> types;
  for (uint8_t bit = 1; bit < 128; bit <<= 1)
    if (n.types & bit) types.push_back(bit);
  const uint8_t type = types[rng() % types.size()];
  switch (type) {
    case kJsonNull: return "null";
    case kJsonBoolean: return rng() % 2 ? "true" : "false";
    case kJsonInteger:
    case kJsonNumber: {
      if (n.has_bounds()) {  // a value inside, written without an exponent
        const double lo = std::max(n.minimum, -1000.0), hi = std::min(n.maximum, 1000.0);
        for (int attempt = 0; attempt < 50; ++attempt) {
          const double t = lo + (hi - lo) * static_cast<double>(rng() % 1001) / 1000.0;
          const bool integer = type == kJsonInteger || rng() % 2;
          const double v = integer ? std::round(t) : std::round(t * 100) / 100;
          if (!n.in_bounds(v) || (type == kJsonInteger && v != std::floor(v))) continue;
          char buf[64];
          std::snprintf(buf, sizeof buf, integer ? "%.0f" : "%.2f", v);
          return std::string(buf);
        }
        return std::nullopt;
      }
      if (type == kJsonInteger) return std::to_string(static_cast<int>(rng() % 100000) - 50000);
      static const std::vector<std::string> numbers = {"0", "-0", "1.5", "-2.25e3", "7E+2", "0.001", "123456", "9e-3"};
      return numbers[rng() % numbers.size()];
    }
    case kJsonString:
      if (n.max_length >= 0 && n.min_length > n.max_length) return std::nullopt;
      if (n.pattern >= 0) return random_pattern_string(schema, n, rng);
      return "\"" + random_string_content(rng, n.min_length, n.max_length) + "\"";
    case kJsonArray: {
      const int64_t hi = n.max_items >= 0 ? n.max_items : n.min_items + 3;
      if (hi < n.min_items) return std::nullopt;
      int64_t count = n.min_items + static_cast<int64_t>(rng() % (hi - n.min_items + 1));
      std::string out = "[" + whitespace(rng);
      for (int64_t i = 0; i < count; ++i) {
        const int32_t item = n.item_node(i);
        if (item < 0) return std::nullopt;
        auto v = random_document(schema, item, rng, depth + 1);
        if (!v) return std::nullopt;
        if (i > 0) out += "," + whitespace(rng);
        out += *v + whitespace(rng);
      }
      return out + "]";
    }
    default: {  // object
      std::vector<std::pair<std::string, int32_t>> members;
      for (size_t i = 0; i < n.property_names.size(); ++i)
        if ((n.required >> i & 1) || rng() % 2) members.push_back({n.property_names[i], n.property_nodes[i]});
      if (n.additional >= 0 && rng() % 2) {
        const std::string key = "extra_" + std::to_string(rng() % 1000);
        members.push_back({key, n.additional});
      }
      std::shuffle(members.begin(), members.end(), rng);
      std::string out = "{" + whitespace(rng);
      for (size_t i = 0; i < members.size(); ++i) {
        auto v = random_document(schema, members[i].second, rng, depth + 1);
        if (!v) return std::nullopt;
        if (i > 0) out += "," + whitespace(rng);
        out += "\"" + members[i].first + "\"" + whitespace(rng) + ":" + whitespace(rng) + *v + whitespace(rng);
      }
      return out + "}";
    }
  }
}

// Random walk over the bytes the matcher allows; after `budget` bytes it is
// steered towards closing. Returns the document, or fails the test.
std::string walk(const std::shared_ptr<const JsonSchema>& schema, std::mt19937& rng, int budget) {
  JsonMatcher m(schema);
  std::string doc;
  const std::string closing_first = "]}\":0ntfa1,";
  for (int step = 0; step < 20000; ++step) {
    std::vector<uint8_t> allowed;
    for (int c = 0; c < 256; ++c) {
      JsonMatcher probe = m;
      if (probe.advance(std::string(1, static_cast<char>(c)))) allowed.push_back(static_cast<uint8_t>(c));
    }
    const bool can_end = m.can_end();
    EXPECT_TRUE(can_end || !allowed.empty()) << "dead end after " << json(doc).dump();
    if (allowed.empty() || (can_end && (step >= budget || rng() % 8 == 0))) return doc;
    uint8_t c = allowed[rng() % allowed.size()];
    auto is_allowed = [&](uint8_t b) { return std::find(allowed.begin(), allowed.end(), b) != allowed.end(); };
    const JsonFrame& top = m.stacks().front().back();
    bool steered = false;
    if (step >= budget && top.kind == JsonFrame::Object && top.phase == 1 /* a key */) {
      // Spell the first declared key still possible; the byte priorities
      // below would write new other keys forever.
      const SchemaNode& n = schema->node(top.node);
      for (int32_t i = top.lo; i < top.hi && !steered; ++i) {
        if ((top.seen >> i & 1) || !schema->node(n.property_nodes[i]).satisfiable) continue;
        const std::string& name = n.property_names[i];
        const uint8_t want = top.pos == static_cast<int32_t>(name.size()) ? '"' : static_cast<uint8_t>(name[top.pos]);
        if (is_allowed(want)) c = want, steered = true;
      }
    }
    const bool in_text = top.kind == JsonFrame::String || (top.kind == JsonFrame::Object && top.phase == 1);
    if (step >= budget && !steered && in_text && is_allowed('"')) c = '"', steered = true;
    if (step >= budget && !steered && top.kind == JsonFrame::String && top.escape == 0 && top.utf8_left == 0 &&
        schema->node(top.node).pattern >= 0) {
      // Toward the pattern's nearest acceptance (or into an escape).
      const RegexDfa& dfa = *schema->pattern(schema->node(top.node).pattern).dfa;
      int32_t best = dfa.min_chars(top.pattern_state);
      for (uint8_t b : allowed) {
        const int32_t next = b == '\\' ? RegexDfa::kDead : dfa.next(top.pattern_state, b);
        if (next != RegexDfa::kDead && dfa.min_chars(next) < best) best = dfa.min_chars(next), c = b, steered = true;
      }
      if (!steered && is_allowed('\\')) c = '\\', steered = true;
    }
    if (step >= budget && !steered) {
      // Prefer bytes that close things, then any.
      for (char want : closing_first)
        if (is_allowed(static_cast<uint8_t>(want))) {
          c = static_cast<uint8_t>(want);
          break;
        }
    }
    EXPECT_TRUE(m.advance(std::string(1, static_cast<char>(c))));
    doc += static_cast<char>(c);
  }
  ADD_FAILURE() << "the steered walk did not finish: " << json(doc).dump();
  return doc;
}

void expect_valid(const JsonSchema& schema, const std::string& doc, const json& source) {
  json parsed;
  try {
    parsed = json::parse(doc);
  } catch (const json::exception& e) {
    ADD_FAILURE() << "accepted a document that does not parse: " << doc << "\nschema " << source.dump();
    return;
  }
  EXPECT_TRUE(schema.validates(parsed)) << "accepted " << doc << "\nagainst " << source.dump();
}

}  // namespace

TEST(JsonSchemaCompile, RefusesWhatItDoesNotEnforce) {
  for (const char* text : {R"({"type":"string","pattern":"(?=a)b"})", R"({"type":"string","pattern":"(a)\\1"})",
                           R"({"type":"string","pattern":"\\bword"})", R"({"type":"string","pattern":"[z-a]"})",
                           R"({"type":"string","pattern":"a^b"})", R"({"type":"string","pattern":"(a"})",
                           R"({"type":"string","pattern":"^a{10}$","maxLength":4611686018427387909})",
                           R"({"type":"string","pattern":"^a{10}$","maxLength":9223372036854775807})",
                           R"({"type":"string","pattern":"a","maxLength":16385})",
                           R"({"anyOf":[{"type":"string"}],"format":"uuid"})",
                           R"({"$ref":"#/$defs/s","format":"date","$defs":{"s":{"type":"string"}}})",
                           R"({"type":"string","pattern":7})", R"({"type":"integer","multipleOf":3})",
                           R"({"not":{}})", R"({"allOf":[{"type":"string"},{"minLength":2}]})",
                           R"({"$ref":"http://example.com/s.json"})", R"({"$ref":"#/$defs/missing"})",
                           R"({"type":"strin"})", R"({"type":"object","properties":{"a\"b":{}}})",
                           R"({"type":"object","required":["z"]})", R"({"enum":[]})",
                           R"({"type":"string","enum":[1,2]})", R"({"type":"array","minItems":3,"maxItems":2})",
                           R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})",
                           R"({"type":"object","properties":{"self":{"$ref":"#"}},"required":["self"]})", "3",
                           R"({"type":"string","nullable":"yes"})", R"({"$ref":"#abc"})", R"({"items":[{}]})",
                           R"({"type":"object","properties":{"a":{"type":"string","maxLength":-1}}})"}) {
    EXPECT_THROW(compile(text), Error) << text;
  }
  // A long chain of references is refused, not followed to a stack overflow.
  json chain = {{"$defs", json::object()}, {"$ref", "#/$defs/d0"}};
  for (int i = 0; i < 1000; ++i) chain["$defs"]["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  chain["$defs"]["d1000"] = {{"type", "string"}};
  EXPECT_THROW(JsonSchema::compile(chain), Error);
  try {
    compile(R"({"type":"object","properties":{"n":{"type":"number","multipleOf":2}}})");
    ADD_FAILURE() << "multipleOf was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multipleOf"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/properties/n"), std::string::npos) << e.what();
  }
}

TEST(JsonSchemaCompile, AnnotationsAndPydanticShapesCompile) {
  auto s = compile(R"({
    "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Person", "type": "object",
    "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}},
    "properties": {
      "name": {"type": "string", "description": "full name", "format": "email"},
      "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null},
      "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}},
      "best": {"allOf": [{"$ref": "#/$defs/Pet"}]}
    },
    "required": ["name", "pets"]})");
  EXPECT_TRUE(s->validates(json::parse(R"({"name":"x@a.io","pets":[{"kind":"cat"}],"age":null})")));
  EXPECT_FALSE(s->validates(json::parse(R"({"name":"x","pets":[{"kind":"cat"}],"age":null})")));  // an email
  EXPECT_FALSE(s->validates(json::parse(R"({"name":"x@a.io","pets":[{"kind":"cow"}]})")));
  EXPECT_FALSE(s->validates(json::parse(R"({"name":"x@a.io"})")));
  EXPECT_FALSE(s->validates(json::parse(R"({"name":"x@a.io","pets":[],"other":1})")));  // no other keys by default
}

TEST(JsonMatcher, AnyObject) {
  auto s = JsonSchema::any_object();
  EXPECT_TRUE(accepts_whole(s, R"({"a": [1, -2.5e3, "x\u00e9\n", true, null, {"b": {}}], "c":0})"));
  EXPECT_TRUE(accepts_whole(s, "{\n  \"k\": \"\xE2\x82\xAC\"\n}"));
  EXPECT_TRUE(accepts_whole(s, "{}"));
  for (const char* bad : {"[1]", " {}", "{} ", "{\"a\":01}", "{\"a\":\"\\ud800\"}", "{\"a\":1,}", "{\"a\" 1}",
                          "{\"a\":1}{", "{'a':1}", "{\"a\":tru}", "{\"a\":\"\x01\"}", "{\"a\":\"\xC0\xAF\"}",
                          "{\"a\":\"\xED\xA0\x80\"}", "{\"a\\u0062\":1}", "{\"a\":  1}", "{\"a\":\n\n1}",
                          "{\"a\":1.}", "{\"a\":.5}", "{\"a\":12345678901234567}", "{\"a\":NaN}"})
    EXPECT_FALSE(accepts_whole(s, bad)) << bad;
  EXPECT_TRUE(accepts_prefix(s, "{\"a\": 12"));
  EXPECT_FALSE(accepts_whole(s, "{\"a\": 12"));
}

TEST(JsonMatcher, PropertiesRequiredAndEnums) {
  auto s = compile(R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},
    "names":{"type":"array","items":{"type":"integer"},"maxItems":2},"color":{"enum":["red","green",7]}},
    "required":["name"]})");
  EXPECT_TRUE(accepts_whole(s, R"({"name":"abc"})"));
  EXPECT_TRUE(accepts_whole(s, R"({"names":[1,2],"name":"\u00e9","color":7})"));
  EXPECT_TRUE(accepts_whole(s, R"({"color":"green","name":""})"));
  for (const char* bad : {R"({})", R"({"name":"abcd"})", R"({"name":"a","name":"b"})", R"({"nam":"a"})",
                          R"({"name":"a","names":[1,2,3]})", R"({"name":"a","names":[1.5]})",
                          R"({"name":"a","color":"blue"})", R"({"name":"a","color":70})", R"({"name":"a","x":1})"})
    EXPECT_FALSE(accepts_whole(s, bad)) << bad;
  // Prefixes that cannot become a declared key are refused at once.
  EXPECT_FALSE(accepts_prefix(s, R"({"q)"));
  EXPECT_FALSE(accepts_prefix(s, R"({"name":"a","name")"));  // "name" is written already
  EXPECT_TRUE(accepts_prefix(s, R"({"name":"a","name)"));     // "names" is still possible
}

TEST(JsonMatcher, UnionsKeepEveryAlternativeUntilTheBytesDecide) {
  auto s = compile(R"({"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                                {"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}]})");
  EXPECT_TRUE(accepts_whole(s, R"({"a":1})"));
  EXPECT_TRUE(accepts_whole(s, R"({"a":"x"})"));
  EXPECT_FALSE(accepts_whole(s, R"({"a":true})"));
  JsonMatcher m(s);
  ASSERT_TRUE(m.advance(R"({"a":)"));
  EXPECT_EQ(m.stacks().size(), 2u);
  ASSERT_TRUE(m.advance("1"));
  EXPECT_EQ(m.stacks().size(), 1u);
}

TEST(JsonMatcher, RandomWalksAreValidAndNeverStuck) {
  std::mt19937 rng(20261128);
  for (int trial = 0; trial < 400; ++trial) {
    json source;
    auto schema = random_compiled(rng, source);
    const std::string doc = walk(schema, rng, static_cast<int>(rng() % 60));
    ASSERT_TRUE(accepts_whole(schema, doc)) << doc;
    expect_valid(*schema, doc, source);
    if (HasFailure()) break;
  }
}

TEST(JsonMatcher, ValidDocumentsAreAcceptedAndMutantsStaySound) {
  std::mt19937 rng(7);
  int accepted = 0;
  for (int trial = 0; trial < 600; ++trial) {
    json source;
    auto schema = random_compiled(rng, source);
    std::optional<std::string> doc;
    for (int attempt = 0; attempt < 20 && !doc; ++attempt) doc = random_document(*schema, schema->root(), rng, 0);
    if (!doc) continue;
    ASSERT_TRUE(accepts_whole(schema, *doc)) << *doc << "\nschema " << source.dump();
    expect_valid(*schema, *doc, source);
    ++accepted;
    // Mutants: whatever the matcher accepts whole must still be valid.
    for (int m = 0; m < 20; ++m) {
      std::string mutant = *doc;
      const size_t at = rng() % (mutant.size() + 1);
      static const std::string bytes = "{}[]\",:0123-.eE tfn\\u\xC3\xA9";
      switch (rng() % 3) {
        case 0: if (at < mutant.size()) mutant.erase(at, 1); break;
        case 1: mutant.insert(at, 1, bytes[rng() % bytes.size()]); break;
        default: if (at < mutant.size()) mutant[at] = bytes[rng() % bytes.size()]; break;
      }
      if (accepts_whole(schema, mutant)) expect_valid(*schema, mutant, source);
    }
    if (HasFailure()) break;
  }
  EXPECT_GT(accepted, 400);
}

namespace {

// A vocabulary of JSON-ish fragments, partial UTF-8 and single bytes.
std::vector<std::string> random_vocabulary(std::mt19937& rng) {
  std::vector<std::string> pieces;
  for (int c = 0; c < 256; ++c) pieces.push_back(std::string(1, static_cast<char>(c)));  // byte fallback
  static const std::vector<std::string> fragments = {
      "{\"", "\":", "\": ", "\",", "\", \"", "\"}", "\"]", "}]", "},", "\n", "\n  ", " \"", "true", "false", "null",
      "nul", "name", "names", "\"name\"", "id", "\\n", "\\\"", "\\u", "00e9", "d800", "12", "3.5", "e+", "-1",
      "\xC3", "\xA9", "\xC3\xA9", "\xE2\x82", "\xAC\"", "abc", "ab", " a", "\"a", "a\"", ",\"", "[1", "]}", "\"\"",
      "\"red\"", "red", "7", "x_y", "extra", "\":{\"", "\":[", "\t", "  ", ""};
  for (const auto& f : fragments) pieces.push_back(f);
  for (int i = 0; i < 200; ++i) {
    std::string p;
    const int len = 1 + static_cast<int>(rng() % 5);
    for (int j = 0; j < len; ++j) p += fragments[rng() % fragments.size()];
    pieces.push_back(p);
  }
  return pieces;
}

}  // namespace

TEST(JsonConstraint, TrieWalkAllowsExactlyWhatEachTokenAloneAllows) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 120; ++trial) {
    json source;
    auto schema = trial % 6 == 0 ? JsonSchema::any_object() : random_compiled(rng, source);
    auto vocabulary = std::make_shared<JsonVocabulary>(random_vocabulary(rng));
    JsonConstraint constraint(schema, vocabulary);
    std::vector<uint8_t> fast, slow;
    for (int step = 0; step < 80; ++step) {
      bool may_end_fast = false, may_end_slow = false;
      constraint.allowed_tokens(fast, may_end_fast);
      constraint.allowed_tokens_one_by_one(slow, may_end_slow);
      ASSERT_EQ(may_end_fast, may_end_slow);
      for (size_t id = 0; id < slow.size(); ++id)
        ASSERT_EQ(fast[id], slow[id]) << "token " << json(vocabulary->trie().piece(id)).dump() << " trial " << trial
                                      << " step " << step;
      std::vector<int32_t> ids;
      for (size_t id = 0; id < fast.size(); ++id)
        if (fast[id]) ids.push_back(static_cast<int32_t>(id));
      ASSERT_TRUE(may_end_fast || !ids.empty()) << "dead end";
      if (ids.empty() || (may_end_fast && rng() % 4 == 0)) break;
      ASSERT_TRUE(constraint.accept(ids[rng() % ids.size()]));
    }
  }
}

TEST(JsonConstraint, RefusesTokensItDoesNotAllow) {
  auto vocabulary = std::make_shared<JsonVocabulary>(std::vector<std::string>{"{", "}", "\"", "a", "", "]"});
  JsonConstraint c(JsonSchema::any_object(), vocabulary);
  EXPECT_FALSE(c.accept(5));  // "]" cannot start an object
  EXPECT_FALSE(c.accept(4));  // an empty (control) token
  EXPECT_TRUE(c.accept(0));
  EXPECT_TRUE(c.accept(1));
  bool may_end = false;
  std::vector<uint8_t> allowed;
  c.allowed_tokens(allowed, may_end);
  EXPECT_TRUE(may_end);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 0);
}

// The engine with a constraint: the prefix cache and a draft model change
// nothing (same tokens, bit-identical logits at every token), the draft
// proposes nothing, and every reply is a valid document or a prefix of one.
TEST(ConstrainedGeneration, CachedEqualsColdAndSpeculationStandsAside) {
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.n_vocab = 600;
  test::LoadedModel& target = test::synthetic_model("json-target", spec);
  SyntheticModelSpec draft_spec = spec;
  draft_spec.seed = 77;
  draft_spec.n_layer = 1;
  test::LoadedModel& draft = test::synthetic_model("json-draft", draft_spec);
  const auto tokenizer = Tokenizer::from_gguf(*target.file);
  const auto vocabulary = std::make_shared<JsonVocabulary>(output_pieces(*tokenizer));
  const auto schema = compile(R"({"type":"object","properties":{"k":{"type":"string","maxLength":6},
      "v":{"type":"array","items":{"type":"integer"},"maxItems":3}},"required":["k","v"]})");

  ThreadPool pool(2);
  PrefixCacheConfig pc;
  pc.block_tokens = 8;
  PrefixCache cache(target.model->state_spec(), pc), draft_cache(draft.model->state_spec(), pc);
  Engine cold(*target.model, pool, nullptr);
  Engine cached(*target.model, pool, &cache);
  Engine speculative(*target.model, pool, &cache);
  speculative.set_draft(*draft.model, &draft_cache, 4);

  struct Run {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> logit_hashes;
    GenerateResult result;
  };
  auto run = [&](Engine& engine, GenerateRequest req) {
    req.constraint = std::make_shared<JsonConstraint>(schema, vocabulary);
    Run r;
    r.result = engine.generate(req, [&](int32_t, std::span<const float> logits) {
      r.logit_hashes.push_back(XXH3_64bits(logits.data(), logits.size_bytes()));
      return true;
    });
    r.tokens = r.result.tokens;
    return r;
  };
  std::mt19937 rng(5);
  int finished = 0;
  for (int trial = 0; trial < 10; ++trial) {
    GenerateRequest req;
    const int len = 4 + static_cast<int>(rng() % 20);
    for (int i = 0; i < len; ++i) req.prompt.push_back(3 + static_cast<int32_t>(rng() % 590));
    req.max_tokens = 60;
    req.stop_tokens = {tokenizer->eos_id()};
    req.sampling.temperature = trial % 3 == 0 ? 0.0f : 1.0f;
    req.sampling.seed = rng();
    const Run reference = run(cold, req);
    for (Engine* engine : {&cached, &cached, &speculative}) {
      const Run again = run(*engine, req);
      ASSERT_EQ(again.tokens, reference.tokens) << "trial " << trial;
      ASSERT_EQ(again.logit_hashes, reference.logit_hashes) << "trial " << trial;
      EXPECT_EQ(again.result.drafted_tokens, 0);
    }
    std::string text;
    for (int32_t t : reference.tokens)
      if (t != tokenizer->eos_id()) text += tokenizer->token_to_piece(t);
    JsonMatcher m(schema);
    ASSERT_TRUE(m.advance(text)) << text;
    if (reference.result.finish_reason == "stop") {
      ++finished;
      EXPECT_TRUE(m.can_end()) << text;
      expect_valid(*schema, text, json());
    }
  }
  EXPECT_GE(finished, 8);
  EXPECT_GT(cache.stats().tokens_reused, 0u);
}

// Found by review (session 48): each of these crashed, hung, dead-ended or
// refused a valid document before.
TEST(JsonSchemaReview, UnionsThatReachThemselvesAreTriedOnce) {
  // Checking an enum value against a union that refers to itself recursed
  // without end; 40 levels of two-way unions took 2^40 steps.
  EXPECT_THROW(compile(R"({"$defs":{"D":{"anyOf":[{"type":"null"},{"$ref":"#/$defs/D"}]}},
                           "items":{"$ref":"#/$defs/D"},"enum":[[1]]})"),
               Error);
  json dag = {{"$defs", json::object()}, {"type", "array"}, {"items", {{"$ref", "#/$defs/L0"}}}, {"enum", {{1}}}};
  for (int i = 0; i < 40; ++i) {
    const json next = {{"$ref", "#/$defs/L" + std::to_string(i + 1)}};
    dag["$defs"]["L" + std::to_string(i)] = {{"anyOf", {next, next}}};
  }
  dag["$defs"]["L40"] = {{"type", "null"}};
  EXPECT_THROW(JsonSchema::compile(dag), Error);
  dag["enum"] = {{nullptr}};
  EXPECT_TRUE(JsonSchema::compile(dag)->validates(json::array({nullptr})));
  // The matcher expanded every path of a five-way self-union for each byte.
  auto s = compile(R"({"$defs":{"D":{"anyOf":[{"$ref":"#/$defs/D"},{"$ref":"#/$defs/D"},{"$ref":"#/$defs/D"},
                        {"$ref":"#/$defs/D"},{"$ref":"#/$defs/D"},{"type":"null"}]}},"$ref":"#/$defs/D"})");
  EXPECT_FALSE(accepts_prefix(s, "x"));
  EXPECT_TRUE(accepts_whole(s, "null"));
  // A chain of 40 references (the union depth limit refused every byte past 31).
  json chain = {{"$defs", json::object()}, {"$ref", "#/$defs/r0"}};
  for (int i = 0; i < 40; ++i) chain["$defs"]["r" + std::to_string(i)] = {{"$ref", "#/$defs/r" + std::to_string(i + 1)}};
  chain["$defs"]["r40"] = {{"type", "null"}};
  EXPECT_TRUE(accepts_whole(JsonSchema::compile(chain), "null"));
}

TEST(JsonSchemaReview, NoDeadEndsFromImpossibleFormsOrNesting) {
  // The node could be satisfied (null), its array or object form could not.
  EXPECT_FALSE(accepts_prefix(compile(R"({"type":["array","null"],"minItems":1,"items":false})"), "["));
  EXPECT_FALSE(accepts_prefix(compile(R"({"type":"object","nullable":true,"properties":{"a":false},"required":["a"]})"), "{"));
  // Nesting: a key whose value could not be finished below the limit is not written.
  auto tree = compile(R"({"type":"object","properties":{"c":{"$ref":"#"}}})");
  JsonMatcher m(tree);
  int levels = 0;
  while (m.advance("{\"c\":")) ++levels;
  EXPECT_GT(levels, 100);
  ASSERT_TRUE(m.advance("{"));
  EXPECT_FALSE(m.advance("\"c"));
  EXPECT_TRUE(m.advance(std::string(levels + 1, '}')));
  EXPECT_TRUE(m.can_end());
  // A schema whose every document nests past the limit is refused, even
  // when its text does not nest that deep (a chain of shared $defs).
  json deep = {{"$defs", json::object()}, {"$ref", "#/$defs/a0"}};
  for (int i = 0; i < 150; ++i)
    deep["$defs"]["a" + std::to_string(i)] = {{"type", "array"}, {"minItems", 1},
                                              {"items", {{"$ref", "#/$defs/a" + std::to_string(i + 1)}}}};
  deep["$defs"]["a150"] = {{"type", "null"}};
  EXPECT_THROW(JsonSchema::compile(deep), Error);
}

// What review found in patterns: a string type no writable string can
// satisfy is dropped (not an error) so its siblings still compile; the
// schema's patterns share one automaton per source and one budget, so a
// schema repeating a costly pattern stays cheap and one with many distinct
// costly patterns is refused rather than built.
TEST(JsonSchemaReview, PatternsInBranchesAndTogether) {
  auto nullable = compile(R"({"anyOf":[{"type":"string","pattern":"[]"},{"type":"null"}]})");
  EXPECT_TRUE(nullable->validates(json(nullptr)));
  EXPECT_FALSE(nullable->validates(json("a")));
  auto control = compile(R"({"type":["string","null"],"pattern":"^\\x01$"})");  // writable only as \u0001
  EXPECT_FALSE(control->validates(json("\x01")));
  EXPECT_TRUE(accepts_whole(control, "null"));
  EXPECT_FALSE(accepts_prefix(control, "\""));
  EXPECT_THROW(compile(R"({"type":"string","pattern":"^\\x01$"})"), Error);  // nothing left at all

  json repeated = {{"type", "array"}, {"prefixItems", json::array()}};
  for (int i = 0; i < 200; ++i)
    repeated["prefixItems"].push_back({{"type", "string"}, {"pattern", "^[\\s\\S]{0,200}$"}, {"maxLength", 1000}});
  const auto t0 = std::chrono::steady_clock::now();
  auto shared = JsonSchema::compile(repeated);
  const SchemaNode* array = &shared->node(shared->root());
  while (!array->any_of.empty()) array = &shared->node(array->any_of[0]);  // the root's reference wrapper
  ASSERT_EQ(array->prefix_items.size(), 200u);
  EXPECT_GE(shared->node(array->prefix_items[0]).pattern, 0);
  EXPECT_EQ(shared->node(array->prefix_items[0]).pattern, shared->node(array->prefix_items[199]).pattern);
  json distinct = {{"type", "array"}, {"prefixItems", json::array()}};
  for (int i = 0; i < 200; ++i)
    distinct["prefixItems"].push_back(
        {{"type", "string"}, {"pattern", "^[\\s\\S]{0," + std::to_string(100 + i) + "}x$"}});
  try {
    JsonSchema::compile(distinct);
    ADD_FAILURE() << "200 costly distinct patterns were built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("together"), std::string::npos) << e.what();
  }
  // (Not a timing assertion: a guard that the two stay far from the seconds
  // they took before the shared budget.)
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(JsonMatcher, NumericBoundsSteerTheDigits) {
  auto s = compile(R"({"type":"object","properties":{"n":{"type":"integer","minimum":3,"maximum":42},
      "x":{"type":"number","exclusiveMinimum":-1.5,"maximum":0.25}},"required":["n","x"]})");
  EXPECT_TRUE(accepts_whole(s, R"({"n":3,"x":0.25})"));
  EXPECT_TRUE(accepts_whole(s, R"({"n":42,"x":-1.49})"));
  EXPECT_TRUE(accepts_whole(s, R"({"n":17,"x":-0})"));
  for (const char* bad : {R"({"n":2,"x":0})", R"({"n":43,"x":0})", R"({"n":5,"x":-1.5})", R"({"n":5,"x":0.26})",
                          R"({"n":5,"x":1e-3})", R"({"n":-3,"x":0})"})
    EXPECT_FALSE(accepts_whole(s, bad)) << bad;
  // Digits that leave no way into the bounds are refused at once.
  EXPECT_FALSE(accepts_prefix(s, R"({"n":5)" "0"));  // 50..: all above 42
  EXPECT_TRUE(accepts_prefix(s, R"({"n":4)"));        // 4 or 40..42
  EXPECT_FALSE(accepts_prefix(s, R"({"n":0)"));
  EXPECT_FALSE(accepts_prefix(s, R"({"n":-)"));
  EXPECT_FALSE(accepts_prefix(s, R"({"n":5,"x":0.3)"));
  EXPECT_FALSE(accepts_prefix(s, R"({"n":5,"x":-2)"));
  EXPECT_THROW(compile(R"({"type":"integer","minimum":1.5,"maximum":1.9})"), Error);
  EXPECT_THROW(compile(R"({"type":"number","exclusiveMinimum":1,"exclusiveMaximum":1})"), Error);
  // Found by review: fractions decided on the exact grid of writable
  // values, compared as a parser reads them (no dead ends, none refused).
  EXPECT_FALSE(accepts_prefix(compile(R"({"type":"number","minimum":0.5})"), "0.4"));
  EXPECT_TRUE(accepts_whole(compile(R"({"type":"number","minimum":0.5})"), "0.50"));
  EXPECT_FALSE(accepts_prefix(compile(R"({"type":"number","minimum":0.3})"), "0.299999999999999"));
  EXPECT_FALSE(accepts_prefix(compile(R"({"type":"number","exclusiveMinimum":100})"), "100.000000000000000"));
  EXPECT_TRUE(accepts_whole(compile(R"({"type":"number","exclusiveMinimum":100})"), "100.0000000000001"));
  EXPECT_TRUE(accepts_whole(compile(R"({"type":"number","minimum":0})"), "1000000000000000.12345"));
  EXPECT_TRUE(accepts_whole(compile(R"({"type":"number","maximum":5})"), "5.0000000000000001"));  // the double is 5
  EXPECT_THROW(compile(R"({"type":"number","minimum":1e-20,"maximum":2e-20})"), Error);  // nothing writable
  EXPECT_THROW(compile(R"({"type":"number","exclusiveMinimum":0.1,"exclusiveMaximum":0.10000000000000002})"), Error);
  EXPECT_TRUE(compile(R"({"type":"integer","minimum":5,"exclusiveMinimum":true})")->validates(json(6)));
  EXPECT_FALSE(compile(R"({"type":"integer","minimum":5,"exclusiveMinimum":true})")->validates(json(5)));
}

TEST(JsonSchemaReview, ValidDocumentsOnceRefused) {
  // The 17th alternative starting with the same byte was dropped.
  json tools = {{"anyOf", json::array()}};
  for (int i = 0; i < 17; ++i)
    tools["anyOf"].push_back({{"type", "object"},
                              {"properties", {{"name", {{"const", "tool" + std::to_string(i)}}}, {"arguments", {{"type", "object"}}}}},
                              {"required", {"name", "arguments"}}});
  EXPECT_TRUE(accepts_whole(JsonSchema::compile(tools), R"({"name":"tool16","arguments":{}})"));
  // enum and const values that are objects with keys.
  EXPECT_TRUE(accepts_whole(compile(R"({"const":{"a":1}})"), R"({"a":1})"));
  EXPECT_TRUE(accepts_whole(compile(R"({"enum":[{"a":1},{}]})"), R"({"a":1})"));
  // Numbers compare by value; integers past 2^63.
  EXPECT_TRUE(compile(R"({"type":"object","properties":{"a":{"const":1}},"enum":[{"a":1.0}]})")
                  ->validates(json::parse(R"({"a":1})")));
  EXPECT_TRUE(compile(R"({"type":"integer","enum":[1e300]})")->validates(json::parse("1e300")));
  EXPECT_FALSE(compile(R"({"type":"integer"})")->validates(json::parse("1.5")));
}
