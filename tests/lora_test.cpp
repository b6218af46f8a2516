// LoRA adapters: products with an adapter equal products with the merged
// weights W + scale * alpha / rank * B A; a sequence's adapters never change
// another sequence of the same pass; the prefix cache never serves state
// computed under other adapters or scales, and a hit equals a cold run bit
// for bit (randomized differential); malformed or mismatched adapters are
// refused with an error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>

#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "engine/flat_memory.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "greedy_run.h"
#include "model/lora_adapter.h"
#include "model/synthetic_lora.h"
#include "tensor/decode_team.h"
#include "model_fixtures.h"
#include "test_support.h"
#include "util/error.h"
#include "util/scratch_dir.h"

using namespace reprise;
using reprise::testing_support::bit_identical;
using reprise::testing_support::StepOutput;

namespace {

std::string scratch_file(const std::string& name) { return process_scratch_dir("reprise-lora-test-").file(name); }

SyntheticModelSpec f32_spec(const std::string& arch) {
  SyntheticModelSpec s = synthetic_preset(arch == "llama" ? "tiny" : "tiny-" + arch);
  s.dtype = DType::F32;
  s.n_vocab = 512;
  s.n_ctx = 1024;
  if (arch == "gemma3") {
    s.sliding_window = 12;
    s.sliding_window_pattern = 2;
  }
  return s;
}

test::LoadedModel& base_model(const std::string& arch) { return test::synthetic_model("lora-" + arch, f32_spec(arch)); }

// An adapter for `base` written once per (tag) and loaded.
std::shared_ptr<const LoraAdapter> adapter_for(const test::LoadedModel& base, const std::string& tag,
                                               const SyntheticLoraSpec& spec) {
  static std::map<std::string, std::shared_ptr<const LoraAdapter>> made;
  const std::string key = base.path + "|" + tag;
  if (auto it = made.find(key); it != made.end()) return it->second;
  const std::string path = scratch_file(tag + "-" + std::to_string(made.size()) + ".gguf");
  make_synthetic_lora(base.path, spec, path);
  return made[key] = LoraAdapter::load(path);
}

SyntheticLoraSpec spec_all(uint64_t seed, int64_t rank, float alpha) {
  SyntheticLoraSpec s;
  s.seed = seed;
  s.rank = rank;
  s.alpha = alpha;
  return s;
}

SyntheticLoraSpec spec_some(uint64_t seed) {
  SyntheticLoraSpec s;
  s.seed = seed;
  s.rank = 4;
  s.alpha = 0;  // no alpha: factor 1
  s.targets = {"attn_v", "ffn_down", "attn_q"};
  s.layers = {0, 2};
  return s;
}

// The base model's file with every adapted matrix replaced by
// W + sum(scale * factor * B A), computed in double, as F32.
std::string write_merged(const test::LoadedModel& base, const std::vector<LoraUse>& loras, const std::string& name,
                         float jitter = 0) {  // jitter: each weight times 1 - jitter, 1 or 1 + jitter
  const gguf::File& f = *base.file;
  gguf::Writer w;
  for (const auto& [key, value] : f.metadata())
    if (key != "general.alignment") w.set(key, gguf::MetaValue::copy_of(value));
  for (const gguf::TensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.type, DType::F32) << t.name;
    std::vector<float> values(t.n_elements());
    std::memcpy(values.data(), t.data, values.size() * sizeof(float));
    if (t.shape.size() == 2) {
      const auto n_in = static_cast<int64_t>(t.shape[0]), n_out = static_cast<int64_t>(t.shape[1]);
      std::vector<double> delta(values.size(), 0.0);
      for (const LoraUse& use : loras) {
        const LoraPair* pair = use.adapter->find(t.name);
        if (!pair) continue;
        const int64_t r = pair->rank();
        std::vector<float> a(r * n_in), b(n_out * r);
        for (int64_t i = 0; i < r; ++i) dequantize_row(pair->a.view(), i, a.data() + i * n_in);
        for (int64_t o = 0; o < n_out; ++o) dequantize_row(pair->b.view(), o, b.data() + o * r);
        const double s = static_cast<double>(use.scale) * pair->factor;
        for (int64_t o = 0; o < n_out; ++o)
          for (int64_t k = 0; k < r; ++k)
            for (int64_t i = 0; i < n_in; ++i) delta[o * n_in + i] += s * b[o * r + k] * a[k * n_in + i];
      }
      for (size_t i = 0; i < values.size(); ++i)
        values[i] = static_cast<float>(values[i] + delta[i]) * (1.0f + jitter * ((i * 2654435761u) % 3 - 1.0f));
    }
    w.add_tensor_f32(t.name, std::vector<uint64_t>(t.shape.begin(), t.shape.end()), DType::F32, std::move(values));
  }
  const std::string path = scratch_file(name + ".gguf");
  w.write(path);
  return path;
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int64_t n, int64_t n_vocab) {
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(3, n_vocab - 1)(rng));
  return p;
}

