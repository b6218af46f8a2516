// HarmonyStream: gpt-oss's channels read back as reasoning, content and
// tool calls, the same however the reply is cut into deltas.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/harmony_parser.h"
#include "streamed_parts.h"

using namespace reprise;

namespace {

struct Whole {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

Whole whole(const std::string& reply) {
  HarmonyStream h;
  HarmonyStream::Parts a = h.push(reply), b = h.flush(true);
  return {a.reasoning + b.reasoning, a.content + b.content, h.calls()};
}

const std::string kThinkThenAnswer =
    "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>Four.";
const std::string kThinkThenCall =
    "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
    "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
const std::string kRecipientFirst =
    "<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant to=functions.a<|channel|>commentary json"
    "<|message|>{\"x\": 1}<|call|><|start|>assistant to=functions.b<|channel|>commentary json<|message|>not json<|call|>";

}  // namespace

TEST(HarmonyStream, ChannelsBecomeReasoningContentAndCalls) {
  Whole a = whole(kThinkThenAnswer);
  EXPECT_EQ(a.reasoning, "User asks 2+2. Easy.");
  EXPECT_EQ(a.content, "Four.");
  EXPECT_TRUE(a.calls.empty());

  Whole b = whole(kThinkThenCall);
  EXPECT_EQ(b.reasoning, "Need weather.");
  EXPECT_EQ(b.content, "");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(b.calls[0].arguments), nlohmann::json({{"city", "Paris"}}));

  Whole c = whole(kRecipientFirst);
  ASSERT_EQ(c.calls.size(), 2u);
  EXPECT_EQ(c.calls[0].name, "a");
  EXPECT_EQ(c.calls[1].name, "b");
  EXPECT_EQ(c.calls[1].arguments, "not json");  // passed on as written

  // Without harmony markup the reply is content, as written.
  EXPECT_EQ(whole("Just text, <b>bold</b>.").content, "Just text, <b>bold</b>.");
  // Cut off while reasoning: reasoning so far.
  Whole cut = whole("<|channel|>analysis<|message|>Thinking about");
  EXPECT_EQ(cut.reasoning, "Thinking about");
  EXPECT_EQ(cut.content, "");
  // Cut off in a header: the header is markup, dropped.
  for (const char* header : {"<|channel|>", "<|channel|>analysis", "<|channel|>analysis<|message|>x<|end|><|start|>assistant",
                             "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final"}) {
    HarmonyStream h;
    h.push(header);
    EXPECT_EQ(h.flush(false).content, "") << header;
  }
  // A call cut short (not ended by the model) is text; without tools a
  // message to a function is content.
  {
    HarmonyStream h;
    HarmonyStream::Parts a = h.push("<|channel|>commentary to=functions.f json<|message|>{\"a\": ");
    HarmonyStream::Parts b = h.flush(false);
    EXPECT_EQ(a.content + b.content, "{\"a\": ");
    EXPECT_TRUE(h.calls().empty());
  }
  {
    HarmonyStream h(/*read_calls=*/false);
    HarmonyStream::Parts a = h.push(kThinkThenCall);
    HarmonyStream::Parts b = h.flush(true);
    EXPECT_EQ(a.content + b.content, "{\"city\":\"Paris\"}");
    EXPECT_TRUE(h.calls().empty());
  }
  // A commentary message without a recipient (a preamble) is content.
  EXPECT_EQ(whole("<|channel|>commentary<|message|>Let me check.<|end|>").content, "Let me check.");
}

TEST(HarmonyStream, AnyCutGivesTheWholeReplysParts) {
  std::mt19937 rng(11);
  for (const std::string& reply :
       {kThinkThenAnswer, kThinkThenCall, kRecipientFirst, std::string("plain <| text |> here"),
        std::string("   spaced plain text"), std::string("\n\tnewline plain"),
        std::string(" to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}"),
        std::string("<|channel|>final<|message|>a <|b|> c<|return|>")}) {
    const Whole want = whole(reply);
    for (int trial = 0; trial < 200; ++trial) {
      HarmonyStream h;
      const HarmonyStream::Parts got = testing_support::streamed_parts(h, reply, rng, 6);
      EXPECT_EQ(got.reasoning, want.reasoning) << reply;
      EXPECT_EQ(got.content, want.content) << reply;
      ASSERT_EQ(h.calls().size(), want.calls.size()) << reply;
      for (size_t i = 0; i < want.calls.size(); ++i) {
        EXPECT_EQ(h.calls()[i].name, want.calls[i].name);
        EXPECT_EQ(h.calls()[i].arguments, want.calls[i].arguments);
      }
    }
  }
  // Reasoning is handed on as it comes, but for a possible marker's start.
  HarmonyStream h;
  EXPECT_EQ(h.push("<|channel|>analysis<|message|>abc<|e").reasoning, "abc");
  EXPECT_EQ(h.push("nd|><|start|>assistant<|channel|>final<|message|>x").content, "x");
}

// A reply opening with a long run of whitespace is text, decided within a
// header's length rather than rescanned at every piece.
TEST(HarmonyStream, LongLeadingWhitespaceIsText) {
  HarmonyStream h;
  std::string content;
  for (int i = 0; i < 250000; ++i) content += h.push("    ").content;
  content += h.push("Answer.").content + h.flush(true).content;
  EXPECT_EQ(content.size(), 1000000u + 7u);
}
