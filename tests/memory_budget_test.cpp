// One memory budget over the cache tiers: prefix-cache KV blocks, recurrent
// snapshots and encoder outputs compete by last use, the total stays within
// the limit whenever no sequence pins blocks, and a cache hit under that
// pressure still equals a cold run bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cache/memory_budget.h"
#include "cache/prefix_cache.h"
#include "cache/snapshot_store.h"
#include "engine/engine.h"
#include "greedy_run.h"
#include "toy_hybrid.h"
#include "vision/encoder_cache.h"

using namespace reprise;
using reprise::testing_support::bit_identical;
using reprise::testing_support::run;
using reprise::testing_support::StepOutput;
using reprise::testing_support::ToyHybrid;

namespace {

// Stores an embedding of n floats under key k (the encoder "runs" once).
void add_image(EncoderCache& cache, uint64_t k, int64_t n) {
  cache.get_or_encode(Hash128{k, 7}, n, 1, [n] { return std::vector<float>(n, 0.5f); });
}

std::vector<int32_t> tokens(int n, int seed) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(1 + (i * 7 + seed * 13) % 63);
  return v;
}

}  // namespace

TEST(SharedBudget, LeastRecentlyUsedTierLosesFirst) {
  ToyHybrid model(true);
  ThreadPool pool(1);
  PrefixCacheConfig pc;
  pc.block_tokens = 8;
  pc.budget_bytes = 1 << 30;  // per-tier limits out of the way: only the shared one binds
  PrefixCache kv(model.state_spec(), pc);
  EncoderCache images(1 << 30);
  constexpr int64_t kFloats = 100;
  const uint64_t image_bytes = kFloats * sizeof(float) + sizeof(ImageEmbedding);
  MemoryBudget budget(64 * kv.block_bytes());
  kv.share_budget(&budget);
  images.share_budget(&budget);
  ASSERT_GT(8 * image_bytes, 4 * kv.block_bytes()) << "8 images and 60 blocks must not fit together";

  // Old images first, then a conversation of 60 blocks.
  for (uint64_t i = 0; i < 8; ++i) add_image(images, i, kFloats);
  ASSERT_EQ(images.stats().entries, 8u);
  Engine engine(model, pool, &kv);
  run(engine, tokens(8 * 60, 1), 1);
  EXPECT_LE(budget.used_bytes(), budget.limit_bytes());
  // The images were older than every KV block: they went first, and no block did.
  EXPECT_GT(images.stats().evictions, 0u);
  EXPECT_EQ(kv.stats().evictions, 0u);
  EXPECT_GT(budget.evictions(), 0u);

  // Now the conversation is the old data: fresh images push its blocks out.
  const uint64_t blocks_before = kv.stats().blocks;
  for (uint64_t i = 100; i < 120; ++i) add_image(images, i, kFloats);
  EXPECT_LE(budget.used_bytes(), budget.limit_bytes());
  EXPECT_GT(kv.stats().evictions, 0u);
  EXPECT_LT(kv.stats().blocks, blocks_before);
  EXPECT_EQ(images.find(Hash128{0, 7}), nullptr) << "an old image outlived newer KV blocks";
  for (uint64_t i = 100; i < 120; ++i) EXPECT_NE(images.find(Hash128{i, 7}), nullptr) << "image " << i;
  EXPECT_EQ(kv.check_invariants(), "");

  // Image 100 is used again, so it is newer than 101..119. Adding images
  // until ten more than fit must evict every KV block and then 101..110.
  ASSERT_NE(images.find(Hash128{100, 7}), nullptr);
  const uint64_t fit = budget.limit_bytes() / image_bytes;
  for (uint64_t i = 0; i < fit - 10; ++i) add_image(images, 1000 + i, kFloats);
  EXPECT_EQ(kv.stats().blocks, 0u);
  EXPECT_NE(images.find(Hash128{100, 7}), nullptr) << "a recently used entry was evicted before older ones";
  EXPECT_EQ(images.find(Hash128{101, 7}), nullptr);
  EXPECT_EQ(images.find(Hash128{110, 7}), nullptr);
  EXPECT_NE(images.find(Hash128{1000 + fit - 11, 7}), nullptr);
  EXPECT_LE(budget.used_bytes(), budget.limit_bytes());
}

