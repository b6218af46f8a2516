// reprise run: generate text for one or more prompts, streaming to stdout.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cache/prefix_cache.h"
#include "cli/commands.h"
#include "cli/paced_output.h"
#include "cli/run_vision.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "grammar/json_constraint.h"
#include "util/error.h"
#include "util/read_file.h"

namespace reprise::cli {

namespace {

struct RunOptions {
  std::string model;
  std::vector<std::string> prompts;
  int64_t n_predict = 64;
  SamplingParams sampling;
  int threads = 0;
  bool verbose = false;
  double cache_ram_mib = 256;
  double snapshot_ram_mib = 256;
  size_t snapshot_max_entries = 4096;
  double snapshot_ttl_seconds = 0;
  std::string cache_salt;
  std::string draft_model;
  int draft_max = 8;
  std::string mmproj;               // vision projector: prompts may carry --image files
  std::vector<std::string> images;
  bool json = false;                // structured output: a JSON object
  std::string json_schema_file;     // structured output: a document this schema allows
  std::vector<std::string> loras;   // LoRA adapters at scale 1
  std::vector<std::string> scaled_loras;  // PATH SCALE pairs
};

// The schema --json / --json-schema ask for, or null.
std::shared_ptr<const JsonSchema> output_schema(const RunOptions& o) {
  if (!o.json_schema_file.empty()) {
    const std::optional<std::string> text = read_whole_file(o.json_schema_file);
    if (!text) throw Error("cannot read --json-schema file " + o.json_schema_file);
    const nlohmann::json schema = nlohmann::json::parse(*text, nullptr, false);
    if (schema.is_discarded()) throw Error("--json-schema file " + o.json_schema_file + " is not JSON");
    return JsonSchema::compile(schema);
  }
  return o.json ? JsonSchema::any_object() : nullptr;
}

void run(const RunOptions& o) {
  const std::string path = o.model.empty() ? default_model_path() : o.model;
  if (o.model.empty())
    std::fprintf(stderr, "no -m given: using the built-in synthetic model %s (random weights)\n", path.c_str());
  auto bundle = load_model_bundle(path, [](const std::string& s) { std::fprintf(stderr, "[load] %s\n", s.c_str()); });
  ThreadPool pool(resolve_threads(o.threads));
  PrefixCacheConfig cfg;
  cfg.budget_bytes = static_cast<uint64_t>(o.cache_ram_mib * 1024 * 1024);
  PrefixCache cache(bundle->model->state_spec(), cfg);
  const std::shared_ptr<const JsonSchema> schema = output_schema(o);
  if (schema && (!o.mmproj.empty() || !o.images.empty()))
    throw Error("--json and --json-schema are for text prompts (use the server's response_format with images)");
  if ((!o.loras.empty() || !o.scaled_loras.empty()) && (!o.mmproj.empty() || !o.images.empty()))
    throw Error("--lora is for text prompts in 'reprise run' (the server applies adapters to requests with images)");
  const auto vocabulary = schema ? std::make_shared<JsonVocabulary>(output_pieces(*bundle->tokenizer)) : nullptr;
  if (!o.mmproj.empty() || !o.images.empty()) {
    run_with_images(*bundle, pool, cache,
                    VisionRunOptions{o.mmproj, o.images, o.prompts, o.n_predict, o.sampling, o.cache_salt, 256, o.verbose});
    return;
  }
  SnapshotConfig snap_cfg;
  snap_cfg.budget_bytes = static_cast<uint64_t>(o.snapshot_ram_mib * 1024 * 1024);
  snap_cfg.chunk_tokens = cfg.block_tokens;
  snap_cfg.max_entries = o.snapshot_max_entries;
  snap_cfg.ttl_seconds = o.snapshot_ttl_seconds;
  SnapshotStore snapshots(bundle->model->state_spec(), snap_cfg);
  Engine engine(*bundle->model, pool, &cache, {}, &snapshots);
  std::unique_ptr<ModelBundle> draft;
  std::unique_ptr<PrefixCache> draft_cache;
  if (!o.draft_model.empty()) {
    draft = load_model_bundle(o.draft_model, [](const std::string& s) { std::fprintf(stderr, "[draft] %s\n", s.c_str()); });
    check_draft_compatible(*bundle, *draft);
    draft_cache = std::make_unique<PrefixCache>(draft->model->state_spec(), cfg);
    engine.set_draft(*draft->model, draft_cache.get(), o.draft_max);
  }

  std::vector<LoraUse> loras;
  for (const std::string& p : o.loras) loras.push_back({LoraAdapter::load(p), 1.0f});
  for (size_t i = 0; i + 1 < o.scaled_loras.size(); i += 2) {
    char* end = nullptr;
    const float scale = std::strtof(o.scaled_loras[i + 1].c_str(), &end);
    if (end == o.scaled_loras[i + 1].c_str() || *end || !std::isfinite(scale))
      throw Error("--lora-scaled " + o.scaled_loras[i] + ": '" + o.scaled_loras[i + 1] + "' is not a finite number");
    loras.push_back({LoraAdapter::load(o.scaled_loras[i]), scale});
  }
  for (size_t i = 0; i < loras.size(); ++i) {
    bundle->model->check_adapter(*loras[i].adapter);
    // As the server's lora field: a scale in [-100, 100], each adapter once.
    if (!(std::fabs(loras[i].scale) <= kLoraScaleLimit))
      throw Error(loras[i].adapter->path() + ": a LoRA scale must be in [-" + std::to_string(static_cast<int>(kLoraScaleLimit)) +
                  ", " + std::to_string(static_cast<int>(kLoraScaleLimit)) + "]");
    for (size_t j = 0; j < i; ++j)
      if (loras[j].adapter->fingerprint_hex() == loras[i].adapter->fingerprint_hex())
        throw Error(loras[i].adapter->path() + ": the same adapter is given twice (give it once, scaled)");
  }

  std::vector<std::string> prompts = o.prompts;
  if (prompts.empty()) prompts.push_back("Once upon a time");
  for (const std::string& text : prompts) {
    GenerateRequest req;
    req.prompt = bundle->tokenizer->encode(text, /*add_special=*/true, /*parse_special=*/true);
    req.sampling = o.sampling;
    req.max_tokens = o.n_predict;
    req.stop_tokens = bundle->eog_tokens;
    req.cache_salt = o.cache_salt;
    req.loras = loras;
    if (schema) req.constraint = std::make_shared<JsonConstraint>(schema, vocabulary);
    StreamDecoder decoder(*bundle->tokenizer);
    PacedOutput out;
    out.write(text);
    out.flush();
    GenerateResult r = engine.generate(req, [&](int32_t tok, std::span<const float>) {
      if (!bundle->tokenizer->is_eog(tok)) out.write(decoder.push(tok));
      return true;
    });
    out.write(decoder.flush());
    out.write("\n");
    out.flush();
    const double pp = r.prefill_seconds > 0 ? (r.prompt_tokens - r.cached_tokens) / r.prefill_seconds : 0;
    const double tg = r.decode_seconds > 0 && r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0;
    std::fprintf(stderr,
                 "\n[timing] prompt: %lld tokens (%lld cached) in %.3f s (%.1f tokens/s); "
                 "generation: %zu tokens in %.3f s (%.1f tokens/s); finish: %s\n",
                 static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.cached_tokens),
                 r.prefill_seconds, pp, r.tokens.size(), r.decode_seconds, tg, r.finish_reason.c_str());
    if (r.drafted_tokens > 0)
      std::fprintf(stderr, "[draft] drafted %lld, accepted %lld (%.1f%%)\n", static_cast<long long>(r.drafted_tokens),
                   static_cast<long long>(r.accepted_tokens), 100.0 * r.accepted_tokens / r.drafted_tokens);
    if (o.verbose) {
      std::fprintf(stderr, "[cache] %s\n", r.reuse.describe().c_str());
      if (bundle->model->state_spec().has_recurrent()) {
        SnapshotStats ss = snapshots.stats();
        std::fprintf(stderr, "[snapshots] hits %llu misses %llu entries %llu (%.2f MiB) tokens saved %llu\n",
                     (unsigned long long)ss.hits, (unsigned long long)ss.misses, (unsigned long long)ss.entries,
                     ss.bytes / 1048576.0, (unsigned long long)ss.tokens_saved);
      }
      CacheStats s = cache.stats();
      std::fprintf(stderr,
                   "[cache] lookups %llu hits %llu misses %llu tokens reused %llu; blocks %llu "
                   "(in use %llu, cached %llu, shared %llu); %.2f MiB of %.2f MiB; evictions %llu\n",
                   (unsigned long long)s.lookups, (unsigned long long)s.hits, (unsigned long long)s.misses,
                   (unsigned long long)s.tokens_reused, (unsigned long long)s.blocks,
                   (unsigned long long)s.blocks_in_use, (unsigned long long)s.blocks_cached,
                   (unsigned long long)s.blocks_shared, s.bytes / 1048576.0, s.budget_bytes / 1048576.0,
                   (unsigned long long)s.evictions);
    }
  }
}

}  // namespace

