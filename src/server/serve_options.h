// Everything `reprise serve` is configured with, independent of the CLI so
// tests start servers from the same struct.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/model_registry.h"

namespace reprise {

struct ServeOptions {
  // Models: -m PATH (the default model), --model ID=PATH or PATH
  // (repeatable) and every *.gguf in --models-dir. Ids are file names
  // without .gguf unless given.
  std::string model_path;
  std::vector<std::string> model_specs;
  std::string models_dir;

  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8080;                 // 0: an ephemeral port
  int threads = 0;                 // compute threads per model; 0: default_thread_count()
  std::string api_key;             // "": no authentication
  // Origins whose browser pages may call the API (CORS), e.g.
  // "http://localhost:3000", or "*" for any; empty: no CORS headers.
  std::vector<std::string> cors_origins;
  int parallel = 4;                // concurrent sequences across all models
  int decode_batch = 16;           // most sequences of one model sharing a decode pass; 1: no batching
  int prefill_chunk_decoding = 128;  // prompt chunk while others decode (bounds their inter-token delay)
  double cache_ram_mib = 256;      // prefix cache budget per model; 0 disables caching
  double snapshot_ram_mib = 256;   // recurrent-state snapshots per SSM/hybrid model; 0 disables
  double responses_ram_mib = 64;   // stored Responses API responses (store: true); 0 stores none
  std::string pooling;             // embeddings: "mean" or "last" for every model; "": each model's own (else last)
  std::string draft_model;         // speculative decoding draft for the default model
  int draft_max = 8;               // tokens drafted per step (requests may lower it)
  std::string mmproj;              // vision projector for the default model
  std::vector<std::string> loras;  // NAME=PATH: LoRA adapters of the default model
  std::vector<std::string> model_loras;  // MODEL, NAME=PATH pairs: LoRA adapters of another model
  uint64_t mm_cache_bytes = 256ull << 20;  // vision encoder-output cache; 0 stores nothing
  size_t snapshot_max_entries = 4096;  // per SSM/hybrid model
  double snapshot_ttl_seconds = 0;     // 0: snapshots never expire by age
  int64_t ctx_size = 0;            // 0: each model's training context
  size_t max_body_bytes = 8u << 20;
  std::string chat_template_file;  // overrides every model's template
  double models_max_ram_mib = 0;   // 0: no limit
  double cache_total_ram_mib = 0;  // one budget over all cache tiers of all models; 0: per-tier budgets only
  int http_threads = 0;            // connection threads; 0: max(32, 4 * parallel + 16)
  int read_timeout_seconds = 10;   // a client that stalls mid-request is dropped after this
  int write_timeout_seconds = 10;  // ... or one that stops reading its response
  bool log_requests = true;
  bool allow_lora_loading = false;  // POST /v1/load_lora_adapter, /v1/unload_lora_adapter

  // "" when valid, else what is wrong.
  std::string validate() const;
  int resolved_http_threads() const;
};

// The model list the options describe, default model first. Throws
// reprise::Error for a malformed --model, a missing directory, no models or
// duplicate ids.
std::vector<ModelSource> resolve_model_sources(const ServeOptions& options);

// Registry settings, reading --chat-template-file. Throws reprise::Error.
RegistryOptions make_registry_options(const ServeOptions& options);

}  // namespace reprise
