#include "vision/image_decode.h"

// libjpeg's header needs size_t and FILE declared first.
#include <algorithm>
#include <csetjmp>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "util/error.h"

namespace reprise {

// libpng and libjpeg report errors by longjmp. The decode steps that can
// longjmp live in small functions whose frames hold no C++ objects with
// destructors; everything they fill lives in the caller's frame (reached
// through a pointer), so nothing is skipped or left indeterminate.

namespace {

constexpr size_t kMessageSize = 256;

void check_dimensions(int64_t w, int64_t h, const ImageLimits& limits, const char* format) {
  if (w <= 0 || h <= 0)
    throw Error(std::string("invalid ") + format + " image: zero width or height");
  if (w > limits.max_side || h > limits.max_side || w * h > limits.max_pixels)
    throw Error(std::string(format) + " image is " + std::to_string(w) + "x" + std::to_string(h) +
                ", over the limit of " + std::to_string(limits.max_side) + " pixels per side and " +
                std::to_string(limits.max_pixels) + " pixels in all");
}

// ---- PNG ----

struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t offset;
};

struct PngJob {
  png_structp png = nullptr;
  png_infop info = nullptr;
  PngSource source{};
  const ImageLimits* limits = nullptr;
  char message[kMessageSize] = {};
  png_uint_32 width = 0, height = 0;
  bool over_limit = false;
  DecodedImage* out = nullptr;
  std::vector<png_bytep>* rows = nullptr;
};

void png_read_bytes(png_structp png, png_bytep dst, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->offset) png_error(png, "truncated PNG data");
  std::memcpy(dst, src->data + src->offset, n);
  src->offset += n;
}

void png_on_error(png_structp png, png_const_charp msg) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->message, kMessageSize, "%s", msg);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // e.g. odd iCCP profiles: harmless

// Reads the header and sets the transforms. False on a libpng error.
bool png_read_header(PngJob* job) {
  if (setjmp(png_jmpbuf(job->png))) return false;
  png_read_info(job->png, job->info);
  int bit_depth = 0, color_type = 0;
  png_get_IHDR(job->png, job->info, &job->width, &job->height, &bit_depth, &color_type, nullptr, nullptr,
               nullptr);
  if (bit_depth == 16) png_set_strip_16(job->png);  // keep the high byte, as stb_image does
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(job->png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(job->png);
  if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA)
    png_set_gray_to_rgb(job->png);
  if (color_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(job->png);
  png_set_interlace_handling(job->png);
  png_read_update_info(job->png, job->info);
  return true;
}

bool png_read_pixels(PngJob* job) {
  if (setjmp(png_jmpbuf(job->png))) return false;
  png_read_image(job->png, job->rows->data());
  png_read_end(job->png, nullptr);  // checks the chunks after the image data
  return true;
}

DecodedImage decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  DecodedImage out;
  out.format = ImageFormat::Png;
  std::vector<png_bytep> rows;
  PngJob job;
  job.source = {bytes.data(), bytes.size(), 0};
  job.limits = &limits;
  job.out = &out;
  job.rows = &rows;
  job.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, png_on_error, png_on_warning);
  if (!job.png) throw Error("PNG decoder: out of memory");
  job.info = png_create_info_struct(job.png);
  struct Cleanup {
    PngJob& j;
    ~Cleanup() { png_destroy_read_struct(&j.png, j.info ? &j.info : nullptr, nullptr); }
  } cleanup{job};
  if (!job.info) throw Error("PNG decoder: out of memory");
  png_set_read_fn(job.png, &job.source, png_read_bytes);
  png_set_chunk_malloc_max(job.png, 8u << 20);  // bounds compressed ancillary chunks

  if (!png_read_header(&job)) throw Error(std::string("corrupt PNG image: ") + job.message);
  check_dimensions(job.width, job.height, limits, "PNG");
  if (png_get_rowbytes(job.png, job.info) != static_cast<size_t>(job.width) * 3)
    throw Error("PNG image: unexpected row layout after conversion to RGB");
  out.width = job.width;
  out.height = job.height;
  out.rgb.resize(static_cast<size_t>(out.width) * out.height * 3);
  rows.resize(out.height);
  for (int64_t y = 0; y < out.height; ++y) rows[y] = out.rgb.data() + y * out.width * 3;
  if (!png_read_pixels(&job)) throw Error(std::string("corrupt PNG image: ") + job.message);
  return out;
}