// Every position's logits of `prompt` run in chunks of `chunk` tokens.
std::vector<float> all_logits(Model& model, const std::vector<int32_t>& prompt, std::span<const LoraUse> loras,
                              int64_t chunk, ThreadPool& pool) {
  FlatMemory memory(model.state_spec());
  std::vector<float> all, logits;
  for (int64_t p = 0; p < static_cast<int64_t>(prompt.size()); p += chunk) {
    ForwardBatch b;
    b.tokens = std::span<const int32_t>(prompt).subspan(p, std::min<int64_t>(chunk, prompt.size() - p));
    b.pos0 = p;
    b.logits_for = LogitsFor::All;
    b.loras = loras;
    model.forward(b, memory, logits, pool);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

class LoraArch : public ::testing::TestWithParam<std::string> {};

// Two adapters (all matrices at rank 8 with alpha 16; three matrices of two
// layers at rank 4 without alpha) at scales 0.7 and -0.4 give the logits of
// the merged weights, at every position, in one batch or in chunks and
// decode steps; and they change them (a test of the adapters, not of zero).
TEST_P(LoraArch, ProductsEqualMergedWeights) {
  test::LoadedModel& base = base_model(GetParam());
  Model& model = *base.model;
  const std::vector<LoraUse> loras = {{adapter_for(base, "all", spec_all(11, 8, 16.0f)), 0.7f},
                                      {adapter_for(base, "some", spec_some(12)), -0.4f}};
  for (const LoraUse& use : loras) ASSERT_NO_THROW(model.check_adapter(*use.adapter));
  auto merged_file = gguf::File::open(write_merged(base, loras, "merged-" + GetParam()));
  auto merged = load_model(*merged_file);

  ThreadPool pool(2);
  std::mt19937_64 rng(5);
  const std::vector<int32_t> prompt = random_prompt(rng, 70, model.info().n_vocab);
  const std::vector<float> want = all_logits(*merged, prompt, {}, 70, pool);
  const std::vector<float> plain = all_logits(model, prompt, {}, 70, pool);
  const double scale = std::max(1.0, max_abs(want));
  // The model's own sensitivity: the merged weights perturbed by about an
  // ulp (what rounding W + B A in another order amounts to) move the logits
  // by this much; the adapter's products must land within a few times it.
  auto jittered_file = gguf::File::open(write_merged(base, loras, "jittered-" + GetParam(), 1.2e-7f));
  const double noise = max_abs_diff(all_logits(*load_model(*jittered_file), prompt, {}, 70, pool), want);
  const double tolerance = 4 * std::max(noise, 1e-5 * scale);
  EXPECT_GT(max_abs_diff(want, plain), 20 * tolerance) << "the adapters barely change the logits";
  for (int64_t chunk : {70, 16, 1}) {
    const std::vector<float> got = all_logits(model, prompt, loras, chunk, pool);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(max_abs_diff(got, want), tolerance) << "chunk " << chunk << ", noise " << noise;
  }
  // Scale 0 is the base model, bit for bit.
  const std::vector<LoraUse> zero = {{loras[0].adapter, 0.0f}};
  const std::vector<float> off = all_logits(model, prompt, zero, 70, pool);
  EXPECT_EQ(std::memcmp(off.data(), plain.data(), off.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, LoraArch, ::testing::Values("llama", "qwen2", "qwen3", "gemma3"));

// An adapter stored in F16 or Q8_0 runs with the kernels' numerics for its
// type: close to the same adapter in F32.
TEST(Lora, QuantizedAdaptersRunCloseToTheirF32Values) {
  test::LoadedModel& base = base_model("llama");
  Model& model = *base.model;
  ThreadPool pool(2);
  std::mt19937_64 rng(9);
  const std::vector<int32_t> prompt = random_prompt(rng, 40, model.info().n_vocab);
  SyntheticLoraSpec spec = spec_all(21, 32, 32.0f);
  const std::vector<LoraUse> f32 = {{adapter_for(base, "f32", spec), 1.0f}};
  const std::vector<float> want = all_logits(model, prompt, f32, 40, pool);
  const std::vector<float> plain = all_logits(model, prompt, {}, 40, pool);
  for (DType type : {DType::F16, DType::Q8_0}) {
    spec.dtype = type;
    const std::vector<LoraUse> q = {{adapter_for(base, std::string("q") + dtype_name(static_cast<uint32_t>(type)), spec), 1.0f}};
    const std::vector<float> got = all_logits(model, prompt, q, 40, pool);
    const double err = max_abs_diff(got, want), change = max_abs_diff(want, plain);
    EXPECT_LT(err, 0.05 * change) << dtype_name(static_cast<uint32_t>(type)) << " error " << err << " change " << change;
  }
}

// Sequences with different adapters (or none) in one pass: each gets
// exactly what it gets alone, prompt chunks and decode steps alike.
TEST(Lora, SharedPassesAreBitIdenticalToRunningAlone) {
  test::LoadedModel& base = base_model("qwen3");
  Model& model = *base.model;
  const auto a = adapter_for(base, "all", spec_all(11, 8, 16.0f));
  const auto b = adapter_for(base, "some", spec_some(12));
  const std::vector<std::vector<LoraUse>> configs = {{}, {{a, 1.0f}}, {{a, 0.5f}, {b, 2.0f}}, {{b, 1.0f}}};
  ThreadPool pool(2);
  std::mt19937_64 rng(3);
  const int n = static_cast<int>(configs.size());
  std::vector<std::unique_ptr<FlatMemory>> together, alone;
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < n; ++s) {
    together.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    alone.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    prompts.push_back(random_prompt(rng, 9 + 7 * s, model.info().n_vocab));
  }
  std::vector<int64_t> pos(n, 0);
  std::vector<std::vector<float>> logits_together(n), logits_alone(n);
  // Round 0: whole prompts; rounds 1..6: one token each (the last greedy).
  for (int round = 0; round < 7; ++round) {
    std::vector<std::vector<int32_t>> tokens(n);
    for (int s = 0; s < n; ++s)
      tokens[s] = round == 0 ? prompts[s]
                             : std::vector<int32_t>{static_cast<int32_t>(
                                   test::argmax(logits_alone[s].data(), model.info().n_vocab))};
    std::vector<SequenceBatch> batches(n);
    for (int s = 0; s < n; ++s) {
      batches[s].batch.tokens = tokens[s];
      batches[s].batch.pos0 = pos[s];
      batches[s].batch.loras = configs[s];
      batches[s].memory = together[s].get();
      batches[s].logits = &logits_together[s];
    }
    model.forward_many(batches, pool);
    for (int s = 0; s < n; ++s) {
      model.forward(batches[s].batch, *alone[s], logits_alone[s], pool);
      ASSERT_EQ(logits_alone[s].size(), logits_together[s].size());
      ASSERT_EQ(std::memcmp(logits_alone[s].data(), logits_together[s].data(), logits_alone[s].size() * sizeof(float)),
                0)
          << "round " << round << " sequence " << s;
      pos[s] += static_cast<int64_t>(tokens[s].size());
    }
  }
}

// Decode steps of sequences with different adapters (and one without) run
// by a decode team give the bits of the same steps dispatched product by
// product: the team's members add the deltas where they read the outputs.
TEST(Lora, DecodeTeamStepsAreBitIdenticalToDispatchedSteps) {
  if (!DecodeTeam::fits_cpus(2)) GTEST_SKIP() << "fewer than 2 CPUs: no teams";
  for (const std::string arch : {"llama", "qwen2", "gemma3"}) {
    SCOPED_TRACE(arch);
    // Team attention takes heads of 32 dimensions and more.
    SyntheticModelSpec spec = f32_spec(arch);
    spec.n_embd = 128;
    spec.n_head = 4;
    spec.head_dim = 32;
    test::LoadedModel& base = test::synthetic_model("lora-team-" + arch, spec);
    Model& model = *base.model;
    const auto a = adapter_for(base, "all", spec_all(11, 8, 16.0f));
    const auto b = adapter_for(base, "some", spec_some(12));
    const bool was = DecodeTeam::enabled();
    ThreadPool pool(2);
    std::mt19937_64 rng(8);
    for (const std::vector<std::vector<LoraUse>>& configs :
         {std::vector<std::vector<LoraUse>>{{{a, 1.0f}}},
          std::vector<std::vector<LoraUse>>{{{a, 0.5f}, {b, 2.0f}}, {}, {{b, -1.0f}}}}) {
      const int n = static_cast<int>(configs.size());
      auto [off, on, pos] = test::prefill_pairs(model, rng, n, 20, 60, pool);
      const uint64_t runs_before = DecodeTeam::runs();
      for (int step = 0; step < 12; ++step) {
        std::vector<int32_t> tokens(n);
        for (auto& t : tokens) t = static_cast<int32_t>(rng() % (model.info().n_vocab - 3) + 3);
        std::vector<std::vector<float>> logits_off(n), logits_on(n);
        auto batches_for = [&](auto& memories, std::vector<std::vector<float>>& logits) {
          std::vector<SequenceBatch> batches(n);
          for (int s = 0; s < n; ++s) {
            batches[s].batch.tokens = std::span<const int32_t>(&tokens[s], 1);
            batches[s].batch.pos0 = pos[s];
            batches[s].batch.loras = configs[s];
            batches[s].memory = memories[s].get();
            batches[s].logits = &logits[s];
          }
          return batches;
        };
        DecodeTeam::set_enabled(false);
        model.forward_many(batches_for(off, logits_off), pool);
        DecodeTeam::set_enabled(true);
        pool.wake_workers(2e6);
        model.forward_many(batches_for(on, logits_on), pool);
        for (int s = 0; s < n; ++s) {
          ASSERT_EQ(logits_off[s].size(), logits_on[s].size());
          ASSERT_EQ(std::memcmp(logits_off[s].data(), logits_on[s].data(), logits_on[s].size() * sizeof(float)), 0)
              << n << " sequences, step " << step << ", sequence " << s;
          ++pos[s];
        }
      }
      EXPECT_GT(DecodeTeam::runs(), runs_before) << "no team ran";
    }
    DecodeTeam::set_enabled(was);
  }
}

StepOutput run_with(Engine& engine, const std::vector<int32_t>& prompt, int n_gen, const std::vector<LoraUse>& loras) {
  return reprise::testing_support::run(engine, prompt, n_gen, "", loras);
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// Randomized differential: conversations under adapter configurations that
// differ by adapter, scale, order or none at all, sharing system prompts
// across configurations. Every step's tokens and logits equal a cold run's
// bit for bit, and a step reuses at most the longest prefix that the same
// configuration computed before: never state of another configuration.
TEST(LoraCache, CachedEqualsColdAndConfigurationsNeverShare) {
  for (const std::string arch : {"llama", "gemma3"}) {
    test::LoadedModel& base = base_model(arch);
    Model& model = *base.model;
    const auto a = adapter_for(base, "all", spec_all(11, 8, 16.0f));
    const auto b = adapter_for(base, "some", spec_some(12));
    const std::vector<std::vector<LoraUse>> configs = {
        {}, {{a, 1.0f}}, {{a, 0.5f}}, {{b, 1.0f}}, {{a, 1.0f}, {b, 1.0f}}, {{b, 1.0f}, {a, 1.0f}}};
    ThreadPool pool(2);
    Engine cold(model, pool, nullptr);
    std::mt19937_64 rng(0x10a ^ std::hash<std::string>()(arch));
    auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
    std::vector<std::vector<int32_t>> systems;
    for (int i = 0; i < 2; ++i) systems.push_back(random_prompt(rng, rnd(20, 60), model.info().n_vocab));

    int64_t steps = 0, hits = 0;
    for (int script = 0; script < 12; ++script) {
      PrefixCacheConfig cfg;
      cfg.block_tokens = std::vector<int>{4, 8, 16}[rnd(0, 2)];
      PrefixCache cache(model.state_spec(), cfg);
      Engine engine(model, pool, &cache);
      // What each configuration has computed (prompts with their replies).
      std::vector<std::vector<std::vector<int32_t>>> computed(configs.size());
      std::vector<std::pair<size_t, std::vector<int32_t>>> conversations;
      for (int s = 0; s < 8; ++s) {
        size_t config;
        std::vector<int32_t> prompt;
        if (conversations.empty() || rnd(0, 2) == 0) {
          config = static_cast<size_t>(rnd(0, configs.size() - 1));
          prompt = systems[rnd(0, 1)];
        } else {
          const auto& [c, history] = conversations[rnd(0, conversations.size() - 1)];
          config = c;
          prompt = history;
        }
        const auto user = random_prompt(rng, rnd(1, 12), model.info().n_vocab);
        prompt.insert(prompt.end(), user.begin(), user.end());
        size_t reusable = 0;
        for (const auto& before : computed[config]) reusable = std::max(reusable, common_prefix(before, prompt));
        const int n_gen = static_cast<int>(rnd(1, 5));
        const StepOutput want = run_with(cold, prompt, n_gen, configs[config]);
        const StepOutput got = run_with(engine, prompt, n_gen, configs[config]);
        ASSERT_TRUE(bit_identical(want, got)) << arch << " script " << script << " step " << s << " config " << config
                                              << " reuse: " << got.result.reuse.describe();
        ASSERT_LE(got.result.cached_tokens, static_cast<int64_t>(reusable))
            << arch << " config " << config << " reused state it never computed";
        hits += got.result.cached_tokens > 0;
        ++steps;
        std::vector<int32_t> history = prompt;
        history.insert(history.end(), got.tokens.begin(), got.tokens.end());
        computed[config].push_back(history);
        conversations.emplace_back(config, std::move(history));
      }
      EXPECT_EQ(cache.stats().blocks_in_use, 0u);
      EXPECT_EQ(cache.check_invariants(), "");
    }
    EXPECT_GT(hits, steps / 4) << arch << ": too few cache hits to exercise reuse";
  }
}

// Prompts with images (embedded spans fed as input embeddings, attending
// both ways, their digests as the positions' cache keys) under adapters:
// cached equals cold bit for bit, and a configuration never reuses an
// image prefix another one computed.
TEST(LoraCache, ImagesUnderAdaptersCachedEqualsCold) {
  test::LoadedModel& base = base_model("gemma3");
  Model& model = *base.model;
  const auto a = adapter_for(base, "all", spec_all(11, 8, 16.0f));
  const auto b = adapter_for(base, "some", spec_some(12));
  const std::vector<std::vector<LoraUse>> configs = {{}, {{a, 1.0f}}, {{b, 0.5f}}};
  const int64_t n_embd = model.info().n_embd, image_tokens = 6;
  std::mt19937_64 rng(61);
  // Three "images": their embeddings and digests.
  std::vector<std::vector<float>> images(3, std::vector<float>(image_tokens * n_embd));
  for (auto& image : images)
    for (float& v : image) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  ThreadPool pool(2);
  Engine cold(model, pool, nullptr);
  PrefixCacheConfig cfg;
  cfg.block_tokens = 4;
  PrefixCache cache(model.state_spec(), cfg);
  Engine engine(model, pool, &cache);
  const std::vector<int32_t> system = random_prompt(rng, 10, model.info().n_vocab);
  std::vector<bool> seen(configs.size(), false);
  int hits = 0;
  for (int step = 0; step < 24; ++step) {
    const size_t config = rng() % configs.size();
    const size_t image = rng() % images.size();
    GenerateRequest req;
    req.prompt = system;
    const int64_t begin = static_cast<int64_t>(req.prompt.size());
    req.prompt.resize(begin + image_tokens, 1);  // placeholders under the embeddings
    const auto question = random_prompt(rng, 1 + static_cast<int64_t>(rng() % 3), model.info().n_vocab);
    req.prompt.insert(req.prompt.end(), question.begin(), question.end());
    req.prompt_keys.assign(req.prompt.size(), Hash128{});
    for (int64_t p = begin; p < begin + image_tokens; ++p) req.prompt_keys[p] = Hash128{image + 1, 0x1a6e};
    req.embedded.push_back({begin, begin + image_tokens, images[image].data(), true});
    req.sampling.temperature = 0;
    req.max_tokens = 3;
    req.loras = configs[config];
    StepOutput want, got;
    for (auto [e, out] : {std::pair{&cold, &want}, std::pair{&engine, &got}})
      out->result = e->generate(req, [&, out = out](int32_t tok, std::span<const float> logits) {
        out->tokens.push_back(tok);
        out->logits.emplace_back(logits.begin(), logits.end());
        return true;
      });
    ASSERT_TRUE(bit_identical(want, got)) << "step " << step << " config " << config << " image " << image;
    // A configuration's first request reuses nothing, whatever others cached.
    if (!seen[config]) {
      EXPECT_EQ(got.result.cached_tokens, 0) << "step " << step << " config " << config;
    }
    seen[config] = true;
    hits += got.result.cached_tokens > begin;  // reused past the image
  }
  EXPECT_GT(hits, 3);
}

// The same adapter twice, at one scale, in two requests: the second reuses
// the first's prompt. At another scale it reuses nothing.
TEST(LoraCache, ScaleIsPartOfTheKey) {
  test::LoadedModel& base = base_model("llama");
  const auto a = adapter_for(base, "all", spec_all(11, 8, 16.0f));
  ThreadPool pool(2);
  PrefixCache cache(base.model->state_spec(), PrefixCacheConfig{});
  Engine engine(*base.model, pool, &cache);
  std::mt19937_64 rng(1);
  const std::vector<int32_t> prompt = random_prompt(rng, 80, base.model->info().n_vocab);
  EXPECT_EQ(run_with(engine, prompt, 2, {{a, 1.0f}}).result.cached_tokens, 0);
  EXPECT_GT(run_with(engine, prompt, 2, {{a, 1.0f}}).result.cached_tokens, 0);
  EXPECT_EQ(run_with(engine, prompt, 2, {{a, 0.999f}}).result.cached_tokens, 0);
  EXPECT_EQ(run_with(engine, prompt, 2, {}).result.cached_tokens, 0);
  EXPECT_NE(engine.namespace_for("", {{a, 1.0f}}).hash(), engine.namespace_for("", {{a, 0.5f}}).hash());
  EXPECT_NE(engine.namespace_for("", {{a, 1.0f}}).hash(), engine.namespace_for("", {}).hash());
  EXPECT_NE(engine.namespace_for("t1", {{a, 1.0f}}).hash(), engine.namespace_for("t2", {{a, 1.0f}}).hash());
}

// Speculative decoding with an adapter: the base model drafts (it runs
// without the adapter), the target verifies with it, and the greedy tokens
// and logits are those of the adapter alone; a cached second turn too.
TEST(LoraCache, SpeculativeDecodingVerifiesWithTheAdapter) {
  test::LoadedModel& base = base_model("llama");
  Model& model = *base.model;
  const auto a = adapter_for(base, "all", spec_all(11, 8, 16.0f));
  const std::vector<LoraUse> loras = {{a, 0.8f}};
  ThreadPool pool(2);
  Engine plain(model, pool, nullptr);
  PrefixCache cache(model.state_spec(), PrefixCacheConfig{}), draft_cache(model.state_spec(), PrefixCacheConfig{});
  Engine speculative(model, pool, &cache);
  speculative.set_draft(model, &draft_cache, 4);
  std::mt19937_64 rng(44);
  std::vector<int32_t> prompt = random_prompt(rng, 30, model.info().n_vocab);
  int64_t drafted = 0, accepted = 0;
  for (int turn = 0; turn < 3; ++turn) {
    const StepOutput want = run_with(plain, prompt, 24, loras);
    const StepOutput got = run_with(speculative, prompt, 24, loras);
    ASSERT_TRUE(bit_identical(want, got)) << "turn " << turn;
    drafted += got.result.drafted_tokens;
    accepted += got.result.accepted_tokens;
    if (turn > 0) {
      EXPECT_GT(got.result.cached_tokens, 0);
    }
    prompt.insert(prompt.end(), got.tokens.begin(), got.tokens.end());
    const auto more = random_prompt(rng, 5, model.info().n_vocab);
    prompt.insert(prompt.end(), more.begin(), more.end());
  }
  EXPECT_GT(drafted, 0);
  EXPECT_LT(accepted, drafted) << "the draft (without the adapter) should miss some: else it verified nothing";
}

// ---------------------------------------------------------------- refusals

std::string expect_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

// A hand-made adapter: `tensors` of (name, shape) in F32, filled with 0.01.
std::unique_ptr<gguf::File> adapter_file(const std::vector<std::pair<std::string, std::vector<uint64_t>>>& tensors,
                                         const std::string& arch = "llama", const std::string& type = "adapter",
                                         const std::string& adapter_type = "lora", float value = 0.01f,
                                         std::optional<gguf::MetaValue> alpha = gguf::MetaValue::f32(8.0f)) {
  gguf::Writer w;
  w.set_string("general.architecture", arch);
  if (!type.empty()) w.set_string("general.type", type);
  if (!adapter_type.empty()) w.set_string("adapter.type", adapter_type);
  if (alpha) w.set("adapter.lora.alpha", *alpha);
  for (const auto& [name, shape] : tensors) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    w.add_tensor_f32(name, shape, DType::F32, std::vector<float>(n, value));
  }
  const std::vector<uint8_t> bytes = w.to_bytes();
  return gguf::File::from_bytes(bytes, "adapter.gguf");
}

TEST(LoraRefusals, MalformedFilesAreRefusedWithTheirReason) {
  // tiny llama: n_embd 128, q 128 x 128.
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> good = {
      {"blk.0.attn_q.weight.lora_a", {128, 4}}, {"blk.0.attn_q.weight.lora_b", {4, 128}}};
  EXPECT_NO_THROW(LoraAdapter::from_file(adapter_file(good)));
  EXPECT_NE(expect_error([&] { LoraAdapter::from_file(adapter_file(good, "llama", "model")); }).find("not a LoRA adapter"),
            std::string::npos);
  EXPECT_NE(expect_error([&] { LoraAdapter::from_file(adapter_file(good, "llama", "adapter", "control_vector")); })
                .find("'control_vector' is not supported"),
            std::string::npos);
  EXPECT_NE(expect_error([&] { LoraAdapter::from_file(adapter_file({{"blk.0.attn_q.weight.lora_a", {128, 4}}})); })
                .find("has no 'blk.0.attn_q.weight.lora_b'"),
            std::string::npos);
  EXPECT_NE(expect_error([&] {
              LoraAdapter::from_file(adapter_file({{"blk.0.attn_q.weight.lora_a", {4, 128}},
                                                   {"blk.0.attn_q.weight.lora_b", {4, 128}}}));
            }).find("do not chain"),
            std::string::npos);
  EXPECT_NE(expect_error([&] {
              auto tensors = good;
              tensors.push_back({"blk.0.attn_k.weight.lora_b", {4, 64}});  // a B without its A
              LoraAdapter::from_file(adapter_file(tensors));
            }).find("blk.0.attn_k.weight.lora_b"),
            std::string::npos);
  EXPECT_NE(expect_error([&] { LoraAdapter::from_file(adapter_file({})); }).find("no LoRA tensors"), std::string::npos);
  // An alpha beyond float's range would be an infinite factor.
  EXPECT_NE(expect_error([&] {
              LoraAdapter::from_file(adapter_file(good, "llama", "adapter", "lora", 0.01f, gguf::MetaValue::f64(1e300)));
            }).find("not a finite float"),
            std::string::npos);
  // A NaN would make every logit of its sequences NaN.
  EXPECT_NE(expect_error([&] { LoraAdapter::from_file(adapter_file(good, "llama", "adapter", "lora", std::nanf(""))); })
                .find("not finite"),
            std::string::npos);
  // A model file is not an adapter, and an adapter is not a model.
  test::LoadedModel& base = base_model("llama");
  EXPECT_NE(expect_error([&] { LoraAdapter::load(base.path); }).find("not a LoRA adapter"), std::string::npos);
  EXPECT_NE(expect_error([&] { load_model(*adapter_file(good)); }).find("is an adapter, not a model"),
            std::string::npos);
}

TEST(LoraRefusals, AdaptersThatDoNotFitTheModelAreRefused) {
  Model& llama = *base_model("llama").model;
  auto check = [&](const std::vector<std::pair<std::string, std::vector<uint64_t>>>& tensors,
                   const std::string& arch = "llama") {
    auto adapter = LoraAdapter::from_file(adapter_file(tensors, arch));
    return expect_error([&] { llama.check_adapter(*adapter); });
  };
  EXPECT_NO_THROW(LoraAdapter::from_file(adapter_file({{"blk.3.ffn_down.weight.lora_a", {384, 4}},
                                                       {"blk.3.ffn_down.weight.lora_b", {4, 128}}}))
                      .get());
  EXPECT_NE(check({{"blk.0.attn_q.weight.lora_a", {128, 4}}, {"blk.0.attn_q.weight.lora_b", {4, 128}}}, "qwen3")
                .find("for 'qwen3' models"),
            std::string::npos);
  EXPECT_NE(check({{"blk.0.attn_q.weight.lora_a", {64, 4}}, {"blk.0.attn_q.weight.lora_b", {4, 128}}})
                .find("maps 64 inputs"),
            std::string::npos);
  EXPECT_NE(check({{"blk.9.attn_q.weight.lora_a", {128, 4}}, {"blk.9.attn_q.weight.lora_b", {4, 128}}})
                .find("names layer 9"),
            std::string::npos);
  // "blk.00." is no name the model looks up: it would never apply (review, session 51).
  EXPECT_NE(check({{"blk.00.attn_q.weight.lora_a", {128, 4}}, {"blk.00.attn_q.weight.lora_b", {4, 128}}})
                .find("layer number"),
            std::string::npos);
  EXPECT_NE(check({{"blk.0.ffn_gate_inp.weight.lora_a", {128, 4}}, {"blk.0.ffn_gate_inp.weight.lora_b", {4, 8}}})
                .find("adapts no matrix"),
            std::string::npos);
  EXPECT_NE(check({{"output.weight.lora_a", {128, 4}}, {"output.weight.lora_b", {4, 512}}})
                .find("outside the layers"),
            std::string::npos);
  // Architectures without adapter support refuse every adapter.
  Model& mamba = *test::synthetic_model("lora-mamba", synthetic_preset("tiny-mamba")).model;
  auto any = LoraAdapter::from_file(adapter_file({{"blk.0.ssm_in.weight.lora_a", {64, 4}},
                                                  {"blk.0.ssm_in.weight.lora_b", {4, 256}}}, "mamba"));
  EXPECT_NE(expect_error([&] { mamba.check_adapter(*any); }).find("not supported for 'mamba'"), std::string::npos);
  // The engine refuses what the model refuses, and scales that are not finite.
  ThreadPool pool(1);
  Engine engine(mamba, pool, nullptr);
  GenerateRequest req;
  req.prompt = {5, 6, 7};
  req.max_tokens = 1;
  req.loras = {{any, 1.0f}};
  EXPECT_NE(expect_error([&] { engine.generate(req); }).find("not supported"), std::string::npos);
  Engine llama_engine(llama, pool, nullptr);
  req.loras = {{adapter_for(base_model("llama"), "all", spec_all(11, 8, 16.0f)), std::nanf("")}};
  EXPECT_NE(expect_error([&] { llama_engine.generate(req); }).find("finite"), std::string::npos);
}

// Adapters equal but for alpha never share cached state, however close the
// alphas (without alpha, the factor is 1; with 4e-7, about 1e-7: printed to
// six decimals both read 0.000000, and shared a fingerprint until review).
TEST(LoraRefusals, AlphaIsPartOfTheFingerprintBitForBit) {
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> good = {
      {"blk.0.attn_q.weight.lora_a", {128, 4}}, {"blk.0.attn_q.weight.lora_b", {4, 128}}};
  auto with_alpha = [&](std::optional<gguf::MetaValue> alpha) {
    return LoraAdapter::from_file(adapter_file(good, "llama", "adapter", "lora", 0.01f, std::move(alpha)));
  };
  const auto none = with_alpha(std::nullopt), tiny = with_alpha(gguf::MetaValue::f32(4e-7f)),
             half = with_alpha(gguf::MetaValue::f32(0.5f)),
             near_half = with_alpha(gguf::MetaValue::f32(std::nextafter(0.5f, 1.0f)));
  EXPECT_NE(none->fingerprint_hex(), tiny->fingerprint_hex());
  EXPECT_NE(half->fingerprint_hex(), near_half->fingerprint_hex());
  EXPECT_EQ(half->fingerprint_hex(), with_alpha(gguf::MetaValue::f32(0.5f))->fingerprint_hex());
  // A budget counts what the packed matrices take, not the (smaller) file.
  EXPECT_GE(none->packed_bytes(), none->pairs().begin()->second.a.packed_bytes());
  EXPECT_GT(none->packed_bytes(), none->file_bytes());
}

// Mutated adapter files (bytes flipped, cut short) load or fail with an
// error; what loads is checked against the model the same way.
TEST(LoraRefusals, MutatedFilesNeverCrash) {
  test::LoadedModel& base = base_model("llama");
  SyntheticLoraSpec spec = spec_some(3);
  spec.layers = {0};
  spec.targets = {"attn_k"};
  const std::string path = scratch_file("mutate-seed.gguf");
  make_synthetic_lora(base.path, spec, path);
  const auto seed = gguf::File::open(path);
  const std::vector<uint8_t> original(seed->bytes().begin(), seed->bytes().end());
  std::mt19937_64 rng(77);
  int loaded = 0, refused = 0;
  for (int i = 0; i < 1500; ++i) {
    std::vector<uint8_t> bytes = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % std::min<size_t>(bytes.size(), 400);  // metadata and tensor infos
      bytes[at] = static_cast<uint8_t>(rng());
    }
    if (rng() % 5 == 0) bytes.resize(rng() % bytes.size());
    try {
      auto adapter = LoraAdapter::from_file(gguf::File::from_bytes(bytes, "mutated.gguf"));
      try {
        base.model->check_adapter(*adapter);
      } catch (const Error&) {
      }
      ++loaded;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(loaded, 0);
}

}  // namespace