TEST(SharedBudget, BudgetAndStoresMayBeDestroyedInAnyOrder) {
  ToyHybrid model(true);
  PrefixCache kv(model.state_spec(), PrefixCacheConfig{});
  EncoderCache images(1 << 20);
  {
    MemoryBudget budget(1 << 20);
    kv.share_budget(&budget);
    images.share_budget(&budget);
    add_image(images, 1, 10);
    EXPECT_GT(budget.used_bytes(), 0u);
  }
  // The budget is gone: the stores keep working under their own limits.
  add_image(images, 2, 10);
  EXPECT_EQ(images.stats().entries, 2u);
  auto seq = kv.open(NamespaceKey{});
  seq->prepare(0, 64);
  EXPECT_GT(kv.stats().blocks, 0u);
}

TEST(SharedBudget, LiveBlocksAreNeverEvictedAndTiersLeaveOnDestruction) {
  ToyHybrid model(true);
  ThreadPool pool(1);
  PrefixCacheConfig pc;
  pc.block_tokens = 8;
  MemoryBudget budget(4 * 1024);
  {
    PrefixCache kv(model.state_spec(), pc);
    kv.share_budget(&budget);
    auto seq = kv.open(NamespaceKey{});
    seq->prepare(0, 8 * 40);  // far past the shared limit, but held by a live sequence
    EXPECT_GT(budget.used_bytes(), budget.limit_bytes());
    EXPECT_EQ(kv.stats().blocks, 40u);
    EXPECT_EQ(kv.stats().evictions, 0u);
  }
  EXPECT_EQ(budget.used_bytes(), 0u) << "a destroyed cache must leave the budget";
}

// Cached-vs-cold under a small shared budget: KV blocks, snapshots and
// encoder entries evict each other at random points of random multi-turn
// scripts (with edits); every turn must still equal a cold run bit for bit.
TEST(SharedBudget, RandomizedCachedEqualsColdUnderCrossTierEviction) {
  ToyHybrid model(true);
  ThreadPool pool(1);
  Engine cold(model, pool, nullptr);
  std::mt19937 rng(2026);
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int64_t reused = 0;
  uint64_t kv_evictions = 0, snapshot_evictions = 0, image_evictions = 0;
  for (int script = 0; script < 150; ++script) {
    PrefixCacheConfig pc;
    pc.block_tokens = std::vector<int>{4, 8, 16}[rnd(0, 2)];
    pc.budget_bytes = 1 << 30;
    PrefixCache kv(model.state_spec(), pc);
    SnapshotConfig sc;
    sc.chunk_tokens = pc.block_tokens;
    sc.checkpoint_every_chunks = rnd(0, 2);
    SnapshotStore snaps(model.state_spec(), sc);
    EncoderCache images(1 << 30);
    MemoryBudget budget(static_cast<uint64_t>(rnd(4, 40)) * kv.block_bytes());
    kv.share_budget(&budget);
    snaps.share_budget(&budget);
    images.share_budget(&budget);
    Engine cached(model, pool, &kv, {}, &snaps);
    testing_support::ConversationScript traffic(rng, 40, 63);
    for (int step = 0; step < 8; ++step) {
      if (rnd(0, 2) == 0) add_image(images, static_cast<uint64_t>(rnd(0, 5)), rnd(10, 400));
      const std::vector<int32_t> prompt = traffic.next_prompt();
      const int n_gen = rnd(1, 5);
      StepOutput want = run(cold, prompt, n_gen), got = run(cached, prompt, n_gen);
      ASSERT_TRUE(bit_identical(want, got)) << "script " << script << " step " << step << ": " << got.result.reuse.describe();
      reused += got.result.cached_tokens;
      traffic.record(prompt, got.tokens);
      ASSERT_EQ(kv.check_invariants(), "");
      // No sequence is live between turns: everything is evictable.
      ASSERT_LE(budget.used_bytes(), budget.limit_bytes()) << "script " << script << " step " << step;
    }
    kv_evictions += kv.stats().evictions;
    snapshot_evictions += snaps.stats().evictions;
    image_evictions += images.stats().evictions;
  }
  EXPECT_GT(reused, 0);
  // The budget really made the tiers compete.
  EXPECT_GT(kv_evictions, 0u);
  EXPECT_GT(snapshot_evictions, 0u);
  EXPECT_GT(image_evictions, 0u);
}
