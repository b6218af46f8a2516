// Tool calls read back out of replies in each model family's syntax, and
// the streaming rule: text is released only up to where a call may start.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
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
  EXPECT_EQ(p->trailing(), "");
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
  EXPECT_EQ(n->trailing(), "done");
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

TEST(ToolCallParser, MalformedMarkupStaysText) {
  for (const char* reply : {"<tool_call>{\"name\": \"add\", \"arguments\": {}}",  // unclosed
                            "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>",
                            "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>not json</tool_call>",
                            "<tool_call>[{\"name\":\"add\"}]</tool_call>", "no calls here"})
    EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Hermes, reply, kTools)) << reply;
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Mistral, "[TOOL_CALLS][]", kTools));
  EXPECT_FALSE(parse_tool_calls(ToolCallSyntax::Mistral, "[TOOL_CALLS]{\"name\":\"add\"}", kTools));
}

// Streaming: the free prefix of every prefix of a reply never reaches into
// a call, never shrinks as the reply grows, and covers all text before the
// first call once the call's marker is complete.
TEST(ToolCallParser, FreePrefixNeverReleasesACallsStart) {
  std::mt19937 rng(3);
  const std::vector<std::pair<ToolCallSyntax, std::string>> cases = {
      {ToolCallSyntax::Hermes, "<tool_call>"}, {ToolCallSyntax::Mistral, "[TOOL_CALLS]"},
      {ToolCallSyntax::Granite, "<|tool_call|>"}, {ToolCallSyntax::Nemotron, "<TOOLCALL>"}};
  const std::vector<std::string> bits = {"a", "<", "<tool", "[", "[TOOL", "<|", "x y", "\n", "<TOOL", "|"};
  for (const auto& [syntax, marker] : cases) {
    for (int trial = 0; trial < 300; ++trial) {
      std::string before;
      for (int i = static_cast<int>(rng() % 8); i > 0; --i) before += bits[rng() % bits.size()];
      if (before.find(marker) != std::string::npos) continue;
      const std::string reply = before + marker + "{\"name\":\"add\",\"arguments\":{}}";
      size_t last = 0;
      for (size_t n = 0; n <= reply.size(); ++n) {
        const size_t free = tool_call_free_prefix(syntax, std::string_view(reply).substr(0, n));
        ASSERT_LE(free, before.size()) << reply.substr(0, n);
        ASSERT_GE(free, last) << reply.substr(0, n);
        last = free;
      }
      EXPECT_EQ(last, before.size());
    }
  }
  EXPECT_EQ(tool_call_free_prefix(ToolCallSyntax::Llama3, "  {\"na"), 0u);
  EXPECT_EQ(tool_call_free_prefix(ToolCallSyntax::Llama3, "<|pyt"), 0u);
  EXPECT_EQ(tool_call_free_prefix(ToolCallSyntax::Llama3, "Hello"), 5u);
  EXPECT_EQ(tool_call_free_prefix(ToolCallSyntax::None, "<tool_call>"), 11u);
}
