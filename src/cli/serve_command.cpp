// reprise serve: the OpenAI-compatible HTTP server.
#include <CLI/CLI.hpp>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "server/http_server.h"
#include "server/model_registry.h"
#include "server/serve_options.h"
#include "util/error.h"

namespace reprise::cli {

namespace {

void log_line(const std::string& message) {
  static std::mutex mutex;
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &local);
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[%s] %s\n", stamp, message.c_str());
  std::fflush(stderr);
}

void serve(const ServeOptions& options) {
  if (auto err = options.validate(); !err.empty()) throw Error(err);

  // SIGINT/SIGTERM are taken by one thread (sigwait) that stops the server;
  // every other thread inherits the blocked mask, so block before any start.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  RegistryOptions registry_options = make_registry_options(options);
  registry_options.log = log_line;
  ModelRegistry registry(resolve_model_sources(options), registry_options);
  for (const std::string& id : registry.ids()) log_line("model '" + id + "' available");

  // The -m model is loaded up front so a bad file fails at start-up; the
  // others load when first requested. Its pass scratch is sized now too,
  // which spares the first long prompt ~0.1 s at 2048 wide in a VM whose
  // fresh memory is slow to fault in (docs/performance.md, session 44);
  // models loaded on demand size it as their prompts need it.
  if (!options.model_path.empty()) {
    Parsed<ModelLease> lease = registry.acquire(registry.default_id());
    if (!lease.ok()) throw Error(lease.error().message);
    lease.value()->engine->prepare_scratch();
  }

  HttpServer server(options, registry, log_line);
  const int port = server.bind();
  log_line("listening on http://" + options.host + ":" + std::to_string(port) + " (" +
           std::to_string(registry_options.threads) + " compute threads per model, " +
           std::to_string(options.parallel) + " parallel sequences, " +
           std::to_string(options.resolved_http_threads()) + " HTTP threads" +
           (options.api_key.empty() ? "" : ", API key required") + ")");

  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    timespec tick{0, 200'000'000};
    while (!done.load()) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        log_line(std::string("received ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ", stopping");
        server.stop();
        return;
      }
    }
  });
  server.serve();
  done.store(true);
  signal_thread.join();
  log_line("stopped");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve models over an OpenAI-compatible HTTP API");
  cmd->add_option("-m,--model-file", o->model_path, "GGUF model; the default for requests without \"model\"");
  cmd->add_option("--model", o->model_specs, "Another model as ID=PATH or PATH (repeatable); loaded on first use");
  cmd->add_option("--models-dir", o->models_dir, "Offer every *.gguf in DIR (id = file name without .gguf)");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port (0 = pick a free one)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Compute threads per model (default: one per physical core this process may use)");
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' (all endpoints but /health)");
  cmd->add_option("--cors-origin", o->cors_origins,
                  "Let browser pages from this origin call the API (CORS; repeatable; '*' for any)");
  cmd->add_option("--parallel", o->parallel, "Sequences generated concurrently; more requests queue")
      ->capture_default_str();
  cmd->add_option("--decode-batch", o->decode_batch,
                  "Most concurrent sequences of one model whose decode steps share a forward pass "
                  "(continuous batching; 1 disables)")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk-decoding", o->prefill_chunk_decoding,
                  "Prompt tokens per pass while other requests decode: smaller keeps their tokens flowing, "
                  "larger gives the new request its first token sooner")
      ->capture_default_str();
  cmd->add_option("--snapshot-ram", o->snapshot_ram_mib,
                  "Recurrent-state snapshot budget per SSM/hybrid model in MiB (0 disables)")
      ->capture_default_str();
  cmd->add_option("--draft-model", o->draft_model, "Draft model for speculative decoding of the default model");
  cmd->add_option("--draft-max", o->draft_max, "Tokens the draft proposes per step")->capture_default_str();
  cmd->add_option("--mmproj", o->mmproj, "Vision projector (mmproj GGUF) for the default model: image inputs");
  cmd->add_option("--lora", o->loras,
                  "LoRA adapter of the default model as NAME=PATH or PATH (repeatable): requests select it with "
                  "\"model\": NAME, or with \"lora\": [{\"id\": NAME or index, \"scale\": S}]");
  cmd->add_flag("--allow-lora-loading", o->allow_lora_loading,
                "Let clients (with the API key) load and unload LoRA adapters from files on this machine: "
                "POST /v1/load_lora_adapter {lora_name, lora_path, model}, /v1/unload_lora_adapter {lora_name}");
  cmd->add_option("--lora-of", o->model_loras, "LoRA adapter of another served model: MODEL NAME=PATH (repeatable)")
      ->type_size(2);
  cmd->add_option("--snapshot-max-entries", o->snapshot_max_entries, "Most snapshots kept per SSM/hybrid model")
      ->capture_default_str();
  cmd->add_option("--snapshot-ttl", o->snapshot_ttl_seconds, "Seconds a snapshot stays usable (0 = no limit)")
      ->capture_default_str();
  cmd->add_option("--mm-cache-bytes", o->mm_cache_bytes, "Vision encoder-output cache budget in bytes (0 stores nothing)")
      ->capture_default_str();
  cmd->add_option("--cache-ram", o->cache_ram_mib, "Prefix cache budget per model in MiB (0 disables)")
      ->capture_default_str();
  cmd->add_option("--responses-ram", o->responses_ram_mib,
                  "Budget in MiB for responses the Responses API stores (store: true) to continue "
                  "conversations with previous_response_id; least recently used go first (0 stores none)")
      ->capture_default_str();
  cmd->add_option("--pooling", o->pooling,
                  "Embeddings: pool every model's positions by mean or last (default: the pooling the GGUF "
                  "declares, else last)");
  cmd->add_option("--cache-total-ram", o->cache_total_ram_mib,
                  "One budget in MiB over every cache tier (KV blocks, snapshots, image embeddings) of every "
                  "loaded model, evicting the least recently used entry of any tier (0 = per-tier budgets only)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context length (0 = the model's training context)")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body accepted")->capture_default_str();
  cmd->add_option("--chat-template-file", o->chat_template_file, "Jinja chat template overriding the GGUF's");
  cmd->add_option("--models-max-ram", o->models_max_ram_mib,
                  "MiB of loaded models (file size + cache budget) before least-recently-used ones unload "
                  "(0 = no limit)")
      ->capture_default_str();
  cmd->add_option("--http-threads", o->http_threads, "Connection threads (default: max(32, 4*parallel+16))");
  cmd->add_option("--timeout", o->read_timeout_seconds,
                  "Seconds a client may stall while sending a request or reading a response")
      ->capture_default_str();
  cmd->add_flag("--no-log-requests{false}", o->log_requests, "Do not log one line per request");
  cmd->callback([o] {
    o->write_timeout_seconds = o->read_timeout_seconds;
    serve(*o);
  });
}

}  // namespace reprise::cli
