// Tool calls read back out of replies in each model family's syntax, and
// the streaming rule: text is released only up to where a call may start.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <cctype>
#include <random>

#include "server/tool_call_parser.h"

using namespace reprise;
using nlohmann::json;

namespace {

const std::vector<std::string> kTools = {"get_weather", "add"};

json arguments_of(const ToolCall& c) { return json::parse(c.arguments); }

}  // namespace

TEST(ToolCallParser, DetectsTheSyntaxATemplateTeaches) {
  EXPECT_EQ(detect_tool_call_syntax("...<tool_call>\\n{\"name\": ...}</tool_call>"), ToolCallSyntax::Hermes);
  EXPECT_EQ(detect_tool_call_syntax("{{- \"[TOOL_CALLS][\" }}"), ToolCallSyntax::Mistral);
  EXPECT_EQ(detect_tool_call_syntax("respond only with <|tool_call|> followed by"), ToolCallSyntax::Granite);
  EXPECT_EQ(detect_tool_call_syntax("{{- '<TOOLCALL>[' -}}"), ToolCallSyntax::Nemotron);
  EXPECT_EQ(detect_tool_call_syntax("{{- \"<|python_tag|>\" }}"), ToolCallSyntax::Llama3);
  EXPECT_EQ(detect_tool_call_syntax("{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}"),
            ToolCallSyntax::DeepSeek);
  EXPECT_EQ(detect_tool_call_syntax("you MUST put it in the format of [func_name1(params_name1=params_value1, ...)]"),
            ToolCallSyntax::Pythonic);
  EXPECT_EQ(detect_tool_call_syntax("<|im_start|>{{ m.content }}"), ToolCallSyntax::None);
}

TEST(ToolCallParser, HermesBlocksWithTextAround) {
  const auto p = parse_tool_calls(ToolCallSyntax::Hermes,
                                  "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                                  "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}"
                                  "</tool_call>",
                                  kTools);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->calls.size(), 2u);
  EXPECT_EQ(p->calls[0].name, "get_weather");
  EXPECT_EQ(arguments_of(p->calls[0]), json({{"city", "Paris"}}));
  EXPECT_EQ(p->calls[1].name, "add");
  EXPECT_EQ(arguments_of(p->calls[1]), json({{"a", 1}, {"b", 2}}));
  EXPECT_NE(p->calls[0].id, p->calls[1].id);
  EXPECT_EQ(p->content(), "Let me look.");
}

TEST(ToolCallParser, ArraySyntaxes) {
  const auto m = parse_tool_calls(
      ToolCallSyntax::Mistral,
      "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}, \"id\": \"abc123XYZ\"}, {\"name\": \"get_weather\", "
      "\"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}]",
      kTools);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->calls.size(), 2u);
  EXPECT_EQ(m->calls[0].id, "abc123XYZ");  // Mistral's own ids are kept
  EXPECT_EQ(arguments_of(m->calls[1]), json({{"city", "Oslo"}}));  // arguments sent as a string stay that string
  const auto g = parse_tool_calls(ToolCallSyntax::Granite, "<|tool_call|>[{\"name\":\"add\",\"arguments\":{}}]", kTools);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->calls[0].arguments, "{}");
  const auto n = parse_tool_calls(ToolCallSyntax::Nemotron,
                                  "<TOOLCALL>[{\"name\":\"add\",\"arguments\":{\"a\":2}}]</TOOLCALL> done", kTools);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->content(), " done");
}

TEST(ToolCallParser, LlamaJsonOnlyForDeclaredTools) {
  const auto p = parse_tool_calls(ToolCallSyntax::Llama3,
                                  " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", kTools);
  ASSERT_TRUE(p);
  EXPECT_EQ(arguments_of(p->calls[0]), json({{"city", "Rome"}}));
  EXPECT_TRUE(parse_tool_calls(ToolCallSyntax::Llama3, "<|python_tag|>{\"name\": \"add\", \"parameters\": {}}", kTools));
  // A JSON answer that is not a declared tool's call stays text.
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Llama3, "{\"name\": \"Bob\", \"parameters\": {}}", kTools));
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Llama3, "The answer is {\"name\": \"add\"}", kTools));
}

