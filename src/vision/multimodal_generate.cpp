#include "vision/multimodal_generate.h"

#include "util/error.h"

namespace reprise {

EngineOptions MultimodalGenerator::with_mutex(EngineOptions options, std::mutex* forward_mutex) {
  if (forward_mutex) options.forward_mutex = forward_mutex;
  return options;
}

MultimodalGenerator::MultimodalGenerator(Model& model, ThreadPool& pool, PrefixCache* cache,
                                         std::mutex* forward_mutex, const EngineOptions& options)
    : model_(model), engine_(model, pool, cache, with_mutex(options, forward_mutex)) {
  if (model.state_spec().has_recurrent())
    throw Error("multimodal generation supports attention-only models; '" + model.info().arch +
                "' has recurrent layers");
}

GenerateResult MultimodalGenerator::generate(const MultimodalPrompt& prompt, const GenerateRequest& request,
                                             const TokenCallback& on_token) {
  for (const PromptImage& img : prompt.images)
    if (img.embedding->n_embd != model_.info().n_embd)
      throw Error("image embedding width does not match the model");
  GenerateRequest req = request;
  req.prompt = prompt.tokens;
  req.prompt_keys = prompt.keys;
  req.draft_max = 0;
  req.embedded.clear();
  for (const PromptImage& img : prompt.images)
    req.embedded.push_back({img.begin, img.end, img.embedding->values.data(), prompt.bidirectional_images});
  return engine_.generate(req, on_token);
}

}  // namespace reprise
