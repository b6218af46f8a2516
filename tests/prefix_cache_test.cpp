// Prefix cache: randomized differential test (cache hit == cold run, bit for
// bit), isolation, copy-on-write, budgets and accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "greedy_run.h"
#include "model_fixtures.h"
#include "test_support.h"

using namespace reprise;
using reprise::testing_support::bit_identical;
using reprise::testing_support::run;
using reprise::testing_support::ConversationScript;
using reprise::testing_support::StepOutput;

namespace {

SyntheticModelSpec spec_for(const std::string& arch) {
  if (arch == "llama3") {
    // Llama 3.1's RoPE: frequency factors (rope_freqs.weight) over the tiny
    // shape, with a short original context so that scripts' positions turn
    // the slowed pairs measurably.
    SyntheticModelSpec s = synthetic_preset("tiny");
    s.n_vocab = 512;
    s.n_ctx = 1024;
    s.rope_freq_base = 500000.0f;
    s.rope_freq_factors = llama3_rope_freq_factors(s.head_dim, s.rope_freq_base, 8.0f, 1.0f, 4.0f, 64);
    return s;
  }
  SyntheticModelSpec s = synthetic_preset(arch == "llama" ? "tiny" : "tiny-" + arch);
  if (arch == "jamba") s.n_expert_used = std::min<int64_t>(s.n_expert_used, s.n_expert);
  s.n_vocab = 512;
  s.n_ctx = 1024;
  if (arch == "gemma3") {
    s.sliding_window = 12;  // short windows so scripts cross them
    s.sliding_window_pattern = 2;
  }
  if (arch == "llama") {
    s.dtype = DType::Q8_0;
    s.n_embd = 64;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 128;
    s.n_layer = 3;
  }
  return s;
}

Model& model_for(const std::string& arch) { return *test::synthetic_model("cache-" + arch, spec_for(arch)).model; }

class PrefixCacheDifferential : public ::testing::TestWithParam<std::string> {};

// Thousands of generated multi-turn steps: shared system prompts, appended
// turns (with the previous answer), edits in the middle, regenerations,
// interleaved conversations, tight budgets that force eviction. Every step's
// logits must equal a cold run's bit for bit, and after every script all
// references are released and the accounting matches the blocks.
void differential(Model& model, const std::string& name, const int kScripts) {
  ThreadPool pool(2);
  Engine cold(model, pool, nullptr);
  std::mt19937_64 rng(0x5eed ^ std::hash<std::string>()(name));
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = static_cast<int32_t>(rnd(3, model.info().n_vocab - 1));
    return v;
  };
  std::vector<std::vector<int32_t>> system_prompts;
  // Up to 90 tokens, so prompts cross position 64 where attention changes numerics.
  for (int i = 0; i < 3; ++i) system_prompts.push_back(random_tokens(rnd(5, 90)));

  int64_t steps = 0, reused_total = 0, hits = 0;
  for (int script = 0; script < kScripts; ++script) {
    PrefixCacheConfig cfg;
    cfg.block_tokens = std::vector<int>{4, 8, 16, 32}[rnd(0, 3)];
    PrefixCache probe(model.state_spec(), cfg);
    // Budgets from "a handful of blocks" (constant eviction) to generous.
    cfg.budget_bytes = probe.block_bytes() * std::vector<uint64_t>{3, 12, 40, 100000}[rnd(0, 3)];
    PrefixCache cache(model.state_spec(), cfg);
    // Recurrent models restore from snapshots checkpointed every few blocks.
    SnapshotConfig sc;
    sc.chunk_tokens = cfg.block_tokens;
    sc.checkpoint_every_chunks = static_cast<int>(rnd(0, 3));
    sc.max_entries = static_cast<size_t>(rnd(2, 64));
    SnapshotStore snapshots(model.state_spec(), sc);
    Engine engine(model, pool, &cache, {}, &snapshots);

    std::vector<std::vector<int32_t>> conversations;
    const int n_steps = static_cast<int>(rnd(4, 10));
    for (int s = 0; s < n_steps; ++s) {
      std::vector<int32_t> prompt;
      const int kind = conversations.empty() ? 0 : static_cast<int>(rnd(0, 3));
      if (kind == 0) {  // new conversation on a shared system prompt
        prompt = system_prompts[rnd(0, 2)];
        auto user = random_tokens(rnd(1, 20));
        prompt.insert(prompt.end(), user.begin(), user.end());
      } else {
        auto& base = conversations[rnd(0, conversations.size() - 1)];
        prompt = base;
        if (kind == 2) {  // edit in the middle: keep a random prefix
          prompt.resize(rnd(1, prompt.size()));
        }
        if (kind != 3) {  // kind 3 regenerates the exact same prompt
          auto user = random_tokens(rnd(1, 25));
          prompt.insert(prompt.end(), user.begin(), user.end());
        }
      }
      if (prompt.size() > 600) prompt.resize(600);
      const int n_gen = static_cast<int>(rnd(1, 6));
      StepOutput want = run(cold, prompt, n_gen);
      StepOutput got = run(engine, prompt, n_gen);
      ASSERT_TRUE(bit_identical(want, got))
          << "script " << script << " step " << s << " kind " << kind << " block " << cfg.block_tokens
          << " reuse: " << got.result.reuse.describe();
      ASSERT_EQ(got.result.cached_tokens, got.result.reuse.reused_tokens);
      // A recurrent model's reuse always ends exactly at a snapshot.
      if (model.state_spec().has_recurrent() && got.result.cached_tokens > 0) {
        ASSERT_GT(snapshots.stats().hits, 0u);
      }
      ASSERT_LT(got.result.cached_tokens, static_cast<int64_t>(prompt.size()));
      reused_total += got.result.cached_tokens;
      hits += got.result.cached_tokens > 0;
      ++steps;
      // The next turn includes this answer (all but the last sampled token's
      // state was computed and cached).
      std::vector<int32_t> next = prompt;
      next.insert(next.end(), got.tokens.begin(), got.tokens.end());
      conversations.push_back(next);
      std::string bad = cache.check_invariants();
      ASSERT_EQ(bad, "") << "after script " << script << " step " << s;
    }
    CacheStats st = cache.stats();
    EXPECT_EQ(st.blocks_in_use, 0u);
    EXPECT_LE(st.bytes, cfg.budget_bytes);
    EXPECT_EQ(cache.check_invariants(), "");
  }
  // The scripts are built to reuse: the test is only meaningful if they did.
  EXPECT_GT(hits, steps / 3) << "too few cache hits to exercise reuse";
  EXPECT_GT(reused_total, 0);
}