// DeepSeek-R1 (and its distills): the type, the name on its own line and
// the arguments in a json fence; DeepSeek-V3.1: the name, then the bare
// arguments.
TEST(ToolCallParser, DeepSeekCalls) {
  const std::string r1 =
      "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
      "{\"a\": 1, \"b\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const auto p = parse_tool_calls(ToolCallSyntax::DeepSeek, r1, kTools);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->calls.size(), 2u);
  EXPECT_EQ(p->calls[0].name, "get_weather");
  EXPECT_EQ(arguments_of(p->calls[0]), json({{"city", "Paris"}}));
  EXPECT_EQ(arguments_of(p->calls[1]), json({{"a", 1}, {"b", 2}}));
  EXPECT_EQ(p->content(), "Let me check.");
  const auto v31 = parse_tool_calls(
      ToolCallSyntax::DeepSeek,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\":3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", kTools);
  ASSERT_TRUE(v31);
  EXPECT_EQ(v31->calls[0].name, "add");
  EXPECT_EQ(arguments_of(v31->calls[0]), json({{"a", 3}}));
  for (const char* reply :
       {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\":3}<｜tool▁call▁end｜>",  // unclosed list
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>[1]<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add {}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",  // no separator
        "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{}<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>"})  // an unclosed fence
    EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::DeepSeek, reply, kTools)) << reply;
  // The call markers are control tokens in DeepSeek's vocabulary: all are shown.
  EXPECT_EQ(tool_call_markers(ToolCallSyntax::DeepSeek).size(), 5u);
  // Reasoning that writes the marker is reasoning.
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::DeepSeek, "<think>use <｜tool▁calls▁begin｜></think>done", kTools));
}

// Llama 3.2's and Llama 4's Python call lists.
TEST(ToolCallParser, PythonicCalls) {
  const auto p = parse_tool_calls(ToolCallSyntax::Pythonic,
                                  " [get_weather(city='Paris', days=3), add(a=-1.5, b=2e3)]\n", kTools);
  ASSERT_TRUE(p);
  ASSERT_EQ(p->calls.size(), 2u);
  EXPECT_EQ(arguments_of(p->calls[0]), json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(arguments_of(p->calls[1]), json({{"a", -1.5}, {"b", 2000.0}}));
  EXPECT_EQ(p->content(), "");
  const auto q = parse_tool_calls(
      ToolCallSyntax::Pythonic,
      "<|python_start|>[add(xs=[1, (2, 3), ], opts={'deep': {\"k\": None}, 'on': True}, s=\"it\\'s \\\"q\\\"\\n\")]"
      "<|python_end|>",
      kTools);
  ASSERT_TRUE(q);
  EXPECT_EQ(arguments_of(q->calls[0]),
            json::parse(R"({"xs": [1, [2, 3]], "opts": {"deep": {"k": null}, "on": true}, "s": "it's \"q\"\n"})"));
  EXPECT_EQ(arguments_of(*parse_tool_calls(ToolCallSyntax::Pythonic, "[add()]", kTools)->calls.begin()), json::object());
  for (const char* reply : {"[1, 2]", "[link](http://example.com)", "[get_weather(city='Paris')] and more",
                            "[nope(a=1)]",  // not a declared tool
                            "[add(a=1,)", "[add(a=)]", "[add(1)]", "[]", "[add(a='x)]", "plain text"})
    EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Pythonic, reply, kTools)) << reply;
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Pythonic,
                                "[add(a=" + std::string(100000, '[') + std::string(100000, ']') + ")]", kTools));
  // Streaming: a reply that may be a call list is held back; other text is not.
  EXPECT_EQ(ToolCallTextGate(ToolCallSyntax::Pythonic).free_prefix(" [add("), 0u);
  EXPECT_EQ(ToolCallTextGate(ToolCallSyntax::Pythonic).free_prefix("<|python_st"), 0u);
  EXPECT_EQ(ToolCallTextGate(ToolCallSyntax::Pythonic).free_prefix("Hello ["), 7u);
}

// Found by review (session 51).
TEST(ToolCallParser, DeepSeekAndPythonicEdgeCases) {
  // A closing marker inside an argument string is text; calls in two lists
  // are all read; a tool named "function" in V3.1's form is read as such.
  const auto d = parse_tool_calls(
      ToolCallSyntax::DeepSeek,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"t\": \"<｜tool▁call▁end｜><｜tool▁calls▁end｜>\"}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜> and <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
      "{\"x\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      kTools);
  ASSERT_TRUE(d);
  ASSERT_EQ(d->calls.size(), 2u);
  EXPECT_EQ(arguments_of(d->calls[0]), json({{"t", "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}}));
  EXPECT_EQ(d->calls[1].name, "function");
  EXPECT_EQ(d->content(), " and");
  // A name with a space or line break in it is not a name.
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::DeepSeek,
                                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add\nname<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                                "<｜tool▁calls▁end｜>",
                                kTools));
  // Python: escapes as Python reads them, (x) is x, trailing commas, a
  // keyword given twice is text, the closing tag alone.
  const auto p = parse_tool_calls(
      ToolCallSyntax::Pythonic,
      "[add(s='\\u00e9\\x41\\101\\012\\t\\q', one=(1), pair=(1,), nested=((2)),),]<|python_end|>", kTools);
  ASSERT_TRUE(p);
  EXPECT_EQ(arguments_of(p->calls[0]),
            json({{"s", "\u00e9AA\n\t\\q"}, {"one", 1}, {"pair", json::array({1})}, {"nested", 2}}));
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Pythonic, "[add(a=1, a=2)]", kTools));
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Pythonic, "[add(s='\\N{BULLET}')]", kTools));
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Pythonic, "[add(s='\\ud800')]", kTools));  // a lone surrogate
  // Whitespace streamed byte by byte: the released text ends where it did.
  ToolCallTextGate gate(ToolCallSyntax::Hermes);
  std::string reply = "Hi";
  EXPECT_EQ(gate.free_prefix(reply), 2u);
  for (int i = 0; i < 1000; ++i) {
    reply += ' ';
    ASSERT_EQ(gate.free_prefix(reply), 2u);
  }
  reply += "x";
  EXPECT_EQ(gate.free_prefix(reply), reply.size());
}

