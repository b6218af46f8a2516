#include "cli/replay_bench.h"

#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "cache/prefix_cache.h"
#include "cache/snapshot_store.h"
#include "engine/engine.h"
#include "engine/flat_memory.h"
#include "util/error.h"

namespace reprise::cli {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int32_t> random_tokens(int64_t n, int64_t n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(3 + rng() % (n_vocab - 3));
  return v;
}

// Requests generated concurrently through one engine, one thread each.
struct ConcurrentRun {
  double seconds = 0;
  int64_t tokens = 0;                        // generated, all requests
  std::vector<std::vector<int32_t>> outputs;  // per request
};

ConcurrentRun generate_concurrently(Engine& engine, const std::vector<GenerateRequest>& reqs) {
  ConcurrentRun out;
  out.outputs.resize(reqs.size());
  const double t0 = now_seconds();
  std::vector<std::thread> threads;
  for (size_t c = 0; c < reqs.size(); ++c)
    threads.emplace_back([&, c] { out.outputs[c] = engine.generate(reqs[c]).tokens; });
  for (auto& t : threads) t.join();
  out.seconds = now_seconds() - t0;
  for (const auto& v : out.outputs) out.tokens += static_cast<int64_t>(v.size());
  return out;
}

// Mean sequence batches per forward pass.
double batches_per_pass(const PassBatchStats& s) { return s.passes ? double(s.sequences) / s.passes : 0.0; }

// A model whose logits always favour one token: as a draft, every proposal
// is rejected by any target that disagrees, which measures pure overhead.
class ContrarianDraft final : public Model {
 public:
  explicit ContrarianDraft(const Model& target) : target_(target) {
    info_ = target.info();
    info_.fingerprint[0] ^= 0xC0;
  }
  const ModelInfo& info() const override { return info_; }
  const StateSpec& state_spec() const override { return target_.state_spec(); }
  void forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits, ThreadPool&) override {
    memory.prepare(batch.pos0, batch.pos0 + static_cast<int64_t>(batch.tokens.size()));
    const int64_t rows = batch.logits_for == LogitsFor::All ? batch.tokens.size()
                         : batch.logits_for == LogitsFor::Last ? 1 : 0;
    logits.assign(rows * info_.n_vocab, 0.0f);
    for (int64_t r = 0; r < rows; ++r) logits[r * info_.n_vocab + 3] = 1.0f;
  }

 private:
  const Model& target_;
  ModelInfo info_;
};

}  // namespace