void register_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt, streaming it as it is produced");
  cmd->add_option("-m,--model", o->model, "GGUF model (default: a built-in synthetic model)");
  cmd->add_option("-p,--prompt", o->prompts,
                  "Prompt; repeat to run several prompts in turn through one prefix cache");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temp", o->sampling.temperature, "Temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Top-p (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "Min-p (0 = off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", o->sampling.repeat_penalty, "Repetition penalty (1 = off)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o->sampling.frequency_penalty,
                  "Subtracted from a token's logit per occurrence in the window ([-2, 2], 0 = off)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o->sampling.presence_penalty,
                  "Subtracted once from the logit of a token in the window ([-2, 2], 0 = off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", o->sampling.repeat_last_n, "Tokens the penalties look back over")
      ->capture_default_str();
  cmd->add_option("--seed", o->sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: one per physical core this process may use)");
  cmd->add_option("--cache-ram", o->cache_ram_mib, "Prefix cache budget in MiB (0 disables)")->capture_default_str();
  cmd->add_option("--cache-salt", o->cache_salt, "Cache namespace salt (tenant isolation)");
  cmd->add_option("--snapshot-ram", o->snapshot_ram_mib,
                  "Recurrent-state snapshot budget in MiB for SSM/hybrid models (0 disables)")
      ->capture_default_str();
  cmd->add_option("--snapshot-max-entries", o->snapshot_max_entries, "Most snapshots kept")->capture_default_str();
  cmd->add_option("--snapshot-ttl", o->snapshot_ttl_seconds, "Seconds a snapshot stays usable (0 = no limit)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Write a JSON object (structured output)");
  cmd->add_option("--json-schema", o->json_schema_file,
                  "Write a JSON document this JSON Schema file allows (structured output; docs/server.md)");
  cmd->add_option("--draft-model", o->draft_model, "Draft model for speculative decoding (same vocabulary)");
  cmd->add_option("--draft-max", o->draft_max, "Tokens the draft proposes per step")->capture_default_str();
  cmd->add_option("--mmproj", o->mmproj, "Vision projector GGUF (mmproj) for --image");
  cmd->add_option("--image", o->images,
                  "Image file (PNG, JPEG, WebP); repeat for several. Placed at <__media__> markers in the "
                  "prompt, else before it");
  cmd->add_option("--lora", o->loras, "LoRA adapter GGUF applied at scale 1 (repeatable)");
  cmd->add_option("--lora-scaled", o->scaled_loras, "LoRA adapter GGUF and its scale: PATH SCALE (repeatable)")
      ->type_size(2);
  cmd->add_flag("-v,--verbose", o->verbose, "Print prefix-cache reuse and totals after each prompt");
  cmd->callback([o] { run(*o); });
}

}  // namespace reprise::cli