TEST_P(PrefixCacheDifferential, CachedEqualsCold) {
  // The fixture-sized gemma3 model is the slowest; it gets fewer scripts.
  differential(model_for(GetParam()), GetParam(), GetParam() == "gemma3" ? 80 : 300);
}

// The same on the real fixture files of ../shared (their full vocabularies).
class FixtureDifferential : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureDifferential, CachedEqualsCold) {
  REPRISE_REQUIRE_SHARED(fixtures);
  auto file = gguf::File::open(fixtures + "/models/" + GetParam() + ".gguf");
  auto model = load_model(*file);
  differential(*model, GetParam(), 25);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureDifferential,
                         ::testing::Values("llama-spm-f16", "llama-spm-Q4_0", "qwen2-gpt2-f16", "qwen3-gpt2-f16",
                                           "gemma3-spm-f16", "jamba-spm-f16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) if (c == '-') c = '_';
                           return n;
                         });

INSTANTIATE_TEST_SUITE_P(Archs, PrefixCacheDifferential,
                         ::testing::Values("llama", "llama3", "qwen2", "qwen3", "gemma3", "mamba", "mamba2", "jamba"));

// Attention scores are scaled by 1/sqrt(head_dim), but Gemma 3 27B's (its
// 62 layers identify it, as in llama.cpp) by 1/sqrt(n_embd / n_head): its
// query_pre_attn_scalar is 168 against a head_dim of 128.
TEST(AttentionScale, Gemma3TwentySevenBScalesByEmbeddingPerHead) {
  SyntheticModelSpec s = synthetic_preset("tiny-gemma3");
  s.n_embd = 32;
  s.n_head = 2;
  s.n_head_kv = 1;
  s.head_dim = 4;  // n_embd / n_head is 16
  s.n_ff = 32;
  s.n_vocab = 300;
  s.n_layer = 62;
  EXPECT_FLOAT_EQ(test::synthetic_model("gemma3-62-layers", s).model->info().attention_scale, 0.25f);
  s.n_layer = 26;
  EXPECT_FLOAT_EQ(test::synthetic_model("gemma3-26-layers", s).model->info().attention_scale, 0.5f);
  SyntheticModelSpec l = synthetic_preset("tiny");
  l.n_layer = 62;
  l.n_ctx = 256;
  EXPECT_FLOAT_EQ(test::synthetic_model("llama-62-layers", l).model->info().attention_scale,
                  1.0f / std::sqrt(static_cast<float>(l.head_dim)));
}

