// Recurrent-state snapshots: a hybrid toy model (one attention layer, one
// recurrent layer) whose outputs depend on every earlier token through both
// kinds of state, run cached (prefix blocks + snapshots) against cold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cache/prefix_cache.h"
#include "cache/snapshot_store.h"
#include "engine/engine.h"
#include "tensor/fp16.h"
#include "greedy_run.h"
#include "toy_hybrid.h"

using namespace reprise;
using reprise::testing_support::bit_identical;
using reprise::testing_support::run;
using reprise::testing_support::StepOutput;
using reprise::testing_support::ToyHybrid;

namespace {

class SnapshotDifferential : public ::testing::TestWithParam<bool> {};

TEST_P(SnapshotDifferential, CachedEqualsColdAcrossEditsAndTurns) {
  ToyHybrid model(GetParam());
  ThreadPool pool(1);
  Engine cold(model, pool, nullptr);
  std::mt19937 rng(99);
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int64_t reused = 0;
  for (int script = 0; script < 200; ++script) {
    PrefixCacheConfig pc;
    pc.block_tokens = std::vector<int>{4, 8, 16}[rnd(0, 2)];
    PrefixCache cache(model.state_spec(), pc);
    SnapshotConfig sc;
    sc.chunk_tokens = pc.block_tokens;
    sc.checkpoint_every_chunks = rnd(0, 3);
    sc.max_entries = static_cast<size_t>(rnd(1, 20));
    SnapshotStore snaps(model.state_spec(), sc);
    Engine cached(model, pool, &cache, {}, &snaps);
    testing_support::ConversationScript traffic(rng, 30, 63);
    for (int step = 0; step < 6; ++step) {
      const std::vector<int32_t> prompt = traffic.next_prompt();
      const int n_gen = rnd(1, 5);
      StepOutput want = run(cold, prompt, n_gen), got = run(cached, prompt, n_gen);
      ASSERT_TRUE(bit_identical(want, got)) << "script " << script << " step " << step << ": " << got.result.reuse.describe();
      reused += got.result.cached_tokens;
      traffic.record(prompt, got.tokens);
      ASSERT_EQ(cache.check_invariants(), "");
    }
  }
  EXPECT_GT(reused, 0);
}

INSTANTIATE_TEST_SUITE_P(PureAndHybrid, SnapshotDifferential, ::testing::Values(false, true));

TEST(Snapshots, TurnTwoRestoresAtEndOfTurnOne) {
  ToyHybrid model(true);
  ThreadPool pool(1);
  PrefixCacheConfig pc;
  pc.block_tokens = 8;
  PrefixCache cache(model.state_spec(), pc);
  SnapshotStore snaps(model.state_spec(), {});
  Engine cached(model, pool, &cache, {}, &snaps);
  std::vector<int32_t> turn1(37);
  for (size_t i = 0; i < turn1.size(); ++i) turn1[i] = static_cast<int32_t>(1 + i % 60);
  StepOutput a = run(cached, turn1, 5);
  auto turn2 = turn1;
  turn2.insert(turn2.end(), a.tokens.begin(), a.tokens.end());
  turn2.insert(turn2.end(), {7, 8, 9});
  StepOutput b = run(cached, turn2, 3);
  // Snapshot at the end of turn 1's fed text: prompt + all answers but the last.
  EXPECT_EQ(b.result.cached_tokens, static_cast<int64_t>(turn1.size() + a.tokens.size() - 1));
  Engine cold(model, pool, nullptr);
  EXPECT_TRUE(bit_identical(run(cold, turn2, 3), b));
  EXPECT_GT(snaps.stats().hits, 0u);
  EXPECT_GT(snaps.stats().tokens_saved, 0u);
}

TEST(Snapshots, EditRestoresFromNearestEarlierCheckpoint) {
  ToyHybrid model(true);
  ThreadPool pool(1);
  PrefixCacheConfig pc;
  pc.block_tokens = 4;
  PrefixCache cache(model.state_spec(), pc);
  SnapshotConfig sc;
  sc.chunk_tokens = 4;
  sc.checkpoint_every_chunks = 2;  // checkpoints every 8 positions
  SnapshotStore snaps(model.state_spec(), sc);
  Engine cached(model, pool, &cache, {}, &snaps);
  std::vector<int32_t> p(40);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(1 + (i * 5) % 60);
  run(cached, p, 1);
  auto edited = p;
  edited[21] = 63;  // divergence at 21: nearest earlier checkpoint is 16, not 24
  StepOutput r = run(cached, edited, 2);
  EXPECT_EQ(r.result.cached_tokens, 16);
  Engine cold(model, pool, nullptr);
  EXPECT_TRUE(bit_identical(run(cold, edited, 2), r));
}

TEST(Snapshots, WithoutSnapshotsRecurrentModelsNeverReuse) {
  ToyHybrid model(true);
  ThreadPool pool(1);
  PrefixCache cache(model.state_spec(), {});
  Engine cached(model, pool, &cache);  // no SnapshotStore
  std::vector<int32_t> p(50, 3);
  run(cached, p, 2);
  StepOutput r = run(cached, p, 2);
  EXPECT_EQ(r.result.cached_tokens, 0);
  EXPECT_EQ(r.result.reuse.stop_reason, "recurrent-state-not-cached");
}

TEST(Snapshots, LimitsAreEnforced) {
  ToyHybrid model(false);
  SnapshotConfig sc;
  sc.max_entries = 3;
  SnapshotStore snaps(model.state_spec(), sc);
  PrefixCache cache(model.state_spec(), {});
  auto seq = cache.open(NamespaceKey{});
  std::vector<int32_t> toks(10, 5);
  for (int n = 1; n <= 6; ++n) snaps.put(seq->namespace_hash(), std::span<const int32_t>(toks).subspan(0, n), {}, *seq);
  EXPECT_EQ(snaps.stats().entries, 3u);
  EXPECT_EQ(snaps.stats().evictions, 3u);
  // The oldest (shortest) prefixes were evicted: only 4..6 remain.
  EXPECT_EQ(snaps.restore_longest(seq->namespace_hash(), toks, {}, 3, *seq), 0);
  EXPECT_EQ(snaps.restore_longest(seq->namespace_hash(), toks, {}, 10, *seq), 6);
  SnapshotConfig tiny;
  tiny.budget_bytes = 8;  // smaller than one entry: nothing is stored
  SnapshotStore none(model.state_spec(), tiny);
  none.put(seq->namespace_hash(), toks, {}, *seq);
  EXPECT_EQ(none.stats().entries, 0u);
}

}  // namespace
