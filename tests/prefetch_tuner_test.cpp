// The decode prefetch tuner: it must settle on whichever setting the
// products' own timings show faster, per weight type, compare each product
// only with itself, shrug off a descheduled call, and measure again later.
#include "tensor/prefetch_tuner.h"

#include <gtest/gtest.h>

#include <random>

namespace reprise {
namespace {

// A fake host: each product has its own base time; the setting without
// prefetch takes `off_factor` times as long; noise is a few percent.
struct FakeProducts {
  std::vector<int> matrices = std::vector<int>(33);  // addresses only
  std::vector<double> base_seconds;
  std::mt19937 rng{7};
  FakeProducts() {
    for (size_t i = 0; i < matrices.size(); ++i) base_seconds.push_back(1e-5 * static_cast<double>(1 + i % 7));
  }
  // One "token": every product once, in order, at clock `now`; returns the
  // calls that prefetched.
  int token(PrefetchTuner& tuner, DType type, double off_factor, double& now, int64_t n_tokens = 1) {
    std::uniform_real_distribution<double> noise(0.97, 1.03);
    int prefetched = 0;
    for (size_t i = 0; i < matrices.size(); ++i) {
      const PrefetchTuner::Plan p = tuner.plan(type, &matrices[i], n_tokens, now);
      const double took = base_seconds[i] * (p.prefetch ? 1.0 : off_factor) * noise(rng);
      now += took;
      tuner.report(p, took, now);
      prefetched += p.prefetch;
    }
    return prefetched;
  }
};

PrefetchTuner::Settings quick() {
  PrefetchTuner::Settings s;
  s.pairs_per_round = 64;
  s.hold_seconds = 1.0;
  return s;
}

TEST(PrefetchTuner, SettlesOnTheFasterSetting) {
  for (const double off_factor : {0.85, 1.15}) {
    PrefetchTuner tuner(quick());
    FakeProducts host;
    double now = 0.0;
    for (int i = 0; i < 8; ++i) host.token(tuner, DType::F16, off_factor, now);
    ASSERT_EQ(tuner.rounds(DType::F16), 1);
    EXPECT_EQ(tuner.prefetches(DType::F16), off_factor > 1.0) << off_factor;
    // While the decision holds, every call uses it and none is timed.
    const PrefetchTuner::Plan p = tuner.plan(DType::F16, &host.matrices[0], 1, now);
    EXPECT_FALSE(p.timed);
    EXPECT_EQ(p.prefetch, off_factor > 1.0);
    EXPECT_EQ(host.token(tuner, DType::F16, off_factor, now), off_factor > 1.0 ? 33 : 0);
  }
}

TEST(PrefetchTuner, MeasuringAlternatesEachProductOnItsOwn) {
  PrefetchTuner tuner(quick());
  int a = 0, b = 0;
  // a is called twice for every call of b: both still see both settings in turn.
  std::vector<bool> seen_a, seen_b;
  for (int i = 0; i < 6; ++i) {
    auto pa = tuner.plan(DType::Q8_0, &a, 1, 0.0);
    seen_a.push_back(pa.prefetch);
    auto pa2 = tuner.plan(DType::Q8_0, &a, 1, 0.0);
    seen_a.push_back(pa2.prefetch);
    auto pb = tuner.plan(DType::Q8_0, &b, 1, 0.0);
    seen_b.push_back(pb.prefetch);
    EXPECT_TRUE(pa.timed && pa2.timed && pb.timed);
  }
  for (size_t i = 0; i < seen_a.size(); ++i) EXPECT_EQ(seen_a[i], i % 2 == 0) << i;
  for (size_t i = 0; i < seen_b.size(); ++i) EXPECT_EQ(seen_b[i], i % 2 == 0) << i;
}

TEST(PrefetchTuner, BatchSizesAreSeparateProducts) {
  PrefetchTuner tuner(quick());
  int m = 0;
  // Alternating batch sizes: were they one product, these calls would pair
  // a 1-token call with a 4-token one.
  EXPECT_TRUE(tuner.plan(DType::F16, &m, 1, 0.0).prefetch);
  EXPECT_TRUE(tuner.plan(DType::F16, &m, 4, 0.0).prefetch);
  EXPECT_FALSE(tuner.plan(DType::F16, &m, 1, 0.0).prefetch);
  EXPECT_FALSE(tuner.plan(DType::F16, &m, 4, 0.0).prefetch);
}

TEST(PrefetchTuner, TypesDecideIndependently) {
  PrefetchTuner tuner(quick());
  FakeProducts f16, q8;
  double now = 0.0;
  for (int i = 0; i < 8; ++i) {
    f16.token(tuner, DType::F16, 0.85, now);  // F16 faster without
    q8.token(tuner, DType::Q8_0, 1.15, now);  // Q8_0 faster with
  }
  EXPECT_FALSE(tuner.prefetches(DType::F16));
  EXPECT_TRUE(tuner.prefetches(DType::Q8_0));
  EXPECT_EQ(tuner.summary(), "F16 off, Q8_0 on");
  EXPECT_EQ(PrefetchTuner().summary(), "");
}

TEST(PrefetchTuner, AnEvenContestKeepsTheCurrentSetting) {
  PrefetchTuner tuner(quick());
  FakeProducts host;
  double now = 0.0;
  for (int i = 0; i < 8; ++i) host.token(tuner, DType::Q4_0, 1.0, now);
  ASSERT_EQ(tuner.rounds(DType::Q4_0), 1);
  EXPECT_TRUE(tuner.prefetches(DType::Q4_0));
}

TEST(PrefetchTuner, ADescheduledCallDoesNotDecide) {
  PrefetchTuner tuner(quick());
  int m = 0;
  double now = 0.0;
  // Prefetching is 5 % faster, but a few calls without it were not the
  // slow ones: the host stole a millisecond from several calls with it.
  for (int i = 0; i < 128; ++i) {
    const auto p = tuner.plan(DType::F16, &m, 1, now);
    double took = p.prefetch ? 1.0e-4 : 1.05e-4;
    if (p.prefetch && i % 32 == 0) took += 1e-3;
    now += took;
    tuner.report(p, took, now);
  }
  ASSERT_EQ(tuner.rounds(DType::F16), 1);
  EXPECT_TRUE(tuner.prefetches(DType::F16));
}

TEST(PrefetchTuner, MeasuresAgainAfterTheHoldAndFollowsTheHost) {
  PrefetchTuner tuner(quick());
  FakeProducts host;
  double now = 0.0;
  for (int i = 0; i < 8; ++i) host.token(tuner, DType::F16, 0.85, now);
  ASSERT_FALSE(tuner.prefetches(DType::F16));
  // The host slows down: without prefetch is now the slower. Until the hold
  // ends nothing changes; after it, a new round follows the host.
  const double decided = now;
  while (now < decided + 0.9) host.token(tuner, DType::F16, 1.2, now);
  EXPECT_EQ(tuner.rounds(DType::F16), 1);
  EXPECT_FALSE(tuner.prefetches(DType::F16));
  now = decided + 1.0;
  for (int i = 0; i < 8; ++i) host.token(tuner, DType::F16, 1.2, now);
  EXPECT_EQ(tuner.rounds(DType::F16), 2);
  EXPECT_TRUE(tuner.prefetches(DType::F16));
}

TEST(PrefetchTuner, ASteadyHostIsMeasuredLessAndLessOften) {
  PrefetchTuner::Settings s = quick();
  s.max_hold_seconds = 4.0;
  PrefetchTuner tuner(s);
  FakeProducts host;
  double now = 0.0;
  // Runs tokens until the next round has decided; returns when it did.
  auto next_decision = [&](double off_factor) {
    const int before = tuner.rounds(DType::F16);
    while (tuner.rounds(DType::F16) == before) host.token(tuner, DType::F16, off_factor, now);
    return now;
  };
  double last = next_decision(0.85);
  // Holds of 1, 2, 4 and then 4 (the cap) seconds between rounds: each gap
  // is at least the hold and less than the hold plus a round's few tokens.
  for (const double hold : {1.0, 2.0, 4.0, 4.0}) {
    const double at = next_decision(0.85);
    EXPECT_GE(at - last, hold);
    EXPECT_LT(at - last, hold + 0.1);
    last = at;
  }
  EXPECT_FALSE(tuner.prefetches(DType::F16));
  // A flip goes back to the shortest hold.
  last = next_decision(1.2);
  ASSERT_TRUE(tuner.prefetches(DType::F16));
  const double at = next_decision(1.2);
  EXPECT_LT(at - last, 1.1);
}

TEST(PrefetchTuner, ALateReportFromAnEndedRoundIsIgnored) {
  PrefetchTuner::Settings s = quick();
  s.pairs_per_round = 2;
  PrefetchTuner tuner(s);
  int m = 0, n = 0;
  const auto stale = tuner.plan(DType::F16, &n, 1, 0.0);  // reported only after the round ends
  for (int i = 0; i < 4; ++i) {
    const auto p = tuner.plan(DType::F16, &m, 1, 0.0);
    tuner.report(p, p.prefetch ? 2.0 : 1.0, 0.0);
  }
  ASSERT_EQ(tuner.rounds(DType::F16), 1);
  ASSERT_FALSE(tuner.prefetches(DType::F16));
  tuner.report(stale, 100.0, 0.5);
  EXPECT_EQ(tuner.rounds(DType::F16), 1);
  EXPECT_FALSE(tuner.prefetches(DType::F16));
  EXPECT_FALSE(tuner.plan(DType::F16, &m, 1, 0.5).timed);
}

}  // namespace
}  // namespace reprise
