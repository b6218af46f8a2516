// Image bytes -> 8-bit RGB pixels (PNG, JPEG, WebP), with limits checked
// before anything large is allocated.
//
// Images come from untrusted requests, so every failure (unknown format,
// corrupt or truncated data, dimensions over the limits) is a reprise::Error
// whose message a server can return as a 400 verbatim. Decoding follows what
// llama.cpp's stb_image path produces for the same file: alpha is dropped (not
// composited), grey is replicated to RGB, 16-bit samples keep their high byte,
// and no gamma or colour-profile conversion is applied.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace reprise {

enum class ImageFormat { Png, Jpeg, Webp };
const char* image_format_name(ImageFormat f);

struct ImageLimits {
  uint64_t max_encoded_bytes = 32ull << 20;  // the compressed file
  int64_t max_side = 16384;                   // width and height, each
  int64_t max_pixels = 64ll << 20;            // width * height (64 MP: 192 MiB of RGB)
};

// Interleaved RGB, row-major, 3 bytes per pixel.
struct DecodedImage {
  int64_t width = 0;
  int64_t height = 0;
  ImageFormat format = ImageFormat::Png;
  std::vector<uint8_t> rgb;
};

// Detects the format from the leading bytes; anything else is an Error.
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

DecodedImage decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits = {});

// Reads and decodes a local file (the CLI's --image).
DecodedImage load_image_file(const std::string& path, const ImageLimits& limits = {});

// The bytes of a `data:[<mime>][;base64],<payload>` URL (OpenAI image_url
// content parts). Only base64 payloads are accepted; the size limit applies
// to the decoded bytes.
std::vector<uint8_t> decode_data_url(std::string_view url, const ImageLimits& limits = {});

}  // namespace reprise
