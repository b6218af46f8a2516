// Continuous batching: several sequences' work (decode steps, prompt chunks)
// in one forward pass gives exactly (bit for bit) the logits and state each
// sequence gets alone, for every architecture and weight type; concurrent
// engine requests (also ones arriving while others decode) generate what they
// generate alone, and what shared passes leave in the cache serves later hits
// exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <latch>
#include <random>
#include <thread>

#include "cache/prefix_cache.h"
#include "cache/snapshot_store.h"
#include "engine/pass_batcher.h"
#include "engine/engine.h"
#include "engine/flat_memory.h"
#include "model_fixtures.h"
#include "test_support.h"
#include "util/error.h"

using namespace reprise;

namespace {

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Randomized differential check of Model::forward_steps against forward():
// `n_seq` sequences with random prompts are prefilled twice (reference and
// batched memories); then in each round a random subset, in random order,
// advances by one random token in one forward_steps pass, and each of those
// steps is also run alone on the reference memory. Logits must match exactly.
void check_steps_match_single(Model& model, uint64_t seed, int n_seq, int rounds, ThreadPool& pool) {
  std::mt19937_64 rng(seed);
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t n_vocab = model.info().n_vocab;
  auto [ref, bat, pos] = test::prefill_pairs(model, rng, n_seq, 1, 40, pool);
  std::vector<float> logits, alone;
  for (int r = 0; r < rounds; ++r) {
    std::vector<int> order(n_seq);
    for (int s = 0; s < n_seq; ++s) order[s] = s;
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(rnd(1, n_seq));
    std::vector<SequenceStep> steps;
    for (int s : order) steps.push_back({static_cast<int32_t>(rnd(3, n_vocab - 1)), pos[s], bat[s].get()});
    model.forward_steps(steps, logits, pool);
    ASSERT_EQ(logits.size(), steps.size() * n_vocab);
    for (size_t i = 0; i < steps.size(); ++i) {
      const int s = order[i];
      ForwardBatch b;
      b.tokens = std::span<const int32_t>(&steps[i].token, 1);
      b.pos0 = pos[s];
      model.forward(b, *ref[s], alone, pool);
      ASSERT_TRUE(same_bits(alone.data(), logits.data() + i * n_vocab, n_vocab))
          << model.info().arch << " seed " << seed << " round " << r << " step " << i << " of " << steps.size()
          << " (sequence " << s << " at position " << pos[s] << ")";
      ++pos[s];
    }
  }
}

// The same for forward_many with mixed work: each round, a random subset of
// sequences in random order runs one batch each, of 1 to 24 tokens, asking
// for no logits, the last row's or every row's.
void check_mixed_batches_match_single(Model& model, uint64_t seed, int n_seq, int rounds, ThreadPool& pool) {
  std::mt19937_64 rng(seed);
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t n_vocab = model.info().n_vocab;
  std::vector<std::unique_ptr<FlatMemory>> ref, bat;
  std::vector<int64_t> pos(n_seq, 0);
  for (int s = 0; s < n_seq; ++s) {
    ref.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    bat.push_back(std::make_unique<FlatMemory>(model.state_spec()));
  }
  for (int r = 0; r < rounds; ++r) {
    std::vector<int> order(n_seq);
    for (int s = 0; s < n_seq; ++s) order[s] = s;
    std::shuffle(order.begin(), order.end(), rng);
    order.resize(rnd(1, n_seq));
    std::vector<std::vector<int32_t>> tokens(order.size());
    std::vector<std::vector<float>> logits(order.size());
    std::vector<SequenceBatch> batches(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      tokens[i].resize(rnd(1, 24));
      for (auto& t : tokens[i]) t = static_cast<int32_t>(rnd(3, n_vocab - 1));
      batches[i].batch.tokens = tokens[i];
      batches[i].batch.pos0 = pos[order[i]];
      batches[i].batch.logits_for = std::vector<LogitsFor>{LogitsFor::None, LogitsFor::Last, LogitsFor::All}[rnd(0, 2)];
      batches[i].memory = bat[order[i]].get();
      batches[i].logits = &logits[i];
    }
    model.forward_many(batches, pool);
    for (size_t i = 0; i < order.size(); ++i) {
      const int s = order[i];
      std::vector<float> alone;
      model.forward(batches[i].batch, *ref[s], alone, pool);
      if (batches[i].batch.logits_for != LogitsFor::None) {
        ASSERT_EQ(logits[i].size(), alone.size());
        ASSERT_TRUE(same_bits(alone.data(), logits[i].data(), static_cast<int64_t>(alone.size())))
            << model.info().arch << " seed " << seed << " round " << r << " batch " << i << " of " << order.size();
      }
      pos[s] += static_cast<int64_t>(tokens[i].size());
    }
  }
  // The states match too: one more token each, alone on both sides.
  for (int s = 0; s < n_seq; ++s) {
    const int32_t tok = 7;
    ForwardBatch b;
    b.tokens = std::span<const int32_t>(&tok, 1);
    b.pos0 = pos[s];
    std::vector<float> a, c;
    model.forward(b, *ref[s], a, pool);
    model.forward(b, *bat[s], c, pool);
    ASSERT_TRUE(same_bits(a.data(), c.data(), n_vocab)) << model.info().arch << " sequence " << s;
  }
}

SyntheticModelSpec small(const std::string& arch, DType dtype) {
  SyntheticModelSpec s = synthetic_preset(arch == "llama" ? "tiny" : "tiny-" + arch);
  s.dtype = dtype;
  s.n_vocab = 320;
  if (dtype_info(static_cast<uint32_t>(dtype))->block_elems == 256) {
    // Rows of whole K-type super-blocks (narrower ones would fall back to Q8_0).
    s.n_embd = 256;
    s.head_dim = 64;
    s.n_ff = 512;
  }
  if (arch == "gemma3") {
    s.sliding_window = 8;  // windows far shorter than the sequences
    s.sliding_window_pattern = 2;
  }
  return s;
}

struct Case {
  std::string arch;
  DType dtype;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.arch << " " << dtype_name(static_cast<uint32_t>(c.dtype)); }

class ForwardStepsSynthetic : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardStepsSynthetic, BitIdenticalToOneSequenceAtATime) {
  const Case& c = GetParam();
  Model& model = *test::synthetic_model("batched-" + c.arch + "-" + dtype_name(static_cast<uint32_t>(c.dtype)),
                                        small(c.arch, c.dtype))
                      .model;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    // Up to 14 steps: both the decode-sized and the prompt-sized (>= 12
    // rows) product tiles.
    for (uint64_t seed = 1; seed <= 3; ++seed) check_steps_match_single(model, seed * 7 + threads, 14, 10, pool);
  }
  // F16/BF16 products of >= 48 rows widen the weights to f32 first.
  ThreadPool pool(2);
  if (c.dtype == DType::F16) check_steps_match_single(model, 5, 60, 3, pool);
  // Prompt chunks and decode steps mixed in one pass.
  for (uint64_t seed = 1; seed <= 3; ++seed) check_mixed_batches_match_single(model, seed, 5, 8, pool);
}