// Llama 3.1 files carry RoPE frequency factors (rope_freqs.weight). Factors
// of 2 everywhere are linear scaling by 2, exactly (a power of two), so the
// two files must give the same logits bit for bit through prefill, decode
// steps and cached turns: the factors reach every RoPE path. Llama 3's own
// factors give different logits from none.
TEST(RopeFrequencyFactors, AllTwoFactorsEqualLinearScalingByTwo) {
  SyntheticModelSpec base = synthetic_preset("tiny");
  base.n_ctx = 1024;
  base.seed = 31;
  SyntheticModelSpec twos = base, linear = base, llama3 = base;
  twos.rope_freq_factors.assign(static_cast<size_t>(base.head_dim / 2), 2.0f);
  linear.rope_linear_scaling = 2.0f;
  llama3.rope_freq_factors = llama3_rope_freq_factors(base.head_dim, base.rope_freq_base, 8.0f, 1.0f, 4.0f, 64);
  Model& m_twos = *test::synthetic_model("rope-factors-two", twos).model;
  Model& m_linear = *test::synthetic_model("rope-linear-two", linear).model;
  Model& m_llama3 = *test::synthetic_model("rope-factors-llama3", llama3).model;
  Model& m_plain = *test::synthetic_model("rope-plain", base).model;
  EXPECT_NE(m_twos.info().fingerprint, m_linear.info().fingerprint);  // different files, never one cache
  ThreadPool pool(2);
  PrefixCacheConfig cfg;
  cfg.block_tokens = 16;
  PrefixCache cache_twos(m_twos.state_spec(), cfg), cache_linear(m_linear.state_spec(), cfg);
  Engine e_twos(m_twos, pool, &cache_twos), e_linear(m_linear, pool, &cache_linear);
  Engine e_llama3(m_llama3, pool, nullptr), e_plain(m_plain, pool, nullptr);
  std::mt19937 rng(4);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(static_cast<int32_t>(3 + rng() % 1000));
  for (int turn = 0; turn < 2; ++turn) {  // the second turn is a prefix hit
    const StepOutput a = run(e_twos, prompt, 12), b = run(e_linear, prompt, 12);
    EXPECT_TRUE(bit_identical(a, b)) << "turn " << turn;
    if (turn == 1) {
      EXPECT_EQ(a.result.cached_tokens, static_cast<int64_t>(prompt.size()) - 1);
    }
  }
  const StepOutput with = run(e_llama3, prompt, 4), without = run(e_plain, prompt, 4);
  EXPECT_FALSE(bit_identical(with, without));

  // Llama 3.1 8B's factors (head 128, base 500000, factor 8, low 1, high 4,
  // original context 8192): fast pairs kept, slow ones slowed 8x, a smooth
  // ramp between.
  const std::vector<float> f = llama3_rope_freq_factors(128, 500000.0f, 8.0f, 1.0f, 4.0f, 8192);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f.front(), 1.0f);
  EXPECT_EQ(f.back(), 8.0f);
  EXPECT_TRUE(std::is_sorted(f.begin(), f.end()));
  EXPECT_GT(std::count_if(f.begin(), f.end(), [](float v) { return v > 1.0f && v < 8.0f; }), 0);
}

// Issue 6: turn 2 of a chat on each recurrent architecture restores turn 1's
// end-of-generation snapshot and matches a cold run bit for bit; an edit in
// the middle restores from the nearest earlier checkpoint.
class RecurrentReuse : public ::testing::TestWithParam<std::string> {};

// A prefix cache of 8-position blocks and a snapshot store of 8-position
// chunks with checkpoints every `checkpoint_every_chunks` chunks, for `model`.
struct CacheWithSnapshots {
  CacheWithSnapshots(const Model& model, int checkpoint_every_chunks)
      : cache(model.state_spec(), [] {
          PrefixCacheConfig c;
          c.block_tokens = 8;
          return c;
        }()),
        snapshots(model.state_spec(), [&] {
          SnapshotConfig c;
          c.chunk_tokens = 8;
          c.checkpoint_every_chunks = checkpoint_every_chunks;
          return c;
        }()) {}
  PrefixCache cache;
  SnapshotStore snapshots;
};

TEST_P(RecurrentReuse, TurnTwoAndMidConversationEdit) {
  Model& model = model_for(GetParam());
  ThreadPool pool(2);
  CacheWithSnapshots stores(model, 2);  // checkpoints every 16 positions
  PrefixCache& cache = stores.cache;
  SnapshotStore& snapshots = stores.snapshots;
  Engine engine(model, pool, &cache, {}, &snapshots);
  Engine cold(model, pool, nullptr);
  std::vector<int32_t> turn1(45);
  for (size_t i = 0; i < turn1.size(); ++i) turn1[i] = static_cast<int32_t>(3 + (i * 13) % 500);
  StepOutput a = run(engine, turn1, 6);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), a.tokens.begin(), a.tokens.end());
  turn2.insert(turn2.end(), {40, 41, 42, 43});
  StepOutput b = run(engine, turn2, 6);
  EXPECT_EQ(b.result.cached_tokens, static_cast<int64_t>(turn1.size() + a.tokens.size() - 1));
  EXPECT_TRUE(bit_identical(run(cold, turn2, 6), b));

  std::vector<int32_t> edited = turn1;
  edited[37] = 7;  // nearest earlier checkpoint: 32 (not 48)
  StepOutput c = run(engine, edited, 4);
  EXPECT_EQ(c.result.cached_tokens, 32);
  EXPECT_TRUE(bit_identical(run(cold, edited, 4), c));
  // The same prompt again (a regenerated reply): all but its last token,
  // from the snapshot taken one position before the prompt's end.
  StepOutput again = run(engine, edited, 4);
  EXPECT_EQ(again.result.cached_tokens, static_cast<int64_t>(edited.size()) - 1);
  EXPECT_TRUE(bit_identical(c, again));
  EXPECT_GT(snapshots.stats().tokens_saved, 0u);
  EXPECT_EQ(cache.check_invariants(), "");
}