// ---- JPEG ----

struct JpegJob {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  jpeg_progress_mgr progress{};
  std::jmp_buf jump{};
  char message[kMessageSize] = {};
  DecodedImage* out = nullptr;
};

constexpr int kMaxJpegScans = 1000;  // progressive files with endless scans are a CPU trap

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* job = reinterpret_cast<JpegJob*>(cinfo->client_data);
  char buf[JMSG_LENGTH_MAX];
  cinfo->err->format_message(cinfo, buf);
  std::snprintf(job->message, kMessageSize, "%s", buf);
  std::longjmp(job->jump, 1);
}

// Warnings (level -1) mean damaged data, e.g. a truncated file that libjpeg
// would pad with grey: refuse rather than encode a half-grey image.
void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_fail(cinfo);
}

void jpeg_on_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans) {
    auto* job = reinterpret_cast<JpegJob*>(cinfo->client_data);
    std::snprintf(job->message, kMessageSize, "more than %d progressive scans", kMaxJpegScans);
    std::longjmp(job->jump, 1);
  }
}

bool jpeg_read_header_step(JpegJob* job, const uint8_t* data, size_t size) {
  if (setjmp(job->jump)) return false;
  jpeg_create_decompress(&job->cinfo);  // may fail too (out of memory)
  job->cinfo.progress = &job->progress;
  jpeg_mem_src(&job->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&job->cinfo, TRUE);
  return true;
}

bool jpeg_read_pixels_step(JpegJob* job) {
  if (setjmp(job->jump)) return false;
  job->cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&job->cinfo);
  if (job->cinfo.output_components != 3 ||
      static_cast<int64_t>(job->cinfo.output_width) != job->out->width ||
      static_cast<int64_t>(job->cinfo.output_height) != job->out->height) {
    std::snprintf(job->message, kMessageSize, "unexpected output layout");
    return false;
  }
  while (job->cinfo.output_scanline < job->cinfo.output_height) {
    JSAMPROW row = job->out->rgb.data() + static_cast<size_t>(job->cinfo.output_scanline) * job->out->width * 3;
    jpeg_read_scanlines(&job->cinfo, &row, 1);
  }
  jpeg_finish_decompress(&job->cinfo);
  return true;
}

DecodedImage decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  DecodedImage out;
  out.format = ImageFormat::Jpeg;
  auto job = std::make_unique<JpegJob>();
  job->out = &out;
  job->cinfo.err = jpeg_std_error(&job->err);
  job->err.error_exit = jpeg_fail;
  job->err.emit_message = jpeg_message;
  job->cinfo.client_data = job.get();
  job->progress.progress_monitor = jpeg_on_progress;
  struct Cleanup {
    JpegJob& j;
    ~Cleanup() { jpeg_destroy_decompress(&j.cinfo); }  // safe before creation too (no memory manager yet)
  } cleanup{*job};

  if (!jpeg_read_header_step(job.get(), bytes.data(), bytes.size()))
    throw Error(std::string("corrupt JPEG image: ") + job->message);
  check_dimensions(job->cinfo.image_width, job->cinfo.image_height, limits, "JPEG");
  if (job->cinfo.jpeg_color_space == JCS_CMYK || job->cinfo.jpeg_color_space == JCS_YCCK)
    throw Error("CMYK JPEG images are not supported; convert the image to RGB");
  // Working memory beyond the output (progressive coefficient buffers) is
  // bounded by the pixel count; this caps it for libjpeg's allocator too.
  job->cinfo.mem->max_memory_to_use = static_cast<long>(
      std::min<int64_t>(limits.max_pixels * 3 * 4 + (64 << 20), std::numeric_limits<long>::max()));
  out.width = job->cinfo.image_width;
  out.height = job->cinfo.image_height;
  out.rgb.resize(static_cast<size_t>(out.width) * out.height * 3);
  if (!jpeg_read_pixels_step(job.get())) throw Error(std::string("corrupt JPEG image: ") + job->message);
  return out;
}

