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
#include "toy_hybrid.h"

using namespace reprise;
using reprise::testing_support::ToyHybrid;

namespace {

struct Out {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  GenerateResult result;
};

Out run(Engine& e, const std::vector<int32_t>& prompt, int n_gen) {
  GenerateRequest req;
  req.prompt = prompt;
  req.sampling.temperature = 0;
  req.max_tokens = n_gen;
  Out o;
  o.result = e.generate(req, [&](int32_t t, std::span<const float> l) {
    o.tokens.push_back(t);
    o.logits.emplace_back(l.begin(), l.end());
    return true;
  });
  return o;
}

bool same(const Out& a, const Out& b) {
  if (a.tokens != b.tokens || a.logits.size() != b.logits.size()) return false;
  for (size_t i = 0; i < a.logits.size(); ++i)
    if (std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * 4) != 0) return false;
  return true;
}

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
    std::vector<std::vector<int32_t>> convs;
    for (int step = 0; step < 6; ++step) {
      std::vector<int32_t> prompt;
      if (!convs.empty() && rnd(0, 3) > 0) {
        prompt = convs[rnd(0, static_cast<int>(convs.size()) - 1)];
        if (rnd(0, 2) == 0) prompt.resize(rnd(1, static_cast<int>(prompt.size())));  // edit
      }
      for (int i = rnd(1, 30); i > 0; --i) prompt.push_back(rnd(1, 63));
      const int n_gen = rnd(1, 5);
      Out want = run(cold, prompt, n_gen), got = run(cached, prompt, n_gen);
      ASSERT_TRUE(same(want, got)) << "script " << script << " step " << step << ": " << got.result.reuse.describe();
      reused += got.result.cached_tokens;
      auto next = prompt;
      next.insert(next.end(), got.tokens.begin(), got.tokens.end());
      convs.push_back(next);
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
  Out a = run(cached, turn1, 5);
  auto turn2 = turn1;
  turn2.insert(turn2.end(), a.tokens.begin(), a.tokens.end());
  turn2.insert(turn2.end(), {7, 8, 9});
  Out b = run(cached, turn2, 3);
  // Snapshot at the end of turn 1's fed text: prompt + all answers but the last.
  EXPECT_EQ(b.result.cached_tokens, static_cast<int64_t>(turn1.size() + a.tokens.size() - 1));
  Engine cold(model, pool, nullptr);
  EXPECT_TRUE(same(run(cold, turn2, 3), b));
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
  Out r = run(cached, edited, 2);
  EXPECT_EQ(r.result.cached_tokens, 16);
  Engine cold(model, pool, nullptr);
  EXPECT_TRUE(same(run(cold, edited, 2), r));
}

TEST(Snapshots, WithoutSnapshotsRecurrentModelsNeverReuse) {
  ToyHybrid model(true);
  ThreadPool pool(1);
  PrefixCache cache(model.state_spec(), {});
  Engine cached(model, pool, &cache);  // no SnapshotStore
  std::vector<int32_t> p(50, 3);
  run(cached, p, 2);
  Out r = run(cached, p, 2);
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