INSTANTIATE_TEST_SUITE_P(Archs, RecurrentReuse, ::testing::Values("mamba", "mamba2", "jamba"));

// The snapshot one position before a prompt's end costs a one-token
// prefill batch: it is taken only when a later request could restore it
// (a store with room, a cache keeping the KV beside it) and it saves at
// least a chunk (checkpoints every 16 positions here, chunks of 8).
TEST(RecurrentSnapshots, EndOfPromptSnapshotOnlyWhenItCanServe) {
  Model& model = model_for("mamba");
  ThreadPool pool(2);
  std::vector<int32_t> prompt(45);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 11) % 500);
  auto passes_for = [&](uint64_t snapshot_budget, const std::vector<int32_t>& p) {
    CacheWithSnapshots stores(model, 2);
    SnapshotConfig sc = stores.snapshots.config();
    sc.budget_bytes = snapshot_budget;
    SnapshotStore snapshots(model.state_spec(), sc);
    Engine engine(model, pool, &stores.cache, {}, &snapshots);
    run(engine, p, 1);
    return engine.pass_stats().passes;
  };
  // Batches end at the checkpoints 16 and 32, then at 44 only when useful.
  EXPECT_EQ(passes_for(256ull << 20, prompt), 4u);
  EXPECT_EQ(passes_for(0, prompt), 3u);
  // 37 positions: 36 is within a chunk of the checkpoint at 32.
  EXPECT_EQ(passes_for(256ull << 20, std::vector<int32_t>(prompt.begin(), prompt.begin() + 37)), 3u);
}



// Prompt log-probabilities (the server's echo): every prompt position's
// logits, in order. Such a request reuses no cached prefix, so on a warm
// cache it gives exactly what a cold engine gives (prompt logits and the
// decode steps after them, bit for bit); each row is the next-token logits
// of the prompt cut after that position (to rounding: the rows come from
// one batch); and its positions enter the cache for later requests.
class PromptLogits : public ::testing::TestWithParam<std::string> {};

struct PromptLogitsRun {
  StepOutput steps;
  std::vector<int64_t> positions;
  std::vector<std::vector<float>> rows;
};

PromptLogitsRun run_with_prompt_logits(Engine& engine, const std::vector<int32_t>& prompt, int n_gen) {
  GenerateRequest req;
  req.prompt = prompt;
  req.sampling.temperature = 0;
  req.max_tokens = n_gen;
  PromptLogitsRun out;
  req.on_prompt_logits = [&](int64_t position, std::span<const float> logits) {
    out.positions.push_back(position);
    out.rows.emplace_back(logits.begin(), logits.end());
  };
  out.steps.result = engine.generate(req, [&](int32_t tok, std::span<const float> logits) {
    out.steps.tokens.push_back(tok);
    out.steps.logits.emplace_back(logits.begin(), logits.end());
    return true;
  });
  return out;
}

