// Generation for prompts with images, through the one Engine path: the
// prompt's images become embedded spans (each computed as one bidirectional
// batch), their digests the per-position prefix-cache keys.
//
// Reuse rule (the engine's): a cached prefix that ends inside an image is
// cut back to the image's first token, so an image is always computed as one
// whole batch, the way llama.cpp's mtmd decodes it. Attention-only models
// (what has vision encoders today); models with recurrent state are refused.
#pragma once
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

  int64_t n_ctx() const { return engine_.n_ctx(); }
  // Image batches prefilled so far.
  uint64_t image_batches() const { return engine_.counters().embedded_batches; }

 private:
  static EngineOptions with_mutex(EngineOptions options, std::mutex* forward_mutex);

  Model& model_;
  Engine engine_;
};

}  // namespace reprise
