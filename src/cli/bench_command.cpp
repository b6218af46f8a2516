// reprise bench: prompt-processing and generation throughput like llama-bench,
// and `--replay chat`, a multi-turn replay measuring what the prefix cache saves.
#include <x86intrin.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "cache/prefix_cache.h"
#include "cli/commands.h"
#include "cli/lockstep.h"
#include "cli/replay_bench.h"
#include "engine/engine.h"
#include "engine/flat_memory.h"
#include "engine/model_bundle.h"
#include "gguf/gguf_file.h"
#include "tensor/decode_team.h"
#include "tensor/kernels.h"
#include "tensor/read_probe.h"
#include "util/error.h"

namespace reprise::cli {

namespace {

struct BenchOptions {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int n_depth = 0;  // tokens already in the context before each test (llama-bench -d)
  int sequences = 1;  // tgN: concurrent sequences decoded in shared passes (continuous batching)
  int threads = 0;
  int reps = 3;
  bool json = false;
  std::string replay;
  int turns = 8;
  int system_tokens = 1000;
  int turn_tokens = 200;
  int answer_tokens = 32;
  std::string draft_model;
  int draft_max = 8;
  std::vector<std::string> lockstep;  // {in FIFO, out FIFO}: take turns with another bench process
  std::string step_times;             // file: one line per timed step (test, index, seconds)
  // Where the tests' K/V live: "flat" (one buffer per layer, llama-bench's
  // layout) or "blocks" (the prefix cache's blocks, what the server reads).
  std::string kv_layout = "flat";
  std::string lora;  // a LoRA adapter every pass runs with (scale 1)
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

// Bytes of weights a forward pass streams per decoded token: every tensor but
// the token embedding, of which only one row is read (unless it doubles as
// the output projection).
uint64_t streamed_weight_bytes(const ModelBundle& b) {
  uint64_t total = 0;
  const bool tied = b.file->tensor("output.weight") == nullptr;
  for (const auto& t : b.file->tensors()) {
    if (t.name == "token_embd.weight" && !tied) {
      total += t.shape.size() > 1 && t.shape[1] > 0 ? t.n_bytes / t.shape[1] : 0;
      continue;
    }
    total += t.n_bytes;
  }
  return total;
}

// Mean K/V bytes one decode step of one sequence reads over a tgN test that
// starts at depth `depth`: every attention layer reads its K and V rows of
// the positions the new token attends to (its window, if it has one).
double kv_bytes_per_step(const StateSpec& spec, int depth, int n_gen) {
  double total = 0;
  for (int i = 0; i < n_gen; ++i)
    for (const LayerStateSpec& l : spec.layers) {
      if (l.kind != LayerStateKind::Attention) continue;
      const int64_t seen = l.window > 0 ? std::min<int64_t>(l.window, depth + i + 1) : depth + i + 1;
      total += static_cast<double>(seen) * (l.key_floats() + l.value_floats()) * sizeof(uint16_t);
    }
  return n_gen > 0 ? total / n_gen : 0;
}

struct Roofline {
  uint64_t weight_bytes = 0;    // all tensors (llama.cpp's convention for "model size")
  uint64_t streamed_bytes = 0;  // weights decode reads per token
  double kv_bytes = 0;          // K/V a tgN step reads per sequence, mean over the test
  double read_bw = 0;           // measured, bytes/s, working set = streamed_bytes
};

// A tgN test run once more with a probe pass after every decode step that
// reads the very weights a step reads, in the same order, with nothing else
// to do: the step's roofline at the same moment and with the same cache
// contents (each leaves L3 as the other would). The best probe pass of a run
// (Roofline::read_bw) reads a buffer of its own: an upper envelope of a
// bandwidth that drifts by 20 % within minutes here, and one that shares no
// L3 lines with the weights.
struct PairedRoofline {
  bool measured = false;
  double tokens_per_s = 0;  // over the paired steps
  double read_bw = 0;       // bytes/s: the probe passes between them (the better pattern's mean)
  // Each pattern's mean (bytes/s): one stream per thread, as decode tiles
  // read, and eight interleaved streams per thread. Where the second is
  // faster, part of the gap to read_bw is the pattern, not the kernels.
  double one_stream_bw = 0, eight_streams_bw = 0;
  double fraction = 0;      // the steps' (probed weights + K/V) bytes/s over read_bw
};

// Decode tests (tgN) stream the weights once per token, so tokens/s times
// the streamed bytes is compared with the measured read bandwidth; prompt
// tests (ppN) process N tokens per pass over the weights.
// tgN with several sequences (tgNxS) reports the tokens of all sequences per
// second; each pass advances all S of them.
void report(const BenchOptions& o, const ModelBundle& b, const std::string& test, const Spread& s, int threads,
            const Roofline& roof, const PairedRoofline& paired = {}, const std::string& prefetch = "",
            double team_share = 0.0, double team_wait_share = 0.0) {
  const bool decode = test.rfind("tg", 0) == 0;
  const double passes_per_s = decode ? s.mean / o.sequences : s.mean / std::max(1, o.n_prompt);
  const double eff_gbps = passes_per_s * roof.weight_bytes / 1e9;
  const double streamed_gbps = passes_per_s * roof.streamed_bytes / 1e9;
  // Each sequence of a pass reads its own K/V.
  const double kv_gbps = decode ? s.mean * roof.kv_bytes / 1e9 : 0;
  const double read_gbps = roof.read_bw / 1e9;
  const double fraction = read_gbps > 0 ? (streamed_gbps + kv_gbps) / read_gbps : 0;
  if (o.json) {
    std::printf("{\"test\":\"%s\",\"n_depth\":%d,\"sequences\":%d,\"tokens_per_s\":%.2f,\"stddev\":%.2f,\"threads\":%d,\"model\":\"%s\","
                "\"isa\":\"%s\",\"weight_bytes\":%llu,\"streamed_weight_bytes\":%llu,"
                "\"effective_weight_gbps\":%.2f,\"streamed_weight_gbps\":%.2f,\"kv_bytes_per_token\":%.0f,"
                "\"streamed_kv_gbps\":%.2f,\"read_bandwidth_gbps\":%.2f,\"roofline_fraction\":%.3f",
                test.c_str(), o.n_depth, decode ? o.sequences : 1, s.mean, s.stddev, threads, b.path.c_str(), kernel_isa_name(kernel_isa()),
                static_cast<unsigned long long>(roof.weight_bytes), static_cast<unsigned long long>(roof.streamed_bytes),
                eff_gbps, streamed_gbps, decode ? roof.kv_bytes : 0.0, kv_gbps, read_gbps, fraction);
    if (paired.measured)
      std::printf(",\"paired_tokens_per_s\":%.2f,\"paired_read_bandwidth_gbps\":%.2f,\"paired_roofline_fraction\":%.3f"
                  ",\"paired_read_one_stream_gbps\":%.2f,\"paired_read_eight_streams_gbps\":%.2f",
                  paired.tokens_per_s, paired.read_bw / 1e9, paired.fraction, paired.one_stream_bw / 1e9,
                  paired.eight_streams_bw / 1e9);
    if (decode)
      std::printf(",\"decode_prefetch\":\"%s\",\"decode_team_share\":%.3f,\"decode_team_wait_share\":%.3f",
                  prefetch.c_str(), team_share, team_wait_share);
    std::printf(",\"kv_layout\":\"%s\"", o.kv_layout.c_str());
    if (!o.lora.empty()) std::printf(",\"lora\":\"%s\"", o.lora.c_str());
    std::printf("}\n");
  } else {
    char paired_cell[16] = "-";
    if (paired.measured) std::snprintf(paired_cell, sizeof paired_cell, "%5.1f%%", 100 * paired.fraction);
    std::printf("| %-40s | %12s | %7d | %10.2f ± %-8.2f | %12.2f | %13.2f | %8.2f | %5.1f%% | %6s |\n",
                b.path.substr(b.path.find_last_of('/') + 1).c_str(), test.c_str(), threads, s.mean, s.stddev, eff_gbps,
                streamed_gbps, kv_gbps, 100 * fraction, paired_cell);
  }
  std::fflush(stdout);
}

// Fills positions [0, depth) of `memory` (untimed), as llama-bench -d does,
// so the timed test runs against a context of that length.
void prefill_depth(Model& model, SequenceMemory& memory, int depth, int64_t n_vocab, ThreadPool& pool,
                   std::vector<float>& logits) {
  if (depth <= 0) return;
  const auto toks = random_tokens(depth, n_vocab, 12345);
  constexpr int kChunk = 512;
  for (int p = 0; p < depth; p += kChunk) {
    ForwardBatch batch;
    batch.tokens = std::span<const int32_t>(toks.data() + p, std::min(kChunk, depth - p));
    batch.pos0 = p;
    model.forward(batch, memory, logits, pool);
  }
}

// Every timed step's seconds, per test, for --step-times. The file is
// opened up front, so a bad path fails before a long run, not after it.
class StepLog {
 public:
  explicit StepLog(const std::string& path) {
    if (path.empty()) return;
    file_.reset(std::fopen(path.c_str(), "w"));
    if (!file_) throw Error("cannot write step times to '" + path + "'");
  }
  void add(const std::string& test, double seconds) {
    if (file_) std::fprintf(file_.get(), "%s\t%d\t%.9f\n", test.c_str(), index_[test]++, seconds);
  }