TEST_P(PromptLogits, EqualAColdRunWarmCacheOrNotAndFillTheCache) {
  Model& model = model_for(GetParam());
  ThreadPool pool(2);
  CacheWithSnapshots stores(model, SnapshotConfig{}.checkpoint_every_chunks);
  PrefixCache& cache = stores.cache;
  SnapshotStore& snapshots = stores.snapshots;
  EngineOptions options;
  options.n_batch = 24;  // prompts cross several chunks
  Engine engine(model, pool, &cache, options, &snapshots);
  Engine cold(model, pool, nullptr, options);
  std::mt19937 rng(0xec40 ^ static_cast<unsigned>(std::hash<std::string>()(GetParam())));
  ConversationScript script(rng, 40, static_cast<int>(model.info().n_vocab) - 1);
  int warm = 0;
  for (int round = 0; round < 10; ++round) {
    const std::vector<int32_t> prompt = script.next_prompt();
    // Warm the cache with the prompt's prefix first (an ordinary request).
    if (prompt.size() > 2) run(engine, std::vector<int32_t>(prompt.begin(), prompt.end() - 1), 2);
    const PromptLogitsRun got = run_with_prompt_logits(engine, prompt, 4);
    const PromptLogitsRun want = run_with_prompt_logits(cold, prompt, 4);
    EXPECT_EQ(got.steps.result.cached_tokens, 0);
    ASSERT_EQ(got.positions.size(), prompt.size() - 1) << "round " << round;
    for (size_t p = 0; p < got.positions.size(); ++p) ASSERT_EQ(got.positions[p], static_cast<int64_t>(p));
    ASSERT_EQ(got.rows.size(), want.rows.size());
    for (size_t p = 0; p < got.rows.size(); ++p)
      ASSERT_EQ(0, std::memcmp(got.rows[p].data(), want.rows[p].data(), got.rows[p].size() * sizeof(float)))
          << "round " << round << " position " << p;
    EXPECT_TRUE(bit_identical(got.steps, want.steps)) << "round " << round;
    // Without prompt logits the same request decodes the same way.
    EXPECT_EQ(run(cold, prompt, 4).tokens, got.steps.tokens);
    // Row p is what the prompt cut after position p predicts.
    for (size_t p : {size_t{0}, got.rows.size() / 2, got.rows.size() - 1}) {
      if (p >= got.rows.size()) continue;
      const StepOutput cut = run(cold, std::vector<int32_t>(prompt.begin(), prompt.begin() + p + 1), 1);
      const std::vector<float>& a = got.rows[p];
      const std::vector<float>& b = cut.logits[0];
      ASSERT_EQ(a.size(), b.size());
      float scale = 0, diff = 0;
      for (size_t v = 0; v < a.size(); ++v) {
        scale = std::max(scale, std::abs(b[v]));
        diff = std::max(diff, std::abs(a[v] - b[v]));
      }
      EXPECT_LE(diff, 1e-3f * std::max(scale, 1.0f)) << "round " << round << " position " << p;
      EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin());
    }
    script.record(prompt, got.steps.tokens);
    // Its positions are in the cache: the same prompt again reuses them.
    if (prompt.size() > 2 * static_cast<size_t>(cache.block_tokens())) {
      const StepOutput again = run(engine, prompt, 4);
      EXPECT_GT(again.result.cached_tokens, 0) << "round " << round;
      EXPECT_TRUE(bit_identical(again, want.steps)) << "round " << round;
      ++warm;
    }
    ASSERT_EQ(cache.check_invariants(), "");
  }
  EXPECT_GT(warm, 2);
  EXPECT_EQ(cache.stats().blocks_in_use, 0u);
}

INSTANTIATE_TEST_SUITE_P(Archs, PromptLogits, ::testing::Values("llama", "qwen3", "gemma3", "mamba", "jamba"));

// Hidden states (the server's embeddings): the last prompt position's
// final-norm hidden state, computed after a cached prefix, is bit for bit
// what a cold engine computes; every position's (which reuses nothing) is
// the same warm or cold, ends with the last position's, and row p is the
// last hidden state of the prompt cut after p (to rounding: one batch).
// Such a request generates nothing and leaves its prompt in the cache.
class HiddenStates : public ::testing::TestWithParam<std::string> {};

struct HiddenRun {
  GenerateResult result;
  std::vector<float> hidden;
};

HiddenRun run_hidden(Engine& engine, const std::vector<int32_t>& prompt, bool all) {
  GenerateRequest req;
  req.prompt = prompt;
  HiddenRun out;
  req.on_hidden = [&](std::span<const float> rows) { out.hidden.insert(out.hidden.end(), rows.begin(), rows.end()); };
  req.hidden_all = all;
  out.result = engine.generate(req, [](int32_t, std::span<const float>) {
    ADD_FAILURE() << "an embeddings request sampled a token";
    return false;
  });
  return out;
}

