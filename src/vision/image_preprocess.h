// Decoded RGB -> the normalized float image an encoder consumes.
//
// The resize and normalization must reproduce what llama.cpp's mtmd does for
// the same projector, bit for bit on the 8-bit resized pixels, or the encoder
// sees a different image than the reference (the gemma3-vision-resize fixture
// checks this). Each filter below is one llama.cpp uses; which one a projector
// gets is the encoder's business (ClipEncoder::preprocess_params).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "vision/image_decode.h"

namespace reprise {

enum class ResizeFilter {
  Bilinear,       // llama.cpp's img_tool bilinear (corner-aligned, truncating)
  Bicubic,        // llama.cpp's legacy bicubic (a = -0.5, clamped edges, rounded)
  BicubicPillow,  // Pillow's separable bicubic with fixed-point weights
  BilinearPillow, // Pillow's separable bilinear (triangle filter), same scheme
};
const char* resize_filter_name(ResizeFilter f);

struct PreprocessParams {
  int64_t width = 0;   // target size
  int64_t height = 0;
  ResizeFilter filter = ResizeFilter::Bilinear;
  // Keep the aspect ratio and centre the resized image on a pad_rgb canvas
  // (llama.cpp's PAD_CEIL); false stretches to the target size.
  bool letterbox = false;
  std::array<uint8_t, 3> pad_rgb{0, 0, 0};
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f};
  std::array<float, 3> std{0.5f, 0.5f, 0.5f};

  // Canonical text of every field, for cache keys and logs.
  std::string describe() const;
};

struct PreprocessedImage {
  int64_t width = 0;
  int64_t height = 0;
  int64_t source_width = 0;   // the decoded image's size, before resizing
  int64_t source_height = 0;
  std::vector<uint8_t> resized_rgb;  // width * height * 3, before normalization
  std::vector<float> pixels;         // width * height * 3, interleaved RGB, (v/255 - mean) / std
};

// Resizes with the given filter to exactly width x height (no padding).
std::vector<uint8_t> resize_rgb(const uint8_t* rgb, int64_t width, int64_t height, int64_t target_width,
                                int64_t target_height, ResizeFilter filter);

PreprocessedImage preprocess_image(const DecodedImage& image, const PreprocessParams& params);

}  // namespace reprise
