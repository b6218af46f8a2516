// Everything a server needs to accept images for one text model: the
// projector, the encoder-output cache, image decoding with limits, prompt
// splicing and multimodal generation, behind one object.
//
// Request flow (docs/vision.md):
//   1. for each image content part, in order: embed_data_url(url) (a
//      reprise::Error here is a 400 naming the part);
//   2. replace each image part by a text part holding kMediaMarker, render
//      the chat template as usual;
//   3. build_prompt(rendered, images) and generate(prompt, request, on_token).
// Thread-safe; images are encoded outside every lock but the pool's.
#pragma once
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "gguf/gguf_file.h"
#include "tensor/thread_pool.h"
#include "vision/clip_encoder.h"
#include "vision/encoder_cache.h"
#include "vision/image_decode.h"
#include "vision/image_embedder.h"
#include "vision/multimodal_generate.h"
#include "vision/multimodal_prompt.h"

namespace reprise {

struct VisionOptions {
  // --mm-cache-bytes; 0 stores nothing (concurrent requests for one image
  // still share one encode).
  uint64_t encoder_cache_bytes = 256ull << 20;
  ImageLimits limits;
  EngineOptions engine;  // context and prefill batch, as for the text engine
};

class VisionPipeline {
 public:
  // Loads and validates the mmproj and checks it belongs to `text` (output
  // width); throws reprise::Error otherwise. `forward_mutex` must be the lock
  // every other user of `pool` holds around forward passes (the text
  // engine's), or null when nothing else uses the pool. `prefix_cache` may
  // be null; share the text engine's so text and image requests reuse each
  // other's prefixes. Everything passed in must outlive the pipeline.
  VisionPipeline(const std::string& mmproj_path, ModelBundle& text, ThreadPool& pool, PrefixCache* prefix_cache,
                 std::mutex* forward_mutex, const VisionOptions& options = {});

  // `cache_salt`: the request's tenant salt (ImageEmbedder::embed).
  ImageEmbeddingPtr embed_data_url(std::string_view url, std::string_view cache_salt = {}) const {
    return embedder_.embed_data_url(url, cache_salt);
  }
  ImageEmbeddingPtr embed_bytes(std::span<const uint8_t> bytes, std::string_view cache_salt = {}) const {
    return embedder_.embed(bytes, cache_salt);
  }
  ImageEmbeddingPtr embed_file(const std::string& path, std::string_view cache_salt = {}) const {
    return embedder_.embed_file(path, cache_salt);
  }

  // `rendered` holds one kMediaMarker per image, in order.
  MultimodalPrompt build_prompt(std::string_view rendered, std::span<const ImageEmbeddingPtr> images) const;

  GenerateResult generate(const MultimodalPrompt& prompt, const GenerateRequest& request,
                          const TokenCallback& on_token = {}) {
    return generator_.generate(prompt, request, on_token);
  }

  // For /metrics and the server's memory budget (stats().bytes).
  EncoderCacheStats encoder_cache_stats() const { return cache_.stats(); }
  // Lets the encoder-output cache compete in a budget shared with other tiers.
  void share_encoder_cache_budget(MemoryBudget* budget) { cache_.share_budget(budget); }
  uint64_t encoder_runs() const { return embedder_.encoder_runs(); }
  const VisionEncoderInfo& encoder_info() const { return encoder_.info(); }

 private:
  ModelBundle& text_;
  std::unique_ptr<gguf::File> file_;
  ClipEncoder encoder_;
  EncoderCache cache_;
  ImageEmbedder embedder_;
  MultimodalGenerator generator_;
  MultimodalPromptOptions prompt_options_;
};

}  // namespace reprise
