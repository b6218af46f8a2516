// ReasoningSplitter: a thinking model's <think> reasoning apart from its
// answer, the same however the reply is cut into deltas.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "server/reasoning_splitter.h"
#include "streamed_parts.h"

using namespace reprise;

namespace {

ReasoningSplitter::Parts whole(const std::string& reply, bool opens) {
  ReasoningSplitter s(opens);
  ReasoningSplitter::Parts a = s.push(reply), b = s.flush();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

}  // namespace

TEST(ReasoningSplitter, SplitsReasoningFromContent) {
  struct Case {
    std::string reply;
    bool opens;
    std::string reasoning, content;
  };
  const std::vector<Case> cases = {
      {"<think>Two and two.</think>\n\nFour.", false, "Two and two.", "Four."},
      {"\n <think>\nx\n</think>Four.", false, "\nx\n", "Four."},
      {"Two and two.</think>\n\nFour.", true, "Two and two.", "Four."},
      {"Four.", false, "", "Four."},
      {"  Four. <think>late</think>", false, "", "  Four. <think>late</think>"},  // not at the start: content
      {"<think>cut off mid-thought", false, "cut off mid-thought", ""},
      {"still thinking </thin", true, "still thinking </thin", ""},
      {"<thi", false, "", "<thi"},
      {"<think></think>", false, "", ""},
      {"<think>a</think>b</think>c", false, "a", "b</think>c"},
      {"", true, "", ""},
      {"\n\n", false, "", "\n\n"},
  };
  for (const Case& c : cases) {
    const ReasoningSplitter::Parts got = whole(c.reply, c.opens);
    EXPECT_EQ(got.reasoning, c.reasoning) << c.reply;
    EXPECT_EQ(got.content, c.content) << c.reply;
  }
  EXPECT_TRUE(ReasoningSplitter::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("<|im_start|>assistant\n"));
}

// Streamed in random pieces (tags split anywhere), the parts joined are the
// whole reply's, and nothing is held back that could no longer be a tag.
TEST(ReasoningSplitter, AnyCutGivesTheWholeReplysParts) {
  std::mt19937 rng(7);
  const std::vector<std::string> replies = {"<think>Let me see: 2+2.</think>\n\nIt is <b>4</b>.",
                                            " \n<think>\n</think>x", "a</think>b", "<think><think></think>",
                                            "no tags at all", "<think>unfinished </thi", "<</think>"};
  for (const std::string& reply : replies)
    for (bool opens : {false, true}) {
      const ReasoningSplitter::Parts want = whole(reply, opens);
      for (int trial = 0; trial < 200; ++trial) {
        ReasoningSplitter s(opens);
        const ReasoningSplitter::Parts got = testing_support::streamed_parts(s, reply, rng, 4);
        EXPECT_EQ(got.reasoning, want.reasoning) << reply;
        EXPECT_EQ(got.content, want.content) << reply;
      }
    }
  // Reasoning is handed on as it comes, but for a possible tag's start.
  ReasoningSplitter s(true);
  EXPECT_EQ(s.push("abc</th").reasoning, "abc");
  EXPECT_EQ(s.push("x").reasoning, "</thx");
}

// A reply of whitespace streamed in small pieces is held without copying
// it all again at every piece (it took seconds for a megabyte).
TEST(ReasoningSplitter, LongLeadingWhitespaceIsHeldOnce) {
  ReasoningSplitter s(false);
  std::string content;
  for (int i = 0; i < 250000; ++i) content += s.push("    ").content;
  content += s.push("Answer.").content;
  EXPECT_EQ(content.size(), 1000000u + 7u);
}