// Random Python-ish replies built from the reader's pieces: each is read
// as calls of declared tools with JSON-object arguments, or is text; a
// streamed reply releases nothing while it may still be a call list and all
// of itself once it cannot be one, and what it releases never shrinks.
TEST(ToolCallParser, RandomPythonicRepliesAreCallsOrText) {
  std::mt19937 rng(12);
  const std::vector<std::string> pieces = {"[", "]", "(", ")", "{", "}", ",", "=", ":", " ", "\n", "add", "get_weather",
                                           "a", "city", "'x'", "\"y\"", "'\\x41'", "'\\u00e9'", "1", "-2.5", "True",
                                           "None", "'", "\\", "<|python_start|>", "<|python_end|>", "nope", "."};
  int calls = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string reply;
    if (rng() % 2) reply = "[add(a=1, city='x'), get_weather(city=[1, (2,), {'k': None}])]";
    for (int i = static_cast<int>(rng() % 10); i > 0; --i) {
      const std::string& piece = pieces[rng() % pieces.size()];
      const size_t at = reply.empty() ? 0 : rng() % (reply.size() + 1);
      if (rng() % 4 == 0 && !reply.empty()) reply.erase(rng() % reply.size(), 1);
      else reply.insert(std::min(at, reply.size()), piece);
    }
    const auto parsed = parse_tool_calls(ToolCallSyntax::Pythonic, reply, kTools);
    if (parsed) {
      ++calls;
      ASSERT_FALSE(parsed->calls.empty()) << reply;
      for (const ToolCall& c : parsed->calls) {
        ASSERT_TRUE(std::find(kTools.begin(), kTools.end(), c.name) != kTools.end()) << reply;
        ASSERT_TRUE(json::parse(c.arguments, nullptr, false).is_object()) << reply;
      }
      ASSERT_EQ(parsed->content(), "") << reply;
    }
    ToolCallTextGate gate(ToolCallSyntax::Pythonic);
    size_t sent = 0;
    for (size_t n = 0; n < reply.size();) {
      n = std::min(reply.size(), n + 1 + rng() % 4);
      const size_t free = gate.free_prefix(std::string_view(reply).substr(0, n));
      ASSERT_TRUE(free == 0 || free == n) << reply;  // the whole reply is a call, or text
      ASSERT_GE(free, sent) << reply;
      if (parsed) {
        ASSERT_EQ(free, 0u) << reply;
      }
      sent = free;
    }
  }
  EXPECT_GT(calls, 500);  // enough replies were calls to test them
}

TEST(ToolCallParser, MalformedMarkupStaysText) {
  for (const char* reply : {"<tool_call>{\"name\": \"add\", \"arguments\": {}}",  // unclosed
                            "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>",
                            "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>not json</tool_call>",
                            "<tool_call>[{\"name\":\"add\"}]</tool_call>", "no calls here"})
    EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Hermes, reply, kTools)) << reply;
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Mistral, "[TOOL_CALLS][]", kTools));
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Mistral, "[TOOL_CALLS]{\"name\":\"add\"}", kTools));
}