INSTANTIATE_TEST_SUITE_P(Archs, ForwardStepsSynthetic,
                         ::testing::Values(Case{"llama", DType::F32}, Case{"llama", DType::F16},
                                           Case{"llama", DType::Q8_0}, Case{"llama", DType::Q4_0},
                                           Case{"llama", DType::Q4_K}, Case{"llama", DType::Q5_K},
                                           Case{"qwen3", DType::Q6_K}, Case{"llama", DType::Q5_0},
                                           Case{"llama", DType::Q5_1}, Case{"gemma3", DType::Q4_1},
                                           Case{"qwen2", DType::F16}, Case{"qwen3", DType::Q8_0},
                                           Case{"gemma3", DType::F16}, Case{"mamba", DType::F16},
                                           Case{"mamba2", DType::Q8_0}, Case{"jamba", DType::F16},
                                           Case{"llama", DType::Q3_K}, Case{"gemma3", DType::IQ4_NL},
                                           Case{"qwen2", DType::IQ4_XS}, Case{"llama", DType::Q2_K}),
                         [](const auto& info) {
                           return info.param.arch + "_" + dtype_name(static_cast<uint32_t>(info.param.dtype));
                         });

TEST(ForwardSteps, SharedFixturesBitIdenticalToOneSequenceAtATime) {
  REPRISE_REQUIRE_SHARED(fixtures);
  for (const char* name : {"llama-spm-f16", "llama-spm-Q8_0", "llama-spm-Q4_0", "qwen3-gpt2-f16", "gemma3-spm-f16",
                           "stories260K", "mamba-spm-f16", "mamba2-spm-f16", "jamba-spm-f16"}) {
    SCOPED_TRACE(name);
    auto file = gguf::File::open(fixtures + "/models/" + name + ".gguf");
    auto model = load_model(*file);
    EXPECT_EQ(model->batches_sequences(), true);
    ThreadPool pool(2);
    check_steps_match_single(*model, 99, 5, 8, pool);
    check_mixed_batches_match_single(*model, 98, 4, 6, pool);
  }
}

