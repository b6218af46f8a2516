// Generation for prompts with images: prefix-cache lookup with image-aware
// keys, prefill of the uncached rest (text in chunks, each image as one
// bidirectional batch), then the same decode loop as Engine::generate.
//
// Reuse rule: the cache may hold a prefix that ends inside an image (a tail
// block evicted, a partial block). Such a prefix is cut back to the image's
// first token, so an image is always computed as one whole batch, the way
// llama.cpp's mtmd decodes it.
//
// Kept beside the engine rather than inside it so vision can evolve without
// touching the text path; the request and result types are the engine's.
// Attention-only models (what has vision encoders today); models with
// recurrent state are refused.
#pragma once
#include <atomic>
#include <mutex>

#include "cache/prefix_cache.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tensor/thread_pool.h"
#include "vision/multimodal_prompt.h"

namespace reprise {

class MultimodalGenerator {
 public:
  // `cache` may be null. `forward_mutex`, when given, is held around every
  // forward pass (share it with anything else that uses `pool`). Everything
  // must outlive the generator.
  MultimodalGenerator(Model& model, ThreadPool& pool, PrefixCache* cache, std::mutex* forward_mutex = nullptr,
                      const EngineOptions& options = {});

  // Generates from `prompt`; request.prompt and request.prompt_keys are
  // ignored (the prompt's own are used), everything else applies as in
  // Engine::generate (draft_max is ignored: no speculative decoding here).
  // result.reuse reports the reuse after any cut back to an image start.
  GenerateResult generate(const MultimodalPrompt& prompt, const GenerateRequest& request,
                          const TokenCallback& on_token = {});

  NamespaceKey namespace_for(const std::string& cache_salt) const;
  int64_t n_ctx() const { return n_ctx_; }
  // Forward passes run so far, and how many of them were image batches.
  uint64_t forward_passes() const { return forward_passes_; }
  uint64_t image_batches() const { return image_batches_; }

 private:
  void forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits);

  Model& model_;
  ThreadPool& pool_;
  PrefixCache* cache_;
  std::mutex* forward_mutex_;
  EngineOptions options_;
  int64_t n_ctx_;
  std::atomic<uint64_t> forward_passes_{0};
  std::atomic<uint64_t> image_batches_{0};
};

}  // namespace reprise