// Found by review (session 48).
TEST(ToolCallParser, MarkersInsideStringsAndReasoningAreText) {
  // A closing marker inside an argument string does not end the call.
  const auto p = parse_tool_calls(
      ToolCallSyntax::Hermes, "<tool_call>{\"name\":\"add\",\"arguments\":{\"t\":\"</tool_call>\"}}</tool_call>", kTools);
  ASSERT_TRUE(p);
  EXPECT_EQ(arguments_of(p->calls[0]), json({{"t", "</tool_call>"}}));
  // Qwen3 reasoning that mentions the marker.
  const auto q = parse_tool_calls(ToolCallSyntax::Hermes,
                                  "<think>I must answer inside <tool_call></tool_call> tags.</think>\n"
                                  "<tool_call>{\"name\":\"add\",\"arguments\":{}}</tool_call>",
                                  kTools);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->content(), "<think>I must answer inside <tool_call></tool_call> tags.</think>");
  ToolCallTextGate gate(ToolCallSyntax::Hermes);
  EXPECT_EQ(gate.free_prefix("<think>use <tool_call> tags"), std::string("<think>use <tool_call> tags").size());
  // Calls nested past 64 levels are text (the parser and serialiser recurse).
  const std::string deep = "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":" + std::string(100000, '[') +
                           std::string(100000, ']') + "}}</tool_call>";
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Hermes, deep, kTools));
  // Mistral's templates require 9-alphanumeric ids.
  const auto m = parse_tool_calls(ToolCallSyntax::Mistral, "[TOOL_CALLS][{\"name\":\"add\",\"arguments\":{}}]", kTools);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->calls[0].id.size(), 9u);
  EXPECT_TRUE(std::all_of(m->calls[0].id.begin(), m->calls[0].id.end(), [](char c) { return std::isalnum(c); }));
  EXPECT_EQ(make_tool_call_id(ToolCallSyntax::Hermes).rfind("call_", 0), 0u);
}

// Streaming: replies built from text, whitespace, reasoning and calls, fed
// to a gate in random pieces. Released text never reaches a call's start,
// never shrinks, and released text plus what is sent at the end equals the
// non-streamed content exactly; a reply without calls is released whole.
TEST(ToolCallParser, StreamedTextEqualsTheReplysContent) {
  std::mt19937 rng(3);
  const std::vector<std::pair<ToolCallSyntax, std::pair<std::string, std::string>>> syntaxes = {
      {ToolCallSyntax::Hermes, {"<tool_call>", "</tool_call>"}},
      {ToolCallSyntax::Mistral, {"[TOOL_CALLS]", ""}},
      {ToolCallSyntax::Granite, {"<|tool_call|>", ""}},
      {ToolCallSyntax::Nemotron, {"<TOOLCALL>", "</TOOLCALL>"}},
      {ToolCallSyntax::DeepSeek, {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"}}};
  const std::vector<std::string> bits = {"a", "<", "<tool", "[", "[TOOL", "<|", "x y", "\n", " ", "<TOOL", "|",
                                         "<think>", "</think>", "<thi", "}", "\"", "é"};
  int with_calls = 0;
  for (const auto& [syntax, markers] : syntaxes) {
    const bool array = syntax != ToolCallSyntax::Hermes && syntax != ToolCallSyntax::DeepSeek;
    for (int trial = 0; trial < 400; ++trial) {
      std::string reply;
      for (int i = static_cast<int>(rng() % 8); i > 0; --i) reply += bits[rng() % bits.size()];
      if (rng() % 3 != 0) {
        const std::string call = "{\"name\":\"add\",\"arguments\":{\"s\":\"" + bits[rng() % bits.size()] + "\"}}";
        const std::string body =
            syntax == ToolCallSyntax::DeepSeek
                ? "<｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"s\":\"" + bits[rng() % bits.size()] + "\"}<｜tool▁call▁end｜>"
            : array ? "[" + call + "]"
                    : call;
        reply += markers.first + body + markers.second;
        for (int i = static_cast<int>(rng() % 3); i > 0; --i) reply += bits[rng() % bits.size()];
      }
      const auto parsed = parse_tool_calls(syntax, reply, kTools);
      ToolCallTextGate gate(syntax);
      size_t sent = 0;
      for (size_t n = 0; n < reply.size();) {
        n = std::min(reply.size(), n + 1 + rng() % 6);
        const size_t free = gate.free_prefix(std::string_view(reply).substr(0, n));
        ASSERT_GE(free, sent) << reply;
        if (parsed) {
          ASSERT_LE(free, parsed->before.size()) << reply;
        }
        sent = free;
      }
      const std::string streamed = reply.substr(0, sent) + (parsed ? parsed->content_from(sent) : reply.substr(sent));
      if (parsed) {
        ++with_calls;
        EXPECT_EQ(streamed, parsed->content()) << reply;
      } else {
        EXPECT_EQ(streamed, reply);
      }
    }
  }
  EXPECT_GT(with_calls, 500);
  ToolCallTextGate llama(ToolCallSyntax::Llama3);
  EXPECT_EQ(llama.free_prefix("  {\"na"), 0u);
  EXPECT_EQ(ToolCallTextGate(ToolCallSyntax::Llama3).free_prefix("<|pyt"), 0u);
  EXPECT_EQ(ToolCallTextGate(ToolCallSyntax::Llama3).free_prefix("Hello"), 5u);
  EXPECT_EQ(ToolCallTextGate(ToolCallSyntax::None).free_prefix("<tool_call>"), 11u);
}
