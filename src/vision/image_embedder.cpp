#include "vision/image_embedder.h"

#include "util/error.h"
#include "vision/image_preprocess.h"

namespace reprise {

ImageEmbedder::ImageEmbedder(const ClipEncoder& encoder, const ModelInfo& text_model, EncoderCache* cache,
                             ThreadPool& pool, std::mutex* pool_mutex, const ImageLimits& limits)
    : encoder_(encoder), text_model_(text_model), cache_(cache), pool_(pool), pool_mutex_(pool_mutex),
      limits_(limits) {
  if (encoder.info().n_embd_out != text_model.n_embd)
    throw Error("the vision projector outputs width " + std::to_string(encoder.info().n_embd_out) +
                " but the text model '" + text_model.name + "' has width " + std::to_string(text_model.n_embd) +
                ": this mmproj does not belong to this model");
}

EncoderKeyHeader ImageEmbedder::header_for(const DecodedImage& image, std::string_view cache_salt) const {
  EncoderKeyHeader h;
  h.modality = Modality::Image;
  h.encoder_fingerprint = encoder_.info().fingerprint;
  h.text_model_fingerprint = text_model_.fingerprint;
  h.preprocessing = encoder_.preprocess_params().describe();
  h.decoded_width = image.width;
  h.decoded_height = image.height;
  h.decoded_channels = 3;
  h.tenant_salt = cache_salt;
  return h;
}

Hash128 ImageEmbedder::key_for(const DecodedImage& image, std::string_view cache_salt) const {
  const PreprocessedImage pre = preprocess_image(image, encoder_.preprocess_params());
  return encoder_cache_key(header_for(image, cache_salt), pre.pixels);
}

ImageEmbeddingPtr ImageEmbedder::embed(const DecodedImage& image, std::string_view cache_salt) const {
  const PreprocessedImage pre = preprocess_image(image, encoder_.preprocess_params());
  const Hash128 key = encoder_cache_key(header_for(image, cache_salt), pre.pixels);
  const VisionEncoderInfo& info = encoder_.info();
  auto run = [&] {
    encoder_runs_.fetch_add(1);
    return encoder_.encode(pre, pool_, pool_mutex_);
  };
  if (cache_) return cache_->get_or_encode(key, info.n_tokens, info.n_embd_out, run);
  auto e = std::make_shared<ImageEmbedding>();
  e->digest = key;
  e->n_tokens = info.n_tokens;
  e->n_embd = info.n_embd_out;
  e->values = run();
  return e;
}

ImageEmbeddingPtr ImageEmbedder::embed(std::span<const uint8_t> encoded, std::string_view cache_salt) const {
  return embed(decode_image(encoded, limits_), cache_salt);
}

ImageEmbeddingPtr ImageEmbedder::embed_file(const std::string& path, std::string_view cache_salt) const {
  return embed(load_image_file(path, limits_), cache_salt);
}

ImageEmbeddingPtr ImageEmbedder::embed_data_url(std::string_view url, std::string_view cache_salt) const {
  const std::vector<uint8_t> bytes = decode_data_url(url, limits_);
  return embed(std::span<const uint8_t>(bytes), cache_salt);
}

}  // namespace reprise
