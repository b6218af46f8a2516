// Image bytes -> soft tokens for one (vision encoder, text model) pair, through
// the encoder-output cache. This is what a request handler calls per image.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "model/model.h"
#include "tensor/thread_pool.h"
#include "vision/clip_encoder.h"
#include "vision/encoder_cache.h"
#include "vision/image_decode.h"

namespace reprise {

class ImageEmbedder {
 public:
  // Throws reprise::Error when the encoder's output width is not the text
  // model's embedding width (the pair does not belong together). `cache` may
  // be null (always encode). `pool_mutex`, when given, is held around the
  // encoder's use of `pool` (see ClipEncoder::encode). Everything passed in
  // must outlive the embedder.
  ImageEmbedder(const ClipEncoder& encoder, const ModelInfo& text_model, EncoderCache* cache, ThreadPool& pool,
                std::mutex* pool_mutex = nullptr, const ImageLimits& limits = {});

  // Decode (PNG/JPEG/WebP), preprocess, look up or encode. Thread-safe.
  // Bad images throw reprise::Error with a message fit for a 400 response.
  // `cache_salt` is the request's tenant salt: only requests with the same
  // salt share an encoder-cache entry (and the image's digest).
  ImageEmbeddingPtr embed(std::span<const uint8_t> encoded, std::string_view cache_salt = {}) const;
  ImageEmbeddingPtr embed(const DecodedImage& image, std::string_view cache_salt = {}) const;
  ImageEmbeddingPtr embed_file(const std::string& path, std::string_view cache_salt = {}) const;
  ImageEmbeddingPtr embed_data_url(std::string_view url, std::string_view cache_salt = {}) const;

  // The cache key (= prompt digest) the image would get.
  Hash128 key_for(const DecodedImage& image, std::string_view cache_salt = {}) const;

  // How many times the encoder actually ran through this embedder.
  uint64_t encoder_runs() const { return encoder_runs_.load(); }
  const ClipEncoder& encoder() const { return encoder_; }
  const ImageLimits& limits() const { return limits_; }

 private:
  EncoderKeyHeader header_for(const DecodedImage& image, std::string_view cache_salt) const;

  const ClipEncoder& encoder_;
  const ModelInfo& text_model_;
  EncoderCache* cache_;
  ThreadPool& pool_;
  std::mutex* pool_mutex_;
  ImageLimits limits_;
  mutable std::atomic<uint64_t> encoder_runs_{0};
};

}  // namespace reprise