TEST_P(HiddenStates, LastAfterACachedPrefixEqualsColdAndRowsArePrefixes) {
  Model& model = model_for(GetParam());
  const size_t n_embd = static_cast<size_t>(model.info().n_embd);
  ThreadPool pool(2);
  CacheWithSnapshots stores(model, SnapshotConfig{}.checkpoint_every_chunks);
  PrefixCache& cache = stores.cache;
  EngineOptions options;
  options.n_batch = 24;
  Engine engine(model, pool, &cache, options, &stores.snapshots);
  Engine cold(model, pool, nullptr, options);
  std::mt19937 rng(0x4e1d ^ static_cast<unsigned>(std::hash<std::string>()(GetParam())));
  ConversationScript script(rng, 40, static_cast<int>(model.info().n_vocab) - 1);
  int reused = 0;
  for (int round = 0; round < 8; ++round) {
    const std::vector<int32_t> prompt = script.next_prompt();
    if (prompt.size() > 2) run(engine, std::vector<int32_t>(prompt.begin(), prompt.end() - 1), 2);
    const HiddenRun warm = run_hidden(engine, prompt, false);
    const HiddenRun want = run_hidden(cold, prompt, false);
    ASSERT_EQ(warm.hidden.size(), n_embd);
    ASSERT_EQ(want.hidden.size(), n_embd);
    EXPECT_EQ(0, std::memcmp(warm.hidden.data(), want.hidden.data(), n_embd * sizeof(float))) << "round " << round;
    EXPECT_EQ(warm.result.finish_reason, "stop");
    EXPECT_TRUE(warm.result.tokens.empty());
    reused += warm.result.cached_tokens > 0;

    const HiddenRun all = run_hidden(engine, prompt, true);
    const HiddenRun all_cold = run_hidden(cold, prompt, true);
    EXPECT_EQ(all.result.cached_tokens, 0);
    ASSERT_EQ(all.hidden.size(), prompt.size() * n_embd);
    EXPECT_EQ(0, std::memcmp(all.hidden.data(), all_cold.hidden.data(), all.hidden.size() * sizeof(float)));
    for (size_t p : {size_t{0}, prompt.size() / 2, prompt.size() - 1}) {
      const HiddenRun cut = run_hidden(cold, std::vector<int32_t>(prompt.begin(), prompt.begin() + p + 1), false);
      float scale = 0, diff = 0;
      for (size_t i = 0; i < n_embd; ++i) {
        scale = std::max(scale, std::abs(cut.hidden[i]));
        diff = std::max(diff, std::abs(all.hidden[p * n_embd + i] - cut.hidden[i]));
      }
      EXPECT_LE(diff, 1e-3f * std::max(scale, 1.0f)) << "round " << round << " position " << p;
    }
    // The prompt is in the cache: a reply to it reuses all but its last token.
    if (prompt.size() > 2 * static_cast<size_t>(cache.block_tokens())) {
      EXPECT_GT(run(engine, prompt, 1).result.cached_tokens, 0) << "round " << round;
    }
    script.record(prompt, {});
    ASSERT_EQ(cache.check_invariants(), "");
  }
  EXPECT_GT(reused, 3);
  EXPECT_EQ(cache.stats().blocks_in_use, 0u);
}

INSTANTIATE_TEST_SUITE_P(Archs, HiddenStates, ::testing::Values("llama", "qwen3", "gemma3", "mamba", "jamba"));

TEST(PrefixCache, TurnTwoReusesTurnOneIncludingItsAnswer) {
  Model& model = model_for("qwen3");
  ThreadPool pool(2);
  PrefixCacheConfig cfg;
  cfg.block_tokens = 16;
  PrefixCache cache(model.state_spec(), cfg);
  Engine engine(model, pool, &cache);
  std::vector<int32_t> turn1(70);
  for (size_t i = 0; i < turn1.size(); ++i) turn1[i] = static_cast<int32_t>(10 + i * 7 % 400);
  StepOutput a = run(engine, turn1, 8);
  EXPECT_EQ(a.result.cached_tokens, 0);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), a.tokens.begin(), a.tokens.end());
  for (int i = 0; i < 20; ++i) turn2.push_back(100 + i);
  StepOutput b = run(engine, turn2, 4);
  // Everything but the last sampled token (never fed back) is reused.
  EXPECT_EQ(b.result.cached_tokens, static_cast<int64_t>(turn1.size() + a.tokens.size() - 1));
  Engine cold(model, pool, nullptr);
  EXPECT_TRUE(bit_identical(run(cold, turn2, 4), b));
}

TEST(PrefixCache, IsolationByFingerprintAndSalt) {
  Model& model = model_for("llama");
  ThreadPool pool(2);
  PrefixCache cache(model.state_spec(), {});
  std::vector<int32_t> prompt(50, 42);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(5 + i);
  Engine engine(model, pool, &cache);
  run(engine, prompt, 2, "tenant-a");
  EXPECT_GT(run(engine, prompt, 2, "tenant-a").result.cached_tokens, 0);
  StepOutput other_salt = run(engine, prompt, 2, "tenant-b");
  EXPECT_EQ(other_salt.result.cached_tokens, 0);
  EXPECT_EQ(other_salt.result.reuse.stop_reason, "empty-namespace");

  // Same tokens under another model fingerprint never hit.
  NamespaceKey ns = engine.namespace_for("tenant-a");
  ns.model_fingerprint[0] ^= 1;
  auto seq = cache.open(ns);
  EXPECT_EQ(seq->attach_prefix(prompt).reused_tokens, 0);
  NamespaceKey adapter = engine.namespace_for("tenant-a");
  adapter.adapter_id = "lora-x";
  auto seq2 = cache.open(adapter);
  EXPECT_EQ(seq2->attach_prefix(prompt).reused_tokens, 0);
  NamespaceKey same = engine.namespace_for("tenant-a");
  auto seq3 = cache.open(same);
  EXPECT_GT(seq3->attach_prefix(prompt).reused_tokens, 0);
}