 private:
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Close> file_;
  std::map<std::string, int> index_;
};

// A lockstep partner's turn leaves this pool's workers asleep, and a decode
// step that began with a worker asleep would run dispatched rather than as
// a team (decode_team_may_run): a turn wakes them before its timed step.
void wake_workers_for_turn(ThreadPool& pool, const Lockstep& turn) {
  if (turn.active()) pool.wake_workers(20000);
}

void throughput(const BenchOptions& o, ModelBundle& b) {
  const int threads = resolve_threads(o.threads);
  ThreadPool pool(threads);
  Model& model = *b.model;
  const int64_t n_vocab = model.info().n_vocab;
  // With --lockstep every step below runs in a turn: wait_turn() before its
  // untimed preparation, pass_turn() right after its timed part.
  Lockstep turn = o.lockstep.empty() ? Lockstep() : Lockstep(o.lockstep[0], o.lockstep[1]);
  StepLog log(o.step_times);
  std::vector<LoraUse> loras;
  if (!o.lora.empty()) {
    loras.push_back({LoraAdapter::load(o.lora), 1.0f});
    model.check_adapter(*loras.back().adapter);
  }
  Roofline roof;
  roof.weight_bytes = model.info().weight_bytes;
  roof.streamed_bytes = streamed_weight_bytes(b);
  turn.wait_turn();
  roof.read_bw = measure_read_bandwidth(roof.streamed_bytes, pool);
  turn.pass_turn();
  if (!o.json) {
    std::printf("measured read bandwidth: %.2f GB/s (%d threads, %.1f MB working set = weights streamed per token; "
                "probed again during tgN, which is compared with the best probe); "
                "kernels: %s; K/V: %s\n",
                roof.read_bw / 1e9, threads, roof.streamed_bytes / 1e6, kernel_isa_name(kernel_isa()),
                o.kv_layout == "blocks" ? "the prefix cache's blocks (as the server)"
                                        : "a flat buffer per layer (as llama-bench)");
    // weights GB/s: all tensors per pass (llama.cpp's model size); streamed
    // GB/s: the weights a pass reads; K/V GB/s: the K/V rows decode reads;
    // of BW: (streamed + K/V) / measured read bandwidth.
    std::printf("| %-40s | %12s | %7s | %21s | %12s | %13s | %8s | %6s | %6s |\n", "model", "test", "threads", "tokens/s",
                "weights GB/s", "streamed GB/s", "K/V GB/s", "of BW", "paired");
    std::printf("|------------------------------------------|--------------|---------|-----------------------|--------------|"
                "---------------|----------|--------|--------|\n");
  }
  // A sequence's memory for a test: with --kv-layout blocks its K/V live in
  // prefix-cache blocks (never committed, so never shared or indexed: a
  // cold request's layout), else in one flat buffer per layer.
  std::optional<PrefixCache> blocks;
  if (o.kv_layout == "blocks") {
    PrefixCacheConfig cfg;
    cfg.budget_bytes = ~uint64_t{0} >> 1;  // a run's blocks are never evicted under it
    blocks.emplace(model.state_spec(), cfg);
  }
  auto new_memory = [&]() -> std::unique_ptr<SequenceMemory> {
    if (blocks) return blocks->open(NamespaceKey{});
    return std::make_unique<FlatMemory>(model.state_spec());
  };
  std::vector<float> logits;
  // llama-bench names tests at depth "pp512 @ d4096"; one token keeps the
  // table's columns and the JSON field simple.
  const std::string depth_suffix = o.n_depth > 0 ? "@d" + std::to_string(o.n_depth) : "";
  if (o.n_prompt > 0) {
    const std::string test = "pp" + std::to_string(o.n_prompt) + depth_suffix;
    std::vector<double> rates;
    for (int r = -1; r < o.reps; ++r) {  // r = -1 warms up
      turn.wait_turn();
      const std::unique_ptr<SequenceMemory> owned = new_memory();
      SequenceMemory& memory = *owned;
      memory.prepare(0, o.n_depth + o.n_prompt);  // KV allocated up front, as llama.cpp does at context creation
      prefill_depth(model, memory, o.n_depth, n_vocab, pool, logits);
      auto toks = random_tokens(o.n_prompt, n_vocab, 1 + r);
      ForwardBatch batch;
      batch.tokens = toks;
      batch.pos0 = o.n_depth;
      batch.loras = loras;
      const double t0 = now_seconds();
      model.forward(batch, memory, logits, pool);
      const double dt = now_seconds() - t0;
      turn.pass_turn();
      if (r >= 0) {
        rates.push_back(o.n_prompt / dt);
        log.add(test, dt);
      }
    }
    report(o, b, test, spread(rates), threads, roof);
  }
  if (o.n_gen > 0) {
    const int n_seq = o.sequences;
    const std::string test =
        "tg" + std::to_string(o.n_gen) + (n_seq > 1 ? "x" + std::to_string(n_seq) : "") + depth_suffix;
    std::vector<double> rates;
    roof.kv_bytes = kv_bytes_per_step(model.state_spec(), o.n_depth, o.n_gen);
    // One run of the test: the sequences' memory, filled to the depth.
    struct DecodeRun {
      std::vector<std::unique_ptr<SequenceMemory>> memory;
      std::vector<SequenceStep> steps;
    };
    auto start_run = [&] {
      DecodeRun run;
      for (int s = 0; s < n_seq; ++s) {
        run.memory.push_back(new_memory());
        run.memory.back()->prepare(0, o.n_depth + o.n_gen);
        prefill_depth(model, *run.memory.back(), o.n_depth, n_vocab, pool, logits);
      }
      run.steps.resize(n_seq);
      for (int s = 0; s < n_seq; ++s) run.steps[s] = SequenceStep{1 + s, o.n_depth, run.memory[s].get()};
      return run;
    };
    // Step i of a run; returns its seconds (the next tokens are chosen after the clock stops).
    auto decode_step = [&](DecodeRun& run, int i) {
      const double t0 = now_seconds();
      if (n_seq == 1) {  // exactly what a single sequence's decode runs
        ForwardBatch batch;
        batch.tokens = std::span<const int32_t>(&run.steps[0].token, 1);
        batch.pos0 = run.steps[0].pos;
        batch.loras = loras;
        model.forward(batch, *run.memory[0], logits, pool);
      } else {
        model.forward_steps(run.steps, logits, pool);
      }
      const double dt = now_seconds() - t0;
      for (int s = 0; s < n_seq; ++s) {
        run.steps[s].token = static_cast<int32_t>(3 + (i * 7919 + s * 104729) % (n_vocab - 3));
        ++run.steps[s].pos;
      }
      return dt;
    };
    std::vector<std::span<const uint8_t>> step_weights;  // the weights a step reads, in order
    int64_t team_steps = 0;  // timed steps run by a decode team (tensor/decode_team.h)
    // Those steps' members' ticks, and the ticks they waited at barriers.
    double team_member_ticks = 0, team_waited_ticks = 0;
    for (int r = -1; r < o.reps; ++r) {
      turn.wait_turn();
      // The VM's bandwidth moves from minute to minute: probe again between
      // repetitions and compare against the best the machine gave meanwhile.
      roof.read_bw = std::max(roof.read_bw, measure_read_bandwidth(roof.streamed_bytes, pool, 2));
      DecodeRun run = start_run();
      double busy = 0;  // the steps' own time (a lockstep partner's turns excluded)
      for (int i = 0; i < o.n_gen; ++i) {
        if (i > 0) {
          turn.wait_turn();
          wake_workers_for_turn(pool, turn);
        }
        std::optional<WeightReadLog> weights_log;  // the warm-up's first step records what a step reads
        if (r < 0 && i == 0) weights_log.emplace();
        const uint64_t team_runs = DecodeTeam::runs(), waited0 = DecodeTeam::waited_ticks(), ticks0 = __rdtsc();
        const double dt = decode_step(run, i);
        const uint64_t ticks1 = __rdtsc();
        if (r >= 0 && DecodeTeam::runs() > team_runs) {
          ++team_steps;
          team_waited_ticks += static_cast<double>(DecodeTeam::waited_ticks() - waited0);
          team_member_ticks += static_cast<double>(ticks1 - ticks0) * threads;
        }
        if (weights_log) step_weights = weights_log->regions();
        turn.pass_turn();
        busy += dt;
        if (r >= 0) log.add(test, dt);
      }
      if (r >= 0) rates.push_back(static_cast<double>(o.n_gen) * n_seq / busy);
    }
    // The paired run (PairedRoofline) takes no lockstep turns: a partner
    // build without it would fall out of step.
    auto measure_paired = [&]() -> PairedRoofline {
      PairedRoofline paired;
      if (!o.lockstep.empty() || step_weights.empty()) return paired;
      ReadProbe probe(step_weights, pool);
      if (probe.bytes() == 0) return paired;
      DecodeRun run = start_run();
      probe.pass(1);  // warm-up, one pass per pattern
      probe.pass(8);
      double decode_s = 0, probe_s[2] = {0, 0};
      int probe_n[2] = {0, 0};
      for (int i = 0; i < o.n_gen; ++i) {
        decode_s += decode_step(run, i);
        probe_s[i % 2] += probe.pass(i % 2 ? 8 : 1);
        ++probe_n[i % 2];
      }
      if (probe_n[0] > 0) paired.one_stream_bw = probe_n[0] * probe.bytes() / probe_s[0];
      if (probe_n[1] > 0) paired.eight_streams_bw = probe_n[1] * probe.bytes() / probe_s[1];
      paired.read_bw = std::max(paired.one_stream_bw, paired.eight_streams_bw);
      paired.tokens_per_s = static_cast<double>(o.n_gen) * n_seq / decode_s;
      // The bytes the probe read (the packed weights) stand for the file's.
      const double step_bytes = probe.bytes() + n_seq * roof.kv_bytes;
      paired.fraction = o.n_gen * step_bytes / decode_s / paired.read_bw;
      paired.measured = true;
      return paired;
    };
    const PairedRoofline paired = measure_paired();
    const std::string prefetch = decode_prefetch_summary(pool);
    const double team_share =
        o.reps > 0 && o.n_gen > 0 ? static_cast<double>(team_steps) / (static_cast<double>(o.reps) * o.n_gen) : 0.0;
    const double team_wait_share = team_member_ticks > 0 ? team_waited_ticks / team_member_ticks : 0.0;
    report(o, b, test, spread(rates), threads, roof, paired, prefetch, team_share, team_wait_share);
    if (!o.json) {
      std::printf("decode prefetch (chosen at run time per weight type): %s\n", prefetch.c_str());
      std::printf("decode teams (one dispatch a step): %.0f %% of the timed steps; their members waited at "
                  "barriers %.1f %% of the time\n",
                  100 * team_share, 100 * team_wait_share);
    }
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prompt processing (pp) and generation (tg) throughput");
  cmd->add_option("-m,--model", o->model, "GGUF model (default: the built-in synthetic model)");
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens for the pp test (0 skips)")->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Generated tokens for the tg test (0 skips)")->capture_default_str();
  cmd->add_option("-d,--n-depth", o->n_depth, "Context tokens already present before each test (untimed prefill)")
      ->capture_default_str();
  cmd->add_option("-s,--sequences", o->sequences,
                  "tgN: sequences decoded together, one shared pass per step (continuous batching); "
                  "reports all sequences' tokens/s as tgNxS. Replay parallel: concurrent requests")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: one per physical core this process may use)");
  cmd->add_option("-r,--repetitions", o->reps, "Repetitions per test")->capture_default_str();
  cmd->add_flag("--json", o->json, "One JSON object per line per test");
  cmd->add_option("--lockstep", o->lockstep,
                  "IN,OUT: take turns with another bench process through two FIFOs, one timed step each, so both "
                  "see the same moments of a noisy host (scripts/paired_bench.sh)")
      ->expected(2)
      ->delimiter(',');
  cmd->add_option("--step-times", o->step_times, "Write every timed step's seconds to this file (test, index, seconds)");
  CLI::Option* kv_layout = cmd->add_option("--kv-layout", o->kv_layout,
                  "Where the K/V live: 'flat' (a buffer per layer, as llama-bench) or 'blocks' (the prefix "
                  "cache's blocks, as the server)")
      ->capture_default_str()
      ->check(CLI::IsMember({"flat", "blocks"}));
  cmd->add_option("--replay", o->replay,
                  "Replay a scripted workload instead: 'chat', 'speculative' or 'parallel' (-s concurrent requests)");
  cmd->add_option("--lora", o->lora, "A LoRA adapter GGUF every pass of the pp/tg tests runs with (scale 1)");
  cmd->add_option("--draft-model", o->draft_model, "Replay speculative: the draft model");
  cmd->add_option("--draft-max", o->draft_max, "Replay speculative: tokens drafted per step")->capture_default_str();
  cmd->add_option("--turns", o->turns, "Replay: turns")->capture_default_str();
  cmd->add_option("--system-tokens", o->system_tokens, "Replay: system prompt tokens")->capture_default_str();
  cmd->add_option("--turn-tokens", o->turn_tokens, "Replay: new user tokens per turn")->capture_default_str();
  cmd->add_option("--answer-tokens", o->answer_tokens, "Replay: generated tokens per turn")->capture_default_str();
  cmd->callback([o, kv_layout] {
    if (o->reps < 1) throw Error("--repetitions must be at least 1");
    if (o->n_depth < 0 || o->n_prompt < 0 || o->n_gen < 0) throw Error("-p, -n and -d must not be negative");
    if (o->sequences < 1 || o->sequences > 256) throw Error("--sequences must be between 1 and 256");
    if (!o->replay.empty() && (!o->lockstep.empty() || !o->step_times.empty()))
      throw Error("--lockstep and --step-times time the pp/tg tests, not --replay");
    if (!o->lora.empty() && (!o->replay.empty() || o->sequences > 1))
      throw Error("--lora measures the pp/tg tests of one sequence");
    if (!o->replay.empty() && kv_layout->count() > 0)
      throw Error("--kv-layout places the pp/tg tests' K/V; --replay always runs over the prefix cache's blocks");
    const std::string path = o->model.empty() ? default_model_path() : o->model;
    auto bundle = load_model_bundle(path, [](const std::string& s) { std::fprintf(stderr, "[load] %s\n", s.c_str()); });
    ReplayOptions r{resolve_threads(o->threads), o->turns, o->system_tokens, o->turn_tokens, o->answer_tokens,
                    o->n_gen, o->draft_max, o->sequences};
    if (o->replay.empty()) throughput(*o, *bundle);
    else if (o->replay == "chat") replay_chat(r, *bundle);
    else if (o->replay == "speculative") replay_speculative(r, *bundle, o->draft_model);
    else if (o->replay == "parallel") replay_parallel(r, *bundle);
    else throw Error("unknown replay '" + o->replay + "' (available: chat, speculative, parallel)");
  });
}

}  // namespace reprise::cli
