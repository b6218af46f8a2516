#include "cli/run_vision.h"

#include <chrono>
#include <cstdio>

#include "cli/paced_output.h"
#include "gguf/gguf_file.h"
#include "util/error.h"
#include "vision/clip_encoder.h"
#include "vision/encoder_cache.h"
#include "vision/image_embedder.h"
#include "vision/multimodal_generate.h"
#include "vision/multimodal_prompt.h"

namespace reprise::cli {

void run_with_images(ModelBundle& bundle, ThreadPool& pool, PrefixCache& cache, const VisionRunOptions& o) {
  if (o.mmproj.empty()) throw Error("--image needs --mmproj (the model's vision projector GGUF)");
  if (o.images.empty()) std::fprintf(stderr, "[vision] --mmproj given without --image: text only\n");
  auto mmproj = gguf::File::open(o.mmproj);
  ClipEncoder encoder(*mmproj);
  mmproj->release_resident();  // the encoder holds packed copies of its weights
  const VisionEncoderInfo& vi = encoder.info();
  std::fprintf(stderr, "[vision] %s projector: %lldx%lld input, %lld layers, %lld tokens per image\n",
               vi.projector.c_str(), static_cast<long long>(vi.image_size), static_cast<long long>(vi.image_size),
               static_cast<long long>(vi.n_layer), static_cast<long long>(vi.n_tokens));
  EncoderCache encoder_cache(static_cast<uint64_t>(o.mm_cache_mib * 1024 * 1024));
  ImageEmbedder embedder(encoder, bundle.model->info(), &encoder_cache, pool);
  MultimodalGenerator generator(*bundle.model, pool, &cache);
  MultimodalPromptOptions prompt_options;
  prompt_options.markers = image_markers_for(vi);

  std::vector<std::string> prompts = o.prompts;
  if (prompts.empty()) prompts.push_back("Describe this image.");
  for (const std::string& text : prompts) {
    // Every prompt re-reads its images, as a stateless server request would;
    // the encoder cache makes the repeats free.
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<ImageEmbeddingPtr> images;
    for (const std::string& path : o.images) images.push_back(embedder.embed_file(path, o.cache_salt));
    const double image_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string marked = text;
    if (marked.find(kMediaMarker) == std::string::npos) {
      std::string prefix;
      for (size_t i = 0; i < images.size(); ++i) prefix += std::string(kMediaMarker) + "\n";
      marked = prefix + marked;
    }
    const MultimodalPrompt prompt = build_multimodal_prompt(
        *bundle.tokenizer, split_at_media_markers(marked, images), prompt_options, bundle.model->info().n_embd);

    GenerateRequest req;
    req.sampling = o.sampling;
    req.max_tokens = o.n_predict;
    req.stop_tokens = bundle.eog_tokens;
    req.cache_salt = o.cache_salt;
    StreamDecoder decoder(*bundle.tokenizer);
    PacedOutput out;
    out.write(text);
    out.flush();
    const GenerateResult r = generator.generate(prompt, req, [&](int32_t tok, std::span<const float>) {
      if (!bundle.tokenizer->is_eog(tok)) out.write(decoder.push(tok));
      return true;
    });
    out.write(decoder.flush());
    out.write("\n");
    out.flush();
    const double pp = r.prefill_seconds > 0 ? (r.prompt_tokens - r.cached_tokens) / r.prefill_seconds : 0;
    const double tg = r.decode_seconds > 0 && r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0;
    std::fprintf(stderr,
                 "\n[timing] images: %zu in %.3f s; prompt: %lld tokens (%lld cached) in %.3f s (%.1f tokens/s); "
                 "generation: %zu tokens in %.3f s (%.1f tokens/s); finish: %s\n",
                 images.size(), image_seconds, static_cast<long long>(r.prompt_tokens),
                 static_cast<long long>(r.cached_tokens), r.prefill_seconds, pp, r.tokens.size(), r.decode_seconds,
                 tg, r.finish_reason.c_str());
    if (o.verbose) {
      std::fprintf(stderr, "[cache] %s\n", r.reuse.describe().c_str());
      const EncoderCacheStats s = encoder_cache.stats();
      std::fprintf(stderr,
                   "[vision] encoder runs %llu; encoder cache: hits %llu misses %llu entries %llu "
                   "(%.2f MiB of %.2f MiB) evictions %llu; encoding %.3f s, saved ~%.3f s\n",
                   static_cast<unsigned long long>(embedder.encoder_runs()), static_cast<unsigned long long>(s.hits),
                   static_cast<unsigned long long>(s.misses), static_cast<unsigned long long>(s.entries),
                   s.bytes / 1048576.0, s.budget_bytes / 1048576.0, static_cast<unsigned long long>(s.evictions),
                   s.encode_seconds, s.saved_seconds());
    }
  }
}

}  // namespace reprise::cli