// A batch that cannot run is rejected before any batch's state changes: the
// rest run again without it and match their runs alone exactly (a recurrent
// state advanced twice would not). Empty batches are skipped.
TEST(ForwardMany, RejectsABadBatchBeforeAnyStateChanges) {
  for (const char* arch : {"llama", "jamba"}) {
    SCOPED_TRACE(arch);
    Model& model = *test::synthetic_model(std::string("batched-") + arch + "-F16", small(arch, DType::F16)).model;
    const int64_t n_vocab = model.info().n_vocab;
    ThreadPool pool(2);
    std::vector<std::unique_ptr<FlatMemory>> memory, ref;
    for (int s = 0; s < 4; ++s) {
      memory.push_back(std::make_unique<FlatMemory>(model.state_spec()));
      ref.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    }
    const std::vector<int32_t> good_a{5, 6, 7}, bad{8, static_cast<int32_t>(n_vocab + 3), 9}, good_b{10},
        empty{};
    const std::vector<const std::vector<int32_t>*> tokens{&good_a, &bad, &empty, &good_b};
    std::vector<std::vector<float>> out(4);
    std::vector<SequenceBatch> batches(4);
    for (int s = 0; s < 4; ++s) {
      batches[s].batch.tokens = *tokens[s];
      batches[s].memory = memory[s].get();
      batches[s].logits = &out[s];
    }
    try {
      model.forward_many(batches, pool);
      FAIL() << "a token id out of range must be rejected";
    } catch (const BatchRejected& r) {
      EXPECT_EQ(r.index, 1u);
      EXPECT_THROW(std::rethrow_exception(r.cause), Error);
    }
    batches.erase(batches.begin() + 1);
    model.forward_many(batches, pool);
    EXPECT_TRUE(out[2].empty()) << "an empty batch gets no logits";
    for (int s : {0, 3}) {
      ForwardBatch b;
      b.tokens = *tokens[s];
      std::vector<float> alone;
      model.forward(b, *ref[s], alone, pool);
      ASSERT_EQ(out[s].size(), alone.size());
      EXPECT_TRUE(same_bits(out[s].data(), alone.data(), n_vocab)) << "sequence " << s;
      // And the next step agrees too (the states match).
      const int32_t next = 11;
      ForwardBatch step;
      step.tokens = std::span<const int32_t>(&next, 1);
      step.pos0 = static_cast<int64_t>(tokens[s]->size());
      std::vector<float> a, c;
      model.forward(step, *ref[s], a, pool);
      model.forward(step, *memory[s], c, pool);
      EXPECT_TRUE(same_bits(a.data(), c.data(), n_vocab)) << "sequence " << s;
    }
  }
}

// Engine level. Each request's callback records a digest of every logits row
// it sees; the first callback waits until every request is decoding, so the
// decode loops overlap and their steps share passes.
struct Generation {
  GenerateResult result;
  std::vector<uint64_t> logit_digests;
};

uint64_t digest(std::span<const float> v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    h = (h ^ u) * 1099511628211ull;
  }
  return h;
}

GenerateRequest request(const std::vector<int32_t>& prompt, int n, float temp, uint64_t seed) {
  GenerateRequest r;
  r.prompt = prompt;
  r.max_tokens = n;
  r.sampling.temperature = temp;
  r.sampling.seed = seed;
  r.sampling.top_k = 20;
  r.sampling.top_p = 0.95f;
  r.sampling.min_p = 0.0f;
  return r;
}

// The `early` requests start together and wait at their first token until
// all are decoding, so their decode loops overlap; the `late` ones start once
// the first early request has produced two tokens, so their prompts are
// prefilled while the early ones decode.
std::vector<Generation> generate_concurrently(Engine& engine, const std::vector<GenerateRequest>& early,
                                              const std::vector<GenerateRequest>& late = {}) {
  std::vector<Generation> runs(early.size() + late.size());
  std::latch all_decoding(static_cast<std::ptrdiff_t>(early.size()));
  std::latch late_may_start(1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < runs.size(); ++i)
    threads.emplace_back([&, i] {
      const bool is_early = i < early.size();
      if (!is_early) late_may_start.wait();
      int emitted = 0;
      runs[i].result = engine.generate(is_early ? early[i] : late[i - early.size()],
                                       [&](int32_t, std::span<const float> logits) {
                                         runs[i].logit_digests.push_back(digest(logits));
                                         if (is_early && emitted == 0) all_decoding.arrive_and_wait();
                                         if (i == 0 && emitted == 1) late_may_start.count_down();
                                         ++emitted;
                                         return true;
                                       });
      if (i == 0 && emitted < 2) late_may_start.count_down();
    });
  for (auto& t : threads) t.join();
  return runs;
}