TEST(PrefixCache, CopyOnWriteOfSharedPartialBlock) {
  Model& model = model_for("gemma3");
  ThreadPool pool(2);
  PrefixCacheConfig cfg;
  cfg.block_tokens = 8;
  PrefixCache cache(model.state_spec(), cfg);
  Engine engine(model, pool, &cache);
  Engine cold(model, pool, nullptr);
  // 11 tokens: one full block + a 3-token partial tail (the last sampled token is not fed).
  std::vector<int32_t> base = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  StepOutput first = run(engine, base, 1);
  // Two continuations share the partial tail and then diverge inside it.
  std::vector<int32_t> x = base, y = base;
  x.insert(x.end(), {100, 101, 102});
  y.insert(y.end(), {200, 201, 202});
  auto sx = cache.open(engine.namespace_for(""));
  auto sy = cache.open(engine.namespace_for(""));
  ReuseReport rx = sx->attach_prefix(x), ry = sy->attach_prefix(y);
  EXPECT_EQ(rx.reused_tokens, 11);
  EXPECT_EQ(ry.reused_tokens, 11);
  EXPECT_GE(cache.stats().blocks_shared, 2u);
  std::vector<float> lx, ly;
  for (auto pair : {std::make_pair(sx.get(), &x), std::make_pair(sy.get(), &y)}) {
    CachedSequence* seq = pair.first;
    const auto& toks = *pair.second;
    ForwardBatch b;
    b.tokens = std::span<const int32_t>(toks).subspan(11);
    b.pos0 = 11;
    seq->prepare(11, toks.size());
    model.forward(b, *seq, seq == sx.get() ? lx : ly, pool);
    seq->commit(b.tokens);
  }
  EXPECT_GE(cache.stats().copies_on_write, 2u);
  StepOutput cx = run(cold, x, 1), cy = run(cold, y, 1);
  ASSERT_EQ(lx.size(), cx.logits[0].size());
  EXPECT_EQ(std::memcmp(lx.data(), cx.logits[0].data(), lx.size() * 4), 0);
  EXPECT_EQ(std::memcmp(ly.data(), cy.logits[0].data(), ly.size() * 4), 0);
  sx.reset();
  sy.reset();
  // The original partial block was not modified by either writer.
  std::vector<int32_t> z = base;
  z.push_back(300);
  StepOutput cz = run(cold, z, 1), gz = run(engine, z, 1);
  EXPECT_EQ(gz.result.cached_tokens, 11);
  EXPECT_TRUE(bit_identical(cz, gz));
  EXPECT_EQ(cache.check_invariants(), "");
}

// Speculative positions (hold_index_from) fill blocks that are indexed only
// once settled, so a rejected proposal never becomes a prefix; a sequence
// released while holding forgets its tentative positions.
TEST(PrefixCache, HeldPositionsAreIndexedOnlyOnceSettled) {
  Model& model = model_for("gemma3");
  PrefixCacheConfig cfg;
  cfg.block_tokens = 4;
  PrefixCache cache(model.state_spec(), cfg);
  NamespaceKey ns;
  ns.model_fingerprint = model.info().fingerprint;
  std::vector<int32_t> tokens(24);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(10 + i);
  const std::span<const int32_t> all(tokens);
  auto reused = [&](size_t n) {  // the cached prefix of tokens[0, n)
    auto probe = cache.open(ns);
    return probe->attach_prefix(all.first(n)).reused_tokens;
  };
  auto s = cache.open(ns);
  s->prepare(0, 10);
  s->commit(all.first(10));
  s->hold_index_from(10);
  s->prepare(10, 18);
  s->commit(all.subspan(10, 8));  // fills blocks [8, 12) and [12, 16)
  EXPECT_EQ(reused(20), 8);
  s->truncate(13);  // proposals from position 13 on rejected
  s->settle();
  EXPECT_EQ(reused(20), 12);  // [8, 12) is indexed now; the rest was never
  s->hold_index_from(13);
  s->prepare(13, 20);
  s->commit(all.subspan(13, 7));
  EXPECT_EQ(reused(20), 12);
  EXPECT_EQ(cache.stats().copies_on_write, 0u);
  s.reset();  // released while holding: only positions before 13 stay
  EXPECT_EQ(reused(24), 13);
  EXPECT_EQ(cache.stats().blocks_in_use, 0u);
  EXPECT_EQ(cache.stats().blocks, 4u);
  EXPECT_EQ(cache.check_invariants(), "");
}

