#include "vision/vision_pipeline.h"

namespace reprise {

namespace {
std::unique_ptr<gguf::File> open_mmproj(const std::string& path) { return gguf::File::open(path); }
}  // namespace

VisionPipeline::VisionPipeline(const std::string& mmproj_path, ModelBundle& text, ThreadPool& pool,
                               PrefixCache* prefix_cache, std::mutex* forward_mutex, const VisionOptions& options)
    : text_(text),
      file_(open_mmproj(mmproj_path)),
      encoder_(*file_),
      cache_(options.encoder_cache_bytes),
      embedder_(encoder_, text.model->info(), &cache_, pool, forward_mutex, options.limits),
      generator_(*text.model, pool, prefix_cache, forward_mutex, options.engine) {
  prompt_options_.markers = image_markers_for(encoder_.info());
  file_->release_resident();  // the encoder holds packed copies of its weights
}

MultimodalPrompt VisionPipeline::build_prompt(std::string_view rendered,
                                              std::span<const ImageEmbeddingPtr> images) const {
  return build_multimodal_prompt(*text_.tokenizer, split_at_media_markers(rendered, images), prompt_options_,
                                 text_.model->info().n_embd);
}

}  // namespace reprise
