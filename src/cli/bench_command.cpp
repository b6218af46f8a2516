// reprise bench: prompt-processing and generation throughput like llama-bench,
// and `--replay chat`, a multi-turn replay measuring what the prefix cache saves.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "cache/prefix_cache.h"
#include "cli/commands.h"
#include "engine/engine.h"
#include "engine/flat_memory.h"
#include "engine/model_bundle.h"
#include "util/error.h"

namespace reprise::cli {

namespace {

struct BenchOptions {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int threads = 0;
  int reps = 3;
  bool json = false;
  std::string replay;
  int turns = 8;
  int system_tokens = 1000;
  int turn_tokens = 200;
  int answer_tokens = 32;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Spread {
  double mean = 0, stddev = 0;
};
Spread spread(const std::vector<double>& v) {
  Spread s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / (v.size() - 1)) : 0;
  return s;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(3 + rng() % (n_vocab - 3));
  return v;
}

void report(const BenchOptions& o, const ModelBundle& b, const std::string& test, const Spread& s, int threads) {
  const double gbps = test.rfind("tg", 0) == 0 ? s.mean * b.model->info().weight_bytes / 1e9 : 0;
  if (o.json) {
    std::printf("{\"test\":\"%s\",\"tokens_per_s\":%.2f,\"stddev\":%.2f,\"threads\":%d,\"model\":\"%s\","
                "\"weight_bytes\":%llu,\"effective_weight_gbps\":%.2f}\n",
                test.c_str(), s.mean, s.stddev, threads, b.path.c_str(),
                static_cast<unsigned long long>(b.model->info().weight_bytes), gbps);
  } else {
    std::printf("| %-40s | %6s | %7d | %10.2f ± %-8.2f |\n", b.path.substr(b.path.find_last_of('/') + 1).c_str(),
                test.c_str(), threads, s.mean, s.stddev);
  }
  std::fflush(stdout);
}

void throughput(const BenchOptions& o, ModelBundle& b) {
  const int threads = resolve_threads(o.threads);
  ThreadPool pool(threads);
  Model& model = *b.model;
  const int64_t n_vocab = model.info().n_vocab;
  if (!o.json) {
    std::printf("| %-40s | %6s | %7s | %21s |\n", "model", "test", "threads", "tokens/s");
    std::printf("|------------------------------------------|--------|---------|-----------------------|\n");
  }
  std::vector<float> logits;
  if (o.n_prompt > 0) {
    std::vector<double> rates;
    for (int r = -1; r < o.reps; ++r) {  // r = -1 warms up
      FlatMemory memory(model.state_spec());
      auto toks = random_tokens(o.n_prompt, n_vocab, 1 + r);
      ForwardBatch batch;
      batch.tokens = toks;
      const double t0 = now_seconds();
      model.forward(batch, memory, logits, pool);
      const double dt = now_seconds() - t0;
      if (r >= 0) rates.push_back(o.n_prompt / dt);
    }
    report(o, b, "pp" + std::to_string(o.n_prompt), spread(rates), threads);
  }
  if (o.n_gen > 0) {
    std::vector<double> rates;
    for (int r = -1; r < o.reps; ++r) {
      FlatMemory memory(model.state_spec());
      int32_t tok = 1;
      const double t0 = now_seconds();
      for (int i = 0; i < o.n_gen; ++i) {
        ForwardBatch batch;
        batch.tokens = std::span<const int32_t>(&tok, 1);
        batch.pos0 = i;
        model.forward(batch, memory, logits, pool);
        tok = static_cast<int32_t>(3 + (i * 7919) % (n_vocab - 3));
      }
      const double dt = now_seconds() - t0;
      if (r >= 0) rates.push_back(o.n_gen / dt);
    }
    report(o, b, "tg" + std::to_string(o.n_gen), spread(rates), threads);
  }
}

// An agent-style chat: a long shared system prompt, then turns that each add
// the previous answer and a new user message. Cache on vs off vs the ideal
// (prefilling only the new tokens on top of an already-computed prefix).
void replay_chat(const BenchOptions& o, ModelBundle& b) {
  const int threads = resolve_threads(o.threads);
  ThreadPool pool(threads);
  Model& model = *b.model;
  const int64_t n_vocab = model.info().n_vocab;
  PrefixCacheConfig cfg;
  cfg.budget_bytes = 1ull << 30;
  PrefixCache cache(model.state_spec(), cfg);
  Engine cached(model, pool, &cache);
  Engine uncached(model, pool, nullptr);

  std::vector<int32_t> conversation = random_tokens(o.system_tokens, n_vocab, 7);
  std::printf("replay chat: %d turns, %d-token system prompt, %d new user tokens and %d answer tokens per turn, "
              "%d threads\n",
              o.turns, o.system_tokens, o.turn_tokens, o.answer_tokens, threads);
  std::printf("| turn | prompt | reused | ideal reuse | TTFT cache on (s) | TTFT cache off (s) | new-tokens-only (s) | on/ideal |\n");
  std::printf("|------|--------|--------|-------------|-------------------|--------------------|---------------------|----------|\n");
  int64_t reused_total = 0, prompt_total = 0, ideal_total = 0;
  int64_t previous_computed = 0;  // positions whose state a previous turn computed
  for (int turn = 1; turn <= o.turns; ++turn) {
    auto user = random_tokens(o.turn_tokens, n_vocab, 100 + turn);
    conversation.insert(conversation.end(), user.begin(), user.end());
    GenerateRequest req;
    req.prompt = conversation;
    req.sampling.temperature = 0;
    req.max_tokens = o.answer_tokens;
    GenerateResult on = cached.generate(req);
    req.max_tokens = 1;
    GenerateResult off = uncached.generate(req);
    // Ideal: the already-computed prefix costs nothing; time only the new tokens.
    const int64_t ideal_reuse = std::min<int64_t>(previous_computed, conversation.size() - 1);
    FlatMemory memory(model.state_spec());
    std::vector<float> logits;
    ForwardBatch prefix;
    prefix.tokens = std::span<const int32_t>(conversation).subspan(0, ideal_reuse);
    prefix.logits_for = LogitsFor::None;
    if (ideal_reuse > 0) model.forward(prefix, memory, logits, pool);
    ForwardBatch rest;
    rest.tokens = std::span<const int32_t>(conversation).subspan(ideal_reuse);
    rest.pos0 = ideal_reuse;
    const double t0 = now_seconds();
    model.forward(rest, memory, logits, pool);
    const double ideal_s = now_seconds() - t0;
    std::printf("| %4d | %6zu | %6lld | %11lld | %17.4f | %18.4f | %19.4f | %8.2f |\n", turn, conversation.size(),
                static_cast<long long>(on.cached_tokens), static_cast<long long>(ideal_reuse), on.prefill_seconds,
                off.prefill_seconds, ideal_s, on.prefill_seconds / ideal_s);
    std::fflush(stdout);
    reused_total += on.cached_tokens;
    prompt_total += conversation.size();
    ideal_total += ideal_reuse;
    // The answer joins the conversation; all but its last token were computed.
    conversation.insert(conversation.end(), on.tokens.begin(), on.tokens.end());
    previous_computed = static_cast<int64_t>(conversation.size()) - 1;
  }
  std::printf("cache efficiency: %.4f (reused %lld of %lld prompt tokens); ideal for this script: %.4f\n",
              double(reused_total) / prompt_total, static_cast<long long>(reused_total),
              static_cast<long long>(prompt_total), double(ideal_total) / prompt_total);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prompt processing (pp) and generation (tg) throughput");
  cmd->add_option("-m,--model", o->model, "GGUF model (default: the built-in synthetic model)");
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens for the pp test (0 skips)")->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Generated tokens for the tg test (0 skips)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: all cores)");
  cmd->add_option("-r,--repetitions", o->reps, "Repetitions per test")->capture_default_str();
  cmd->add_flag("--json", o->json, "One JSON object per line per test");
  cmd->add_option("--replay", o->replay, "Replay a scripted workload instead: 'chat'");
  cmd->add_option("--turns", o->turns, "Replay: turns")->capture_default_str();
  cmd->add_option("--system-tokens", o->system_tokens, "Replay: system prompt tokens")->capture_default_str();
  cmd->add_option("--turn-tokens", o->turn_tokens, "Replay: new user tokens per turn")->capture_default_str();
  cmd->add_option("--answer-tokens", o->answer_tokens, "Replay: generated tokens per turn")->capture_default_str();
  cmd->callback([o] {
    if (o->reps < 1) throw Error("--repetitions must be at least 1");
    const std::string path = o->model.empty() ? default_model_path() : o->model;
    auto bundle = load_model_bundle(path, [](const std::string& s) { std::fprintf(stderr, "[load] %s\n", s.c_str()); });
    if (o->replay.empty()) throughput(*o, *bundle);
    else if (o->replay == "chat") replay_chat(*o, *bundle);
    else throw Error("unknown replay '" + o->replay + "' (available: chat)");
  });
}

}  // namespace reprise::cli