// Every (layer, KV head)'s keys and values of a block have their own bytes
// (a write to one never reaches another) and together fill the block, and a
// head's values follow its keys, so decode attention reads one run of
// memory per head and block.
TEST(PrefixCache, BlockHoldsEachHeadsKeysThenValuesApart) {
  StateSpec spec;
  spec.layers.push_back({LayerStateKind::Attention, 2, 64, 64});
  spec.layers.push_back({LayerStateKind::Recurrent, 0, 0, 0, 0, 12, 48});
  spec.layers.push_back({LayerStateKind::Attention, 3, 32, 48});
  PrefixCacheConfig cfg;
  cfg.block_tokens = 32;
  PrefixCache cache(spec, cfg);
  auto seq = cache.open(NamespaceKey{});
  seq->prepare(0, 64);
  for (int64_t p0 : {0, 32}) {
    const uint16_t* block = seq->key(0, p0);  // layer 0's first head starts the block
    // Half-open runs of each (layer, head, keys or values), in halfs from the block's start.
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (int layer : {0, 2}) {
      const LayerStateSpec& l = spec.layers[layer];
      const int64_t stride = seq->kv_head_stride(layer);
      for (int64_t j = 0; j < l.n_kv_heads; ++j) {
        const int64_t k0 = seq->key(layer, p0) + j * stride - block;
        const int64_t v0 = seq->value(layer, p0) + j * stride - block;
        EXPECT_EQ(v0, k0 + 32 * l.head_dim_k) << "layer " << layer << " head " << j;
        EXPECT_EQ(seq->value(layer, p0 + 5) + j * stride - block, v0 + 5 * l.head_dim_v);
        runs.push_back({k0, k0 + 32 * l.head_dim_k});
        runs.push_back({v0, v0 + 32 * l.head_dim_v});
      }
    }
    std::sort(runs.begin(), runs.end());
    EXPECT_EQ(runs.front().first, 0);
    for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i].first, runs[i - 1].second) << "run " << i;
    EXPECT_EQ(runs.back().second, 32 * (2 * (64 + 64) + 3 * (32 + 48)));
  }
}

TEST(PrefixCache, BudgetZeroDisablesCaching) {
  Model& model = model_for("llama");
  ThreadPool pool(1);
  PrefixCacheConfig cfg;
  cfg.budget_bytes = 0;
  PrefixCache cache(model.state_spec(), cfg);
  Engine engine(model, pool, &cache);
  std::vector<int32_t> p(40, 9);
  run(engine, p, 2);
  StepOutput again = run(engine, p, 2);
  EXPECT_EQ(again.result.cached_tokens, 0);
  EXPECT_EQ(again.result.reuse.stop_reason, "disabled");
  EXPECT_EQ(cache.stats().blocks, 0u);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(PrefixCache, EvictionNeverTouchesBlocksInUse) {
  Model& model = model_for("qwen2");
  ThreadPool pool(1);
  PrefixCacheConfig cfg;
  cfg.block_tokens = 4;
  PrefixCache probe(model.state_spec(), cfg);
  cfg.budget_bytes = probe.block_bytes() * 4;
  PrefixCache cache(model.state_spec(), cfg);
  Engine engine(model, pool, &cache);
  std::vector<int32_t> p(30);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(20 + i);
  // A live sequence holding more blocks than the budget keeps all of them.
  auto live = cache.open(engine.namespace_for(""));
  live->attach_prefix(p);
  live->prepare(0, p.size());
  std::vector<float> logits;
  ForwardBatch b;
  b.tokens = p;
  model.forward(b, *live, logits, pool);
  live->commit(p);
  EXPECT_EQ(cache.stats().blocks_in_use, 8u);
  // Another request churns the cache; the live sequence's blocks stay.
  std::vector<int32_t> q(30, 77);
  run(engine, q, 3);
  EXPECT_EQ(cache.stats().blocks_in_use, 8u);
  EXPECT_EQ(cache.check_invariants(), "");
  live.reset();
  EXPECT_LE(cache.stats().bytes, cfg.budget_bytes);
  EXPECT_GT(cache.stats().evictions, 0u);
  EXPECT_EQ(cache.check_invariants(), "");
}

TEST(PrefixCache, ReportsWhyReuseStopped) {
  Model& model = model_for("qwen3");
  ThreadPool pool(1);
  PrefixCacheConfig cfg;
  cfg.block_tokens = 4;
  PrefixCache cache(model.state_spec(), cfg);
  Engine engine(model, pool, &cache);
  std::vector<int32_t> p = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  run(engine, p, 1);
  std::vector<int32_t> edited = p;
  edited[6] = 99;
  StepOutput r = run(engine, edited, 1);
  EXPECT_EQ(r.result.reuse.stop_reason, "divergence");
  EXPECT_EQ(r.result.reuse.stop_position, 6);
  EXPECT_EQ(r.result.cached_tokens, 6);
  StepOutput full = run(engine, p, 1);
  EXPECT_EQ(full.result.reuse.stop_reason, "full");
  EXPECT_EQ(full.result.cached_tokens, 9);
}

}  // namespace
