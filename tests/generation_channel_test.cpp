// GenerationChannel: a response thread takes a generation's deltas in order,
// each exactly once, and sees the end; with a pace, its takes return at least
// that far apart (so a fast generation's pushes in between do not wake it),
// while the first take (the first token) and the end wait for nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server/generation.h"

using namespace reprise;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

GenerationDelta delta(const std::string& text) {
  GenerationDelta d;
  d.text = text;
  return d;
}

TEST(GenerationChannel, PacedTakesCollectEveryDeltaInOrderAtLeastAPaceApart) {
  constexpr milliseconds kPace{15};
  GenerationChannel channel;
  channel.push(delta("first"));
  std::vector<GenerationDelta> got;
  // The first take has no previous one to keep a pace from.
  const auto before = Clock::now();
  EXPECT_FALSE(channel.take(got, milliseconds(1000), kPace));
  EXPECT_LT(Clock::now() - before, milliseconds(1000));
  ASSERT_EQ(got.size(), 1u);

  // A producer pushing 40 deltas a millisecond apart, then finishing.
  std::thread producer([&] {
    for (int i = 0; i < 40; ++i) {
      channel.push(delta(std::to_string(i)));
      std::this_thread::sleep_for(milliseconds(1));
    }
    GenerationOutcome outcome;
    outcome.finish_reason = "length";
    channel.finish(outcome);
  });
  // Each take's start and return: a take's pace counts from the previous
  // take's end, which lies between that take's start and return.
  std::vector<Clock::time_point> starts, returns;
  std::vector<bool> finished;
  for (bool done = false; !done;) {
    starts.push_back(Clock::now());
    done = channel.take(got, milliseconds(1000), kPace);
    returns.push_back(Clock::now());
    finished.push_back(done);
  }
  producer.join();

  ASSERT_EQ(got.size(), 41u);
  EXPECT_EQ(got[0].text, "first");
  for (int i = 0; i < 40; ++i) EXPECT_EQ(got[i + 1].text, std::to_string(i));
  EXPECT_EQ(channel.outcome().finish_reason, "length");
  // Each take returned at least a pace after the one before began, but the
  // one that saw the end (which the end may wake sooner: the next test).
  ASSERT_GE(returns.size(), 3u) << "40 ms of pushes take several 15 ms paces";
  for (size_t i = 1; i < returns.size(); ++i) {
    if (finished[i]) continue;
    EXPECT_GE(returns[i] - starts[i - 1], kPace) << i;
  }
}

TEST(GenerationChannel, ThePaceDoesNotHoldBackTheEnd) {
  constexpr milliseconds kPace{2000};
  GenerationChannel channel;
  std::vector<GenerationDelta> got;
  channel.push(delta("token"));
  EXPECT_FALSE(channel.take(got, milliseconds(1000), kPace));
  // A short reply: its last delta and its end come right after the first take.
  std::thread producer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    channel.push(delta("last"));
    GenerationOutcome outcome;
    outcome.finish_reason = "stop";
    channel.finish(outcome);
  });
  const auto before = Clock::now();
  EXPECT_TRUE(channel.take(got, milliseconds(5000), kPace));
  EXPECT_LT(Clock::now() - before, kPace / 2) << "the end must wake a paced take";
  producer.join();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].text, "last");
  EXPECT_EQ(channel.outcome().finish_reason, "stop");
}

TEST(GenerationChannel, UnpacedTakeReturnsAsSoonAsADeltaArrives) {
  GenerationChannel channel;
  std::vector<GenerationDelta> got;
  channel.push(delta("a"));
  EXPECT_FALSE(channel.take(got, milliseconds(1000)));
  channel.push(delta("b"));
  const auto before = Clock::now();
  EXPECT_FALSE(channel.take(got, milliseconds(1000)));
  EXPECT_LT(Clock::now() - before, milliseconds(500));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].text, "b");
}

}  // namespace
