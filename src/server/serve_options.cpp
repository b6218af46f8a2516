#include "server/serve_options.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "server/embeddings.h"
#include "tensor/cpu_topology.h"
#include "util/error.h"
#include "util/read_file.h"

namespace reprise {

std::string ServeOptions::validate() const {
  if (port < 0 || port > 65535) return "--port must be between 0 and 65535";
  if (parallel < 1 || parallel > 1024) return "--parallel must be between 1 and 1024";
  if (threads < 0) return "--threads must be >= 0";
  if (decode_batch < 1 || decode_batch > 256) return "--decode-batch must be between 1 and 256";
  if (prefill_chunk_decoding < 1 || prefill_chunk_decoding > 4096)
    return "--prefill-chunk-decoding must be between 1 and 4096";
  if (cache_ram_mib < 0) return "--cache-ram must be >= 0";
  if (snapshot_ram_mib < 0) return "--snapshot-ram must be >= 0";
  if (responses_ram_mib < 0) return "--responses-ram must be >= 0";
  if (!pooling.empty() && !pooling_from_name(pooling)) return "--pooling must be mean or last";
  if (snapshot_ttl_seconds < 0) return "--snapshot-ttl must be >= 0";
  if (draft_max < 1 || draft_max > 64) return "--draft-max must be between 1 and 64";
  if (ctx_size < 0) return "--ctx-size must be >= 0";
  if (max_body_bytes < 1024) return "--max-body-bytes must be at least 1024";
  if (models_max_ram_mib < 0) return "--models-max-ram must be >= 0";
  if (cache_total_ram_mib < 0) return "--cache-total-ram must be >= 0";
  if (http_threads < 0) return "--http-threads must be >= 0";
  if (http_threads > 0 && http_threads <= parallel) return "--http-threads must exceed --parallel";
  if (read_timeout_seconds < 1 || write_timeout_seconds < 1) return "timeouts must be at least 1 second";
  if (model_path.empty() && model_specs.empty() && models_dir.empty())
    return "give a model: -m MODEL.gguf, --model ID=PATH or --models-dir DIR";
  return {};
}

int ServeOptions::resolved_http_threads() const {
  return http_threads > 0 ? http_threads : std::max(32, 4 * parallel + 16);
}

namespace {
std::string id_from_path(const std::filesystem::path& p) { return p.stem().string(); }

// ID=PATH, or a bare PATH named after its file (`flag` and `form` name the
// option in errors: "--model", "ID=PATH").
std::pair<std::string, std::string> named_path(const std::string& spec, const std::string& flag,
                                               const std::string& form) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos) return {id_from_path(spec), spec};
  if (eq == 0 || eq + 1 == spec.size()) throw Error(flag + " expects " + form + ", got '" + spec + "'");
  return {spec.substr(0, eq), spec.substr(eq + 1)};
}
}  // namespace

std::vector<ModelSource> resolve_model_sources(const ServeOptions& options) {
  namespace fs = std::filesystem;
  std::vector<ModelSource> out;
  if (!options.model_path.empty()) out.push_back({id_from_path(options.model_path), options.model_path});
  for (const std::string& spec : options.model_specs) {
    auto [id, path] = named_path(spec, "--model", "ID=PATH");
    out.push_back({std::move(id), std::move(path)});
  }
  if (!options.models_dir.empty()) {
    std::error_code ec;
    if (!fs::is_directory(options.models_dir, ec)) throw Error("--models-dir " + options.models_dir + ": not a directory");
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(options.models_dir, ec)) {
      const fs::path& p = entry.path();
      // Vision projectors are not language models on their own.
      if (entry.is_regular_file() && p.extension() == ".gguf" && p.filename().string().rfind("mmproj", 0) != 0)
        files.push_back(p);
    }
    if (ec) throw Error("--models-dir " + options.models_dir + ": " + ec.message());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
      const std::string id = id_from_path(p);
      // An explicit -m / --model with the same id wins over the directory.
      if (std::none_of(out.begin(), out.end(), [&](const ModelSource& s) { return s.id == id; }))
        out.push_back({id, p.string()});
    }
  }
  if (out.empty()) throw Error("no models to serve");
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t j = i + 1; j < out.size(); ++j)
      if (out[i].id == out[j].id) throw Error("model id '" + out[i].id + "' is given twice");
  return out;
}

RegistryOptions make_registry_options(const ServeOptions& options) {
  RegistryOptions r;
  r.threads = options.threads > 0 ? options.threads : default_thread_count();
  r.cache_budget_bytes = static_cast<uint64_t>(options.cache_ram_mib * 1024 * 1024);
  r.snapshot_budget_bytes = static_cast<uint64_t>(options.snapshot_ram_mib * 1024 * 1024);
  r.max_decode_batch = options.decode_batch;
  r.prefill_chunk_decoding = options.prefill_chunk_decoding;
  r.draft_model_path = options.draft_model;
  r.draft_max = options.draft_max;
  r.mmproj_path = options.mmproj;
  // Base "" is the default model.
  auto add_lora = [&](const std::string& spec, const std::string& base, const char* flag) {
    auto [name, path] = named_path(spec, flag, "NAME=PATH");
    r.loras.push_back({std::move(name), std::move(path), base, nullptr});
  };
  for (const std::string& spec : options.loras) add_lora(spec, "", "--lora");
  if (options.model_loras.size() % 2) throw Error("--lora-of expects MODEL NAME=PATH");
  for (size_t i = 0; i + 1 < options.model_loras.size(); i += 2) {
    if (options.model_loras[i].empty()) throw Error("--lora-of expects MODEL NAME=PATH");
    add_lora(options.model_loras[i + 1], options.model_loras[i], "--lora-of");
  }
  r.mm_cache_bytes = options.mm_cache_bytes;
  r.shared_cache_budget_bytes = static_cast<uint64_t>(options.cache_total_ram_mib * 1024 * 1024);
  r.snapshot_max_entries = options.snapshot_max_entries;
  r.snapshot_ttl_seconds = options.snapshot_ttl_seconds;
  r.n_ctx = options.ctx_size;
  r.max_ram_bytes = static_cast<uint64_t>(options.models_max_ram_mib * 1024 * 1024);
  if (!options.chat_template_file.empty()) {
    r.chat_template_override = read_whole_file(options.chat_template_file);
    if (!r.chat_template_override) throw Error("--chat-template-file " + options.chat_template_file + ": cannot read");
  }
  return r;
}

}  // namespace reprise