// ---- WebP ----

DecodedImage decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &features);
  if (status == VP8_STATUS_NOT_ENOUGH_DATA) throw Error("corrupt WebP image: truncated data");
  if (status != VP8_STATUS_OK) throw Error("corrupt WebP image: invalid header");
  if (features.has_animation) throw Error("animated WebP images are not supported");
  check_dimensions(features.width, features.height, limits, "WebP");
  DecodedImage out;
  out.format = ImageFormat::Webp;
  out.width = features.width;
  out.height = features.height;
  out.rgb.resize(static_cast<size_t>(out.width) * out.height * 3);
  const int stride = static_cast<int>(out.width * 3);
  if (!WebPDecodeRGBInto(bytes.data(), bytes.size(), out.rgb.data(), out.rgb.size(), stride))
    throw Error("corrupt WebP image: decoding failed");
  return out;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

}  // namespace

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::Png: return "PNG";
    case ImageFormat::Jpeg: return "JPEG";
    case ImageFormat::Webp: return "WebP";
  }
  return "?";
}

ImageFormat sniff_image_format(std::span<const uint8_t> b) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) return ImageFormat::Png;
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::Jpeg;
  if (b.size() >= 12 && std::memcmp(b.data(), "RIFF", 4) == 0 && std::memcmp(b.data() + 8, "WEBP", 4) == 0)
    return ImageFormat::Webp;
  if (b.empty()) throw Error("empty image data");
  throw Error("unsupported image format (expected PNG, JPEG or WebP)");
}

DecodedImage decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  if (bytes.size() > limits.max_encoded_bytes)
    throw Error("image data is " + std::to_string(bytes.size()) + " bytes, over the limit of " +
                std::to_string(limits.max_encoded_bytes));
  switch (sniff_image_format(bytes)) {
    case ImageFormat::Png: return decode_png(bytes, limits);
    case ImageFormat::Jpeg: return decode_jpeg(bytes, limits);
    case ImageFormat::Webp: return decode_webp(bytes, limits);
  }
  throw Error("unsupported image format");
}

DecodedImage load_image_file(const std::string& path, const ImageLimits& limits) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw Error(path + ": cannot read image: " + ec.message());
  if (size > limits.max_encoded_bytes)
    throw Error(path + ": image file is " + std::to_string(size) + " bytes, over the limit of " +
                std::to_string(limits.max_encoded_bytes));
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes(size);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    throw Error(path + ": cannot read image");
  try {
    return decode_image(bytes, limits);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

std::vector<uint8_t> decode_data_url(std::string_view url, const ImageLimits& limits) {
  if (url.substr(0, 5) != "data:") throw Error("image URL must be a data: URL (remote URLs are not fetched)");
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) throw Error("malformed data: URL (no ',')");
  const std::string_view header = url.substr(5, comma - 5);
  if (header.size() < 7 || header.substr(header.size() - 7) != ";base64")
    throw Error("data: URL must be base64-encoded");
  const std::string_view payload = url.substr(comma + 1);
  if (payload.size() / 4 * 3 > limits.max_encoded_bytes + 3)
    throw Error("image data is over the limit of " + std::to_string(limits.max_encoded_bytes) + " bytes");
  std::vector<uint8_t> out;
  out.reserve(payload.size() / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t padding = 0;
  for (char c : payload) {
    if (c == '=') {
      ++padding;
      continue;
    }
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    const int v = base64_value(c);
    if (v < 0 || padding > 0) throw Error("malformed base64 in data: URL");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xFF));
    }
  }
  if (padding > 2 || bits >= 6) throw Error("malformed base64 in data: URL");
  if (out.size() > limits.max_encoded_bytes)
    throw Error("image data is " + std::to_string(out.size()) + " bytes, over the limit of " +
                std::to_string(limits.max_encoded_bytes));
  return out;
}

}  // namespace reprise
