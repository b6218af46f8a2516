#include "vision/multimodal_generate.h"

#include <algorithm>
#include <chrono>

#include "engine/flat_memory.h"
#include "engine/sampler.h"
#include "util/error.h"

namespace reprise {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

MultimodalGenerator::MultimodalGenerator(Model& model, ThreadPool& pool, PrefixCache* cache,
                                         std::mutex* forward_mutex, const EngineOptions& options)
    : model_(model), pool_(pool), cache_(cache), forward_mutex_(forward_mutex), options_(options) {
  if (model.state_spec().has_recurrent())
    throw Error("multimodal generation supports attention-only models; '" + model.info().arch +
                "' has recurrent layers");
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : model.info().n_ctx_train;
  if (options_.n_batch <= 0) options_.n_batch = 512;
}

NamespaceKey MultimodalGenerator::namespace_for(const std::string& cache_salt) const {
  // The engine's namespace: text-only and multimodal requests share prefixes.
  NamespaceKey ns;
  ns.model_fingerprint = model_.info().fingerprint;
  ns.cache_salt = cache_salt;
  return ns;
}

void MultimodalGenerator::forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits) {
  if (forward_mutex_) {
    std::lock_guard<std::mutex> lock(*forward_mutex_);
    model_.forward(batch, memory, logits, pool_);
  } else {
    model_.forward(batch, memory, logits, pool_);
  }
  forward_passes_++;
  if (batch.embeddings) image_batches_++;
}

GenerateResult MultimodalGenerator::generate(const MultimodalPrompt& prompt, const GenerateRequest& req,
                                             const TokenCallback& on_token) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.tokens.size());
  if (n_prompt == 0) throw Error("empty prompt");
  if (n_prompt >= n_ctx_)
    throw Error("prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                std::to_string(n_ctx_));
  if (auto err = req.sampling.validate(); !err.empty()) throw Error(err);
  for (int32_t t : prompt.tokens)
    if (t < 0 || t >= model_.info().n_vocab) throw Error("token id " + std::to_string(t) + " out of range");
  if (!prompt.keys.empty() && prompt.keys.size() != prompt.tokens.size())
    throw Error("prompt keys must match the prompt length");
  for (const PromptImage& img : prompt.images)
    if (img.embedding->n_embd != model_.info().n_embd)
      throw Error("image embedding width does not match the model");

  GenerateResult result;
  result.prompt_tokens = n_prompt;
  const auto t0 = std::chrono::steady_clock::now();

  std::unique_ptr<CachedSequence> cached;
  std::unique_ptr<FlatMemory> flat;
  SequenceMemory* memory;
  int64_t pos = 0;
  if (cache_ && req.use_cache) {
    cached = cache_->open(namespace_for(req.cache_salt));
    result.reuse = cached->attach_prefix(prompt.tokens, prompt.keys);
    pos = result.reuse.reused_tokens;
    if (const PromptImage* img = prompt.image_at(pos); img && img->begin < pos) {
      // The cached prefix ends inside an image: recompute the whole image.
      cached->truncate(img->begin);
      pos = img->begin;
      result.reuse.reused_tokens = pos;
      result.reuse.stop_reason = "image-boundary";
      result.reuse.stop_position = pos;
    }
    memory = cached.get();
  } else {
    flat = std::make_unique<FlatMemory>(model_.state_spec());
    result.reuse.prompt_tokens = n_prompt;
    result.reuse.stop_reason = "disabled";
    memory = flat.get();
  }
  result.cached_tokens = pos;

  auto keys_of = [&](int64_t from, int64_t n) {
    return prompt.keys.empty() ? std::span<const Hash128>{}
                               : std::span<const Hash128>(prompt.keys).subspan(from, n);
  };

  std::vector<float> logits;
  while (pos < n_prompt) {
    if (req.cancelled && req.cancelled->load()) {
      result.finish_reason = "cancelled";
      return result;
    }
    int64_t end;
    if (const PromptImage* img = prompt.image_at(pos)) {
      end = img->end;  // one image, whole, in its own batch
    } else {
      end = std::min(n_prompt, pos + options_.n_batch);
      for (const PromptImage& next : prompt.images)
        if (next.begin > pos) {
          end = std::min(end, next.begin);
          break;
        }
    }
    const ForwardBatch batch = prompt.batch(pos, end, end == n_prompt ? LogitsFor::Last : LogitsFor::None);
    forward(batch, *memory, logits);
    if (cached) cached->commit(batch.tokens, keys_of(pos, end - pos));
    pos = end;
  }
  result.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  Sampler sampler(req.sampling);
  std::vector<int32_t> history(prompt.tokens);
  result.finish_reason = "length";
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    const int32_t token = sampler.sample(logits, history);
    result.tokens.push_back(token);
    history.push_back(token);
    const bool keep_going = on_token ? on_token(token, logits) : true;
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), token) != req.stop_tokens.end() || !keep_going) {
      result.finish_reason = "stop";
      break;
    }
    if (req.cancelled && req.cancelled->load()) {
      result.finish_reason = "cancelled";
      break;
    }
    if (i + 1 == req.max_tokens || pos + 1 >= n_ctx_) break;
    ForwardBatch batch;
    batch.tokens = std::span<const int32_t>(&history.back(), 1);
    batch.pos0 = pos;
    batch.logits_for = LogitsFor::Last;
    forward(batch, *memory, logits);
    if (cached) cached->commit(batch.tokens);
    ++pos;
  }
  result.decode_seconds = seconds_since(t1);
  return result;
}

}  // namespace reprise