void replay_chat(const ReplayOptions& o, ModelBundle& b) {
  ThreadPool pool(o.threads);
  Model& model = *b.model;
  const int64_t n_vocab = model.info().n_vocab;
  const bool recurrent = model.state_spec().has_recurrent();
  PrefixCacheConfig cfg;
  cfg.budget_bytes = 1ull << 30;
  PrefixCache cache(model.state_spec(), cfg), cache_nosnap(model.state_spec(), cfg);
  SnapshotConfig sc;
  sc.budget_bytes = 1ull << 30;
  SnapshotStore snapshots(model.state_spec(), sc);
  Engine cached(model, pool, &cache, {}, &snapshots);
  Engine cached_no_snapshots(model, pool, &cache_nosnap);
  Engine uncached(model, pool, nullptr);

  // Turn t's prompt holds the system prompt, t user messages and t - 1
  // answers; it must leave room in the context for its own answer. A script
  // longer than the model's context runs the turns that fit, instead of
  // failing halfway through.
  const int64_t n_ctx = model.info().n_ctx_train;
  auto last_prompt = [&](int turns) {
    return static_cast<int64_t>(o.system_tokens) + int64_t{turns} * o.turn_tokens + int64_t{turns - 1} * o.answer_tokens;
  };
  int turns = o.turns;
  while (turns > 0 && n_ctx > 0 && last_prompt(turns) + o.answer_tokens > n_ctx) --turns;
  if (turns < 1)
    throw Error("replay chat: the model's context (" + std::to_string(n_ctx) + " tokens) does not hold one turn of " +
                std::to_string(last_prompt(1) + o.answer_tokens) + " tokens; lower --system-tokens or --turn-tokens");
  if (turns < o.turns)
    std::printf("note: the model's context (%lld tokens) holds %d of the %d turns asked for; running %d\n",
                static_cast<long long>(n_ctx), turns, o.turns, turns);

  // The "new tokens only" ideal: the first `reuse` tokens of `tokens`
  // computed untimed, then the rest timed; returns its seconds. Its memory is
  // sized for the whole prompt up front: growing it inside the timed pass
  // would copy the prefix's K/V and fault in fresh pages, which no cached
  // turn pays, and flatter the cache's ratio against this ideal.
  auto time_new_tokens = [&](std::span<const int32_t> tokens, int64_t reuse) {
    FlatMemory memory(model.state_spec());
    memory.prepare(0, static_cast<int64_t>(tokens.size()));
    std::vector<float> logits;
    ForwardBatch prefix;
    prefix.tokens = tokens.subspan(0, reuse);
    prefix.logits_for = LogitsFor::None;
    if (reuse > 0) model.forward(prefix, memory, logits, pool);
    ForwardBatch rest;
    rest.tokens = tokens.subspan(reuse);
    rest.pos0 = reuse;
    const double t0 = now_seconds();
    model.forward(rest, memory, logits, pool);
    return now_seconds() - t0;
  };

  // One untimed request of the first turn's length, of other tokens (no
  // reuse), through every path first: first-touch costs (fresh K/V pages,
  // pass buffers growing to a prompt's size) would otherwise fall on
  // whichever column ran first in turn 1 (it showed the cached engine's cold
  // turn 1.6x slower than the uncached one's, right after it).
  {
    GenerateRequest warm;
    warm.prompt = random_tokens(o.system_tokens + o.turn_tokens, n_vocab, 99);
    warm.sampling.temperature = 0;
    warm.max_tokens = o.answer_tokens;
    cached.generate(warm);
    if (recurrent) cached_no_snapshots.generate(warm);
    warm.max_tokens = 1;
    uncached.generate(warm);
    time_new_tokens(warm.prompt, 0);
  }
  const SnapshotStats warm_snapshots = snapshots.stats();

  std::vector<int32_t> conversation = random_tokens(o.system_tokens, n_vocab, 7);
  std::printf("replay chat on %s: %d turns, %d-token system prompt, %d new user tokens and %d answer tokens per "
              "turn, %d threads\n",
              b.path.c_str(), turns, o.system_tokens, o.turn_tokens, o.answer_tokens, o.threads);
  std::printf("| turn | prompt | reused | ideal reuse | TTFT cache on (s) |%s TTFT cache off (s) | new-tokens-only (s) "
              "| on/ideal |\n",
              recurrent ? " TTFT no snapshots (s) |" : "");
  int64_t reused_total = 0, prompt_total = 0, ideal_total = 0;
  int64_t previous_computed = 0;  // positions whose state a previous turn computed
  for (int turn = 1; turn <= turns; ++turn) {
    auto user = random_tokens(o.turn_tokens, n_vocab, 100 + turn);
    conversation.insert(conversation.end(), user.begin(), user.end());
    GenerateRequest req;
    req.prompt = conversation;
    req.sampling.temperature = 0;
    req.max_tokens = o.answer_tokens;
    GenerateResult on = cached.generate(req);
    GenerateResult no_snap;
    if (recurrent) no_snap = cached_no_snapshots.generate(req);
    req.max_tokens = 1;
    GenerateResult off = uncached.generate(req);
    // Ideal: the already-computed prefix costs nothing; time only the new tokens.
    const int64_t ideal_reuse = std::min<int64_t>(previous_computed, conversation.size() - 1);
    const double ideal_s = time_new_tokens(conversation, ideal_reuse);
    if (recurrent)
      std::printf("| %4d | %6zu | %6lld | %11lld | %17.4f | %21.4f | %18.4f | %19.4f | %8.2f |\n", turn,
                  conversation.size(), static_cast<long long>(on.cached_tokens), static_cast<long long>(ideal_reuse),
                  on.prefill_seconds, no_snap.prefill_seconds, off.prefill_seconds, ideal_s,
                  on.prefill_seconds / ideal_s);
    else
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
  if (recurrent) {
    // Counters of the script's turns only; entries and bytes as held now.
    SnapshotStats s = snapshots.stats();
    std::printf("snapshots: %llu hits, %llu misses, %llu entries (%.2f MiB), %llu tokens saved\n",
                (unsigned long long)(s.hits - warm_snapshots.hits), (unsigned long long)(s.misses - warm_snapshots.misses),
                (unsigned long long)s.entries, s.bytes / 1048576.0,
                (unsigned long long)(s.tokens_saved - warm_snapshots.tokens_saved));
  }
}

namespace {

// `clients` concurrent greedy speculative requests (own 64-token prompts):
// with draft and verify passes shared, against each request's passes run
// alone, and against shared plain decoding. Fails if any output differs.
void replay_speculative_concurrent(const ReplayOptions& o, Model& model, Model& draft, ThreadPool& pool) {
  std::vector<GenerateRequest> reqs(o.clients);
  for (int c = 0; c < o.clients; ++c) {
    reqs[c].prompt = random_tokens(64, model.info().n_vocab, 3 + c);
    reqs[c].sampling.temperature = 0;
    reqs[c].max_tokens = o.gen_tokens;
    reqs[c].use_cache = false;
  }
  struct Outcome : ConcurrentRun {
    PassBatchStats target, draft;
  };
  auto run = [&](int max_batch, bool speculative) {
    EngineOptions options;
    options.max_decode_batch = max_batch;
    Engine engine(model, pool, nullptr, options);
    if (speculative) engine.set_draft(draft, nullptr, o.draft_max);
    // Braced initializers run in order: the stats are read after the run.
    return Outcome{generate_concurrently(engine, reqs), engine.pass_stats(), engine.draft_pass_stats()};
  };
  run(o.clients, true);  // warm-up
  const Outcome plain = run(o.clients, false);
  const Outcome alone = run(1, true);
  const Outcome shared = run(o.clients, true);
  std::printf("%d concurrent requests, %d tokens each (greedy):\n", o.clients, o.gen_tokens);
  std::printf("| run | wall (s) | generated tokens/s | target batches per pass | draft batches per pass |\n");
  std::printf("| no draft, shared passes | %.3f | %.1f | %.2f | - |\n", plain.seconds, plain.tokens / plain.seconds,
              batches_per_pass(plain.target));
  std::printf("| draft, each request's passes alone | %.3f | %.1f | %.2f | %.2f |\n", alone.seconds,
              alone.tokens / alone.seconds, batches_per_pass(alone.target), batches_per_pass(alone.draft));
  std::printf("| draft, shared passes | %.3f | %.1f | %.2f | %.2f |\n", shared.seconds, shared.tokens / shared.seconds,
              batches_per_pass(shared.target), batches_per_pass(shared.draft));
  const bool same = plain.outputs == alone.outputs && alone.outputs == shared.outputs;
  std::printf("shared / alone: %.2fx; outputs identical: %s\n", alone.seconds / shared.seconds, same ? "yes" : "NO");
  if (!same) throw Error("concurrent speculative decoding changed a request's output");
}

}  // namespace

void replay_speculative(const ReplayOptions& o, ModelBundle& target, const std::string& draft_path) {
  if (draft_path.empty()) throw Error("--replay speculative needs --draft-model");
  auto draft = load_model_bundle(draft_path);
  check_draft_compatible(target, *draft);
  ThreadPool pool(o.threads);
  Model& model = *target.model;
  auto prompt = random_tokens(64, model.info().n_vocab, 3);
  auto timed = [&](Engine& e, GenerateResult& out) {
    GenerateRequest req;
    req.prompt = prompt;
    req.sampling.temperature = 0;
    req.max_tokens = o.gen_tokens;
    req.use_cache = false;
    const double t0 = now_seconds();
    out = e.generate(req);
    return out.tokens.size() / (now_seconds() - t0);
  };
  Engine plain(model, pool, nullptr);
  Engine with_draft(model, pool, nullptr);
  with_draft.set_draft(*draft->model, nullptr, o.draft_max);
  ContrarianDraft contrarian(model);
  Engine with_bad_draft(model, pool, nullptr);
  with_bad_draft.set_draft(contrarian, nullptr, o.draft_max);
  GenerateResult r0, r1, r2;
  timed(plain, r0);  // warm-up
  const double base = timed(plain, r0);
  const double spec = timed(with_draft, r1);
  const double bad = timed(with_bad_draft, r2);
  if (r0.tokens != r1.tokens) throw Error("speculative output differs from plain greedy output");
  std::printf("speculative replay: target %s, draft %s, %d tokens, draft-max %d, %d threads\n", target.path.c_str(),
              draft_path.c_str(), o.gen_tokens, o.draft_max, o.threads);
  std::printf("| run | tokens/s | drafted | accepted | acceptance | speed-up |\n");
  std::printf("| no draft | %.1f | - | - | - | 1.00 |\n", base);
  std::printf("| draft | %.1f | %lld | %lld | %.1f%% | %.2f |\n", spec, (long long)r1.drafted_tokens,
              (long long)r1.accepted_tokens, r1.drafted_tokens ? 100.0 * r1.accepted_tokens / r1.drafted_tokens : 0.0,
              spec / base);
  std::printf("| always-rejected draft | %.1f | %lld | %lld | %.1f%% | %.2f |\n", bad, (long long)r2.drafted_tokens,
              (long long)r2.accepted_tokens,
              r2.drafted_tokens ? 100.0 * r2.accepted_tokens / r2.drafted_tokens : 0.0, bad / base);
  if (o.clients > 1) replay_speculative_concurrent(o, model, *draft->model, pool);
}

void replay_parallel(const ReplayOptions& o, ModelBundle& b) {
  if (o.clients < 1 || o.clients > 256) throw Error("--clients must be between 1 and 256");
  ThreadPool pool(o.threads);
  Model& model = *b.model;
  const int64_t n_vocab = model.info().n_vocab;
  const std::vector<int32_t> system = random_tokens(o.system_tokens, n_vocab, 7);
  std::vector<GenerateRequest> reqs(o.clients);
  for (int c = 0; c < o.clients; ++c) {
    reqs[c].prompt = system;
    const auto user = random_tokens(o.turn_tokens, n_vocab, 1000 + c);
    reqs[c].prompt.insert(reqs[c].prompt.end(), user.begin(), user.end());
    reqs[c].sampling.temperature = 0;
    reqs[c].max_tokens = o.gen_tokens;
  }
  struct Outcome : ConcurrentRun {
    PassBatchStats batches;
  };
  auto run = [&](int max_decode_batch) {
    PrefixCacheConfig cfg;
    cfg.budget_bytes = 1ull << 30;
    PrefixCache cache(model.state_spec(), cfg);
    EngineOptions options;
    options.max_decode_batch = max_decode_batch;
    Engine engine(model, pool, &cache, options);
    return Outcome{generate_concurrently(engine, reqs), engine.pass_stats()};  // stats read after the run
  };
  std::printf("replay parallel on %s: %d concurrent requests, %d-token shared system prompt + %d own tokens, %d "
              "generated tokens each (greedy), %d threads\n",
              b.path.c_str(), o.clients, o.system_tokens, o.turn_tokens, o.gen_tokens, o.threads);
  run(o.clients);  // warm-up
  const Outcome alone = run(1);
  const Outcome batched = run(o.clients);
  std::printf("| passes | wall (s) | generated tokens/s | mean sequences per pass |\n");
  std::printf("| each sequence alone | %.3f | %.1f | %.2f |\n", alone.seconds, alone.tokens / alone.seconds,
              batches_per_pass(alone.batches));
  std::printf("| shared | %.3f | %.1f | %.2f |\n", batched.seconds, batched.tokens / batched.seconds,
              batches_per_pass(batched.batches));
  std::printf("speed-up %.2fx; outputs identical: %s\n", alone.seconds / batched.seconds,
              alone.outputs == batched.outputs ? "yes" : "NO");
  if (alone.outputs != batched.outputs) throw Error("batched decode changed a request's output");

  // A long prompt (system-tokens fresh tokens) arriving once the requests are
  // decoding: their longest gap between two tokens, and the newcomer's time
  // to first token, with its prompt prefilled in chunks of `chunk`.
  const std::vector<int32_t> long_prompt = random_tokens(std::max(1, o.system_tokens), n_vocab, 99);
  auto late_arrival = [&](int64_t chunk) {
    PrefixCacheConfig cfg;
    cfg.budget_bytes = 1ull << 30;
    PrefixCache cache(model.state_spec(), cfg);
    EngineOptions options;
    options.max_decode_batch = o.clients + 1;
    options.n_batch_while_decoding = chunk;
    Engine engine(model, pool, &cache, options);
    std::vector<std::vector<double>> stamps(o.clients);
    std::mutex started_mutex;
    std::condition_variable started;
    bool go = false;
    double late_start = 0, late_first = 0;
    std::vector<std::thread> threads;
    for (int c = 0; c < o.clients; ++c)
      threads.emplace_back([&, c] {
        engine.generate(reqs[c], [&](int32_t, std::span<const float>) {
          stamps[c].push_back(now_seconds());
          if (c == 0 && stamps[c].size() == 4) {
            std::lock_guard<std::mutex> lock(started_mutex);
            go = true;
            started.notify_all();
          }
          return true;
        });
      });
    threads.emplace_back([&] {
      {
        std::unique_lock<std::mutex> lock(started_mutex);
        started.wait(lock, [&] { return go; });
      }
      GenerateRequest late;
      late.prompt = long_prompt;
      late.max_tokens = 1;
      late_start = now_seconds();
      engine.generate(late, [&](int32_t, std::span<const float>) {
        late_first = now_seconds();
        return true;
      });
    });
    for (auto& t : threads) t.join();
    double max_gap = 0;
    for (const auto& s : stamps)
      for (size_t i = 2; i < s.size(); ++i) max_gap = std::max(max_gap, s[i] - s[i - 1]);
    return std::pair<double, double>{max_gap, late_first - late_start};
  };
  if (o.gen_tokens >= 8) {
    EngineOptions defaults;
    const auto whole = late_arrival(defaults.n_batch);
    const auto chunked = late_arrival(defaults.n_batch_while_decoding);
    std::printf("a %zu-token prompt arriving while they decode: their longest gap between tokens %.1f ms with "
                "%lld-token prefill chunks, %.1f ms with %lld-token chunks (its first token after %.1f / %.1f ms)\n",
                long_prompt.size(), 1e3 * whole.first, static_cast<long long>(defaults.n_batch), 1e3 * chunked.first,
                static_cast<long long>(defaults.n_batch_while_decoding), 1e3 * whole.second, 1e3 * chunked.second);
  }
}

}  // namespace reprise::cli