Generation generate_alone(Engine& engine, const GenerateRequest& req) {
  Generation run;
  run.result = engine.generate(req, [&](int32_t, std::span<const float> logits) {
    run.logit_digests.push_back(digest(logits));
    return true;
  });
  return run;
}

class BatchedDecodeEngine : public ::testing::TestWithParam<Case> {};

TEST_P(BatchedDecodeEngine, ConcurrentRequestsGenerateWhatTheyGenerateAlone) {
  const Case& c = GetParam();
  SyntheticModelSpec spec = small(c.arch, c.dtype);
  spec.n_ctx = 512;
  Model& model = *test::synthetic_model("batched-engine-" + c.arch, spec).model;
  std::mt19937 rng(3);
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int script = 0; script < 4; ++script) {
    SCOPED_TRACE(script);
    ThreadPool pool(2);
    PrefixCacheConfig pc;
    pc.block_tokens = std::vector<int>{4, 16}[script % 2];
    PrefixCache cache(model.state_spec(), pc);
    SnapshotConfig sc;
    sc.chunk_tokens = cache.block_tokens();
    SnapshotStore snapshots(model.state_spec(), sc);  // recurrent models restore their state from these
    Engine batched(model, pool, &cache, {}, &snapshots);
    EngineOptions solo_options;
    solo_options.max_decode_batch = 1;
    Engine solo(model, pool, nullptr, solo_options);  // the cold path

    // Requests share a "system prompt", so their cached blocks are shared.
    // The late ones have long prompts, prefilled in chunks between (and
    // together with) the early ones' decode steps.
    std::vector<int32_t> system(rnd(5, 30));
    for (auto& t : system) t = rnd(3, 319);
    std::vector<GenerateRequest> early, late;
    const int n_early = rnd(2, 4), n_late = rnd(1, 2);
    for (int i = 0; i < n_early + n_late; ++i) {
      std::vector<int32_t> prompt = system;
      for (int k = i < n_early ? rnd(1, 20) : rnd(150, 300); k > 0; --k) prompt.push_back(rnd(3, 319));
      (i < n_early ? early : late)
          .push_back(request(prompt, i < n_early ? rnd(30, 40) : rnd(4, 12), i % 2 ? 0.8f : 0.0f, 100 + i));
    }
    const std::vector<Generation> together = generate_concurrently(batched, early, late);
    std::vector<GenerateRequest> reqs = early;
    reqs.insert(reqs.end(), late.begin(), late.end());
    const int n_req = static_cast<int>(reqs.size());
    EXPECT_GE(batched.pass_stats().max_sequences, 2u) << "the decode loops overlapped, so steps must share passes";
    for (int i = 0; i < n_req; ++i) {
      const Generation alone = generate_alone(solo, reqs[i]);
      EXPECT_EQ(together[i].result.tokens, alone.result.tokens) << "request " << i;
      EXPECT_EQ(together[i].logit_digests, alone.logit_digests) << "request " << i;
    }
    // Next turns hit the blocks the batched passes wrote: still exact.
    for (int i = 0; i < n_req; ++i) {
      std::vector<int32_t> next = reqs[i].prompt;
      next.insert(next.end(), together[i].result.tokens.begin(), together[i].result.tokens.end());
      next.push_back(rnd(3, 319));
      const GenerateRequest follow = request(next, 6, 0.0f, 7);
      const Generation hit = generate_alone(batched, follow);
      const Generation cold = generate_alone(solo, follow);
      EXPECT_GT(hit.result.cached_tokens, static_cast<int64_t>(reqs[i].prompt.size())) << "request " << i;
      EXPECT_EQ(hit.result.tokens, cold.result.tokens) << "request " << i;
      EXPECT_EQ(hit.logit_digests, cold.logit_digests) << "request " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, BatchedDecodeEngine,
                         ::testing::Values(Case{"qwen3", DType::Q8_0}, Case{"jamba", DType::F16},
                                           Case{"mamba2", DType::F16}),
                         [](const auto& info) { return info.param.arch; });

TEST(BatchedDecode, EnginesSharingABatcherSharePasses) {
  // As the server's text and image engines for one model do.
  Model& model = *test::synthetic_model("batched-engine-qwen3", [] {
                    SyntheticModelSpec s = small("qwen3", DType::Q8_0);
                    s.n_ctx = 512;
                    return s;
                  }())
                      .model;
  ThreadPool pool(2);
  PrefixCache cache(model.state_spec(), {});
  Engine first(model, pool, &cache);
  EngineOptions shared;
  shared.forward_mutex = &first.forward_mutex();
  shared.batcher = &first.pass_batcher();
  Engine second(model, pool, nullptr, shared);
  EngineOptions solo_options;
  solo_options.max_decode_batch = 1;
  Engine solo(model, pool, nullptr, solo_options);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(request({5, 6, 7, static_cast<int32_t>(10 + i)}, 24, 0.0f, 1));
  std::vector<Generation> runs(reqs.size());
  std::latch all_decoding(static_cast<std::ptrdiff_t>(reqs.size()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i)
    threads.emplace_back([&, i] {
      bool first_token = true;
      runs[i].result = (i % 2 ? second : first).generate(reqs[i], [&](int32_t, std::span<const float> logits) {
        runs[i].logit_digests.push_back(digest(logits));
        if (first_token) all_decoding.arrive_and_wait();
        first_token = false;
        return true;
      });
    });
  for (auto& t : threads) t.join();
  EXPECT_GE(first.pass_stats().max_sequences, 2u) << "both engines' decode steps share passes";
  EXPECT_EQ(first.pass_stats().passes, second.pass_stats().passes);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Generation alone = generate_alone(solo, reqs[i]);
    EXPECT_EQ(runs[i].result.tokens, alone.result.tokens) << "request " << i;
    EXPECT_EQ(runs[i].logit_digests, alone.logit_digests) << "request " << i;
  }
}

// Decode steps and one prompt chunk queued while the pool is busy run as one
// pass (the chunk at most one per pass), each with the bits it gets alone.
// Three queued decode steps and two queued 20-token chunks, under a chunk
// token budget of `max_chunk_tokens`: returns the batcher's stats, after
// checking every batch's logits against running it alone.
PassBatchStats run_queued_steps_and_two_chunks(int64_t max_chunk_tokens) {
  Model& model = *test::synthetic_model("batched-llama-F16", small("llama", DType::F16)).model;
  const int64_t n_vocab = model.info().n_vocab;
  ThreadPool pool(2);
  std::mutex forward_mutex;
  PassBatcher batcher(model, pool, forward_mutex, 8, max_chunk_tokens);
  constexpr int kSteps = 3;
  std::vector<std::unique_ptr<FlatMemory>> memory, ref;
  const std::vector<int32_t> prompt{5, 6, 7, 8, 9};
  std::vector<float> logits;
  for (int s = 0; s < kSteps + 2; ++s) {
    memory.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    ref.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    if (s < kSteps) {
      ForwardBatch b;
      b.tokens = prompt;
      model.forward(b, *memory[s], logits, pool);
      model.forward(b, *ref[s], logits, pool);
    }
  }
  // Sequences kSteps and kSteps + 1 each bring a 20-token prompt chunk.
  std::vector<int32_t> step_tokens{11, 12, 13}, chunk(20);
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<int32_t>(30 + i);
  std::vector<ForwardBatch> work(kSteps + 2);
  for (int s = 0; s < kSteps + 2; ++s) {
    if (s < kSteps) {
      work[s].tokens = std::span<const int32_t>(&step_tokens[s], 1);
      work[s].pos0 = static_cast<int64_t>(prompt.size());
    } else {
      work[s].tokens = chunk;
      work[s].logits_for = s == kSteps ? LogitsFor::All : LogitsFor::Last;
    }
  }
  std::vector<std::vector<float>> out(kSteps + 2);
  std::vector<std::thread> threads;
  {
    // Holding the forward lock keeps the first leader from running until
    // everything is queued.
    std::unique_lock<std::mutex> busy(forward_mutex);
    for (int s = 0; s < kSteps + 2; ++s)
      threads.emplace_back([&, s] { batcher.run(work[s], *memory[s], out[s]); });
    while (batcher.queued() < static_cast<size_t>(kSteps + 2)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < kSteps + 2; ++s) {
    std::vector<float> alone;
    model.forward(work[s], *ref[s], alone, pool);
    EXPECT_EQ(out[s].size(), alone.size()) << "sequence " << s;
    if (out[s].size() == alone.size()) {
      EXPECT_TRUE(same_bits(out[s].data(), alone.data(), static_cast<int64_t>(alone.size()))) << "sequence " << s;
    }
  }
  EXPECT_EQ(out[kSteps].size(), chunk.size() * n_vocab);
  return batcher.stats();
}

TEST(BatchedDecode, QueuedStepsAndAPromptChunkShareOnePass) {
  // A budget of 30 tokens holds one 20-token chunk: the second waits.
  const PassBatchStats stats = run_queued_steps_and_two_chunks(30);
  EXPECT_EQ(stats.passes, 2u) << "one pass for the steps and the first chunk, one for the second chunk";
  EXPECT_EQ(stats.max_sequences, 4u);
  EXPECT_EQ(stats.mixed_passes, 1u);
}

TEST(BatchedDecode, ChunksWithinTheTokenBudgetShareOnePass) {
  // 40 chunk tokens fit a budget of 40 (speculative verify batches of
  // concurrent requests, say): everything runs in one pass.
  const PassBatchStats stats = run_queued_steps_and_two_chunks(40);
  EXPECT_EQ(stats.passes, 1u);
  EXPECT_EQ(stats.max_sequences, 5u);
  EXPECT_EQ(stats.mixed_passes, 1u);
}

TEST(BatchedDecode, OneStepsErrorStaysWithItsOwnRequest) {
  // The token lives as long as the batch that points at it.
  thread_local int32_t token_storage;
  auto one_token = [](int32_t token, int64_t pos) {
    token_storage = token;
    ForwardBatch b;
    b.tokens = std::span<const int32_t>(&token_storage, 1);
    b.pos0 = pos;
    return b;
  };
  Model& model = *test::synthetic_model("batched-llama-F32", small("llama", DType::F32)).model;
  ThreadPool pool(2);
  std::mutex forward_mutex;
  PassBatcher batcher(model, pool, forward_mutex, 8);
  constexpr int kSeq = 4;
  const int64_t n_vocab = model.info().n_vocab;
  std::vector<std::unique_ptr<FlatMemory>> memory, ref;
  std::vector<float> logits;
  const std::vector<int32_t> prompt{5, 6, 7, 8};
  for (int s = 0; s < kSeq; ++s) {
    memory.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    ref.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    ForwardBatch b;
    b.tokens = prompt;
    model.forward(b, *memory[s], logits, pool);
    model.forward(b, *ref[s], logits, pool);
  }
  for (int round = 0; round < 20; ++round) {
    std::vector<std::vector<float>> out(kSeq);
    std::vector<int> threw(kSeq, 0);
    const int bad = round % kSeq;
    {
      std::vector<std::unique_ptr<PassBatcher::Membership>> members;
      for (int s = 0; s < kSeq; ++s) members.push_back(std::make_unique<PassBatcher::Membership>(batcher));
      std::vector<std::thread> threads;
      for (int s = 0; s < kSeq; ++s)
        threads.emplace_back([&, s] {
          try {
            const int32_t token = s == bad ? static_cast<int32_t>(n_vocab + 5) : 10 + s;
            batcher.run(one_token(token, 4 + round), *memory[s], out[s]);
          } catch (const Error&) {
            threw[s] = 1;
          }
        });
      for (auto& t : threads) t.join();
    }
    for (int s = 0; s < kSeq; ++s) {
      SCOPED_TRACE("round " + std::to_string(round) + " sequence " + std::to_string(s));
      EXPECT_EQ(threw[s], s == bad ? 1 : 0);
      // Good steps advance; the bad sequence retries with a valid token so
      // all stay at the same position.
      const int32_t token = 10 + s;
      if (s == bad) batcher.run(one_token(token, 4 + round), *memory[s], out[s]);
      ForwardBatch b;
      b.tokens = std::span<const int32_t>(&token, 1);
      b.pos0 = 4 + round;
      model.forward(b, *ref[s], logits, pool);
      ASSERT_EQ(out[s].size(), static_cast<size_t>(n_vocab));
      EXPECT_TRUE(same_bits(out[s].data(), logits.data(), n_vocab));
    }
  }
  EXPECT_GE(batcher.stats().max_sequences, 2u);
}

}  // namespace
