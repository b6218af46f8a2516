#include "vision/image_preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "util/error.h"

namespace reprise {

namespace {

// The reference computes these in plain float; keep the compiler from fusing
// multiply-adds so the truncated 8-bit results land on the same side.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

float lerp(float a, float b, float t) { return a + (b - a) * t; }

void resize_bilinear(const uint8_t* src, int64_t sw, int64_t sh, uint8_t* dst, int64_t tw, int64_t th) {
  // Corner-aligned: the first and last output samples sit on the first and
  // last source pixels.
  const float x_ratio = tw > 1 ? static_cast<float>(sw - 1) / static_cast<float>(tw - 1) : 0.0f;
  const float y_ratio = th > 1 ? static_cast<float>(sh - 1) / static_cast<float>(th - 1) : 0.0f;
  auto at = [&](int64_t x, int64_t y, int c) { return static_cast<float>(src[3 * (y * sw + x) + c]); };
  for (int64_t y = 0; y < th; ++y) {
    const float py = y_ratio * static_cast<float>(y);
    const int64_t y0 = std::min<int64_t>(static_cast<int64_t>(py), std::max<int64_t>(sh - 2, 0));
    const int64_t y1 = std::min<int64_t>(y0 + 1, sh - 1);
    const float yl = py - static_cast<float>(y0);
    for (int64_t x = 0; x < tw; ++x) {
      const float px = x_ratio * static_cast<float>(x);
      const int64_t x0 = std::min<int64_t>(static_cast<int64_t>(px), std::max<int64_t>(sw - 2, 0));
      const int64_t x1 = std::min<int64_t>(x0 + 1, sw - 1);
      const float xl = px - static_cast<float>(x0);
      for (int c = 0; c < 3; ++c) {
        const float top = lerp(at(x0, y0, c), at(x1, y0, c), xl);
        const float bottom = lerp(at(x0, y1, c), at(x1, y1, c), xl);
        dst[3 * (y * tw + x) + c] = static_cast<uint8_t>(lerp(top, bottom, yl));
      }
    }
  }
}

// Cubic through four samples at -1, 0, 1, 2 evaluated at t in [0, 1): the
// reference derives the coefficients in double and stores them as float.
float cubic(float p0, float p1, float p2, float p3, float t) {
  const float d0 = p0 - p1, d2 = p2 - p1, d3 = p3 - p1;
  const float a0 = p1;
  const float a1 = static_cast<float>(-1.0 / 3 * d0 + d2 - 1.0 / 6 * d3);
  const float a2 = static_cast<float>(1.0 / 2 * d0 + 1.0 / 2 * d2);
  const float a3 = static_cast<float>(-1.0 / 6 * d0 - 1.0 / 2 * d2 + 1.0 / 6 * d3);
  return a0 + a1 * t + a2 * t * t + a3 * t * t * t;
}

void resize_bicubic(const uint8_t* src, int64_t sw, int64_t sh, uint8_t* dst, int64_t tw, int64_t th) {
  const float tx = static_cast<float>(sw) / static_cast<float>(tw);
  const float ty = static_cast<float>(sh) / static_cast<float>(th);
  auto at = [&](int64_t x, int64_t y, int c) {
    x = std::clamp<int64_t>(x, 0, sw - 1);
    y = std::clamp<int64_t>(y, 0, sh - 1);
    return static_cast<float>(src[3 * (y * sw + x) + c]);
  };
  for (int64_t i = 0; i < th; ++i) {
    for (int64_t j = 0; j < tw; ++j) {
      const int64_t x = static_cast<int64_t>(tx * static_cast<float>(j));
      const int64_t y = static_cast<int64_t>(ty * static_cast<float>(i));
      const float dx = tx * static_cast<float>(j) - static_cast<float>(x);
      const float dy = ty * static_cast<float>(i) - static_cast<float>(y);
      for (int c = 0; c < 3; ++c) {
        float col[4];
        for (int k = 0; k < 4; ++k) {
          const int64_t yy = y - 1 + k;
          col[k] = cubic(at(x - 1, yy, c), at(x, yy, c), at(x + 1, yy, c), at(x + 2, yy, c), dx);
        }
        const float v = cubic(col[0], col[1], col[2], col[3], dy);
        dst[3 * (i * tw + j) + c] = static_cast<uint8_t>(std::min(std::max(std::round(v), 0.0f), 255.0f));
      }
    }
  }
}

#pragma GCC pop_options

// Pillow's resampling: a normalised bicubic (a = -0.5) kernel widened when
// downscaling, weights in fixed point, one axis at a time.
struct AxisWeights {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // ksize per output sample
};

constexpr int kPillowPrecision = 22;

AxisWeights pillow_weights(int64_t in_size, int64_t out_size, ResizeFilter kind) {
  auto bicubic = [](double x) {
    constexpr double a = -0.5;
    x = std::fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
  };
  auto triangle = [](double x) {
    x = std::fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
  };
  const bool linear = kind == ResizeFilter::BilinearPillow;
  auto filter = [&](double x) { return linear ? triangle(x) : bicubic(x); };
  const double base_support = linear ? 1.0 : 2.0;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = base_support * filter_scale;
  AxisWeights w;
  w.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  w.first.resize(out_size);
  w.count.resize(out_size);
  w.weights.assign(out_size * w.ksize, 0);
  std::vector<double> k(w.ksize);
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(center - support + 0.5));
    const int hi = std::min(static_cast<int>(in_size), static_cast<int>(center + support + 0.5));
    const int n = hi - lo;
    double total = 0;
    for (int i = 0; i < n; ++i) {
      k[i] = filter((i + lo - center + 0.5) / filter_scale);
      total += k[i];
    }
    for (int i = 0; i < w.ksize; ++i) {
      const double v = i < n && total != 0.0 ? k[i] / total : 0.0;
      w.weights[o * w.ksize + i] =
          static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPillowPrecision) : 0.5 + v * (1 << kPillowPrecision));
    }
    w.first[o] = lo;
    w.count[o] = n;
  }
  return w;
}

uint8_t clip8(int32_t v) { return static_cast<uint8_t>(std::clamp(v, 0, 255)); }

// Resamples along x (horizontal = true) or y, keeping the other axis.
void pillow_pass(const uint8_t* src, int64_t sw, int64_t sh, uint8_t* dst, int64_t dw, int64_t dh,
                 const AxisWeights& w, bool horizontal) {
  for (int64_t y = 0; y < dh; ++y) {
    for (int64_t x = 0; x < dw; ++x) {
      const int64_t o = horizontal ? x : y;
      int32_t acc[3] = {1 << (kPillowPrecision - 1), 1 << (kPillowPrecision - 1), 1 << (kPillowPrecision - 1)};
      for (int i = 0; i < w.count[o]; ++i) {
        const int64_t sx = horizontal ? w.first[o] + i : x;
        const int64_t sy = horizontal ? y : w.first[o] + i;
        const int32_t k = w.weights[o * w.ksize + i];
        const uint8_t* p = src + 3 * (sy * sw + sx);
        for (int c = 0; c < 3; ++c) acc[c] += static_cast<int32_t>(p[c]) * k;
      }
      for (int c = 0; c < 3; ++c) dst[3 * (y * dw + x) + c] = clip8(acc[c] >> kPillowPrecision);
    }
  }
}

void resize_pillow(const uint8_t* src, int64_t sw, int64_t sh, uint8_t* dst, int64_t tw, int64_t th,
                   ResizeFilter kind) {
  std::vector<uint8_t> mid;
  const uint8_t* cur = src;
  int64_t cw = sw;
  if (tw != sw) {
    mid.resize(tw * sh * 3);
    pillow_pass(src, sw, sh, mid.data(), tw, sh, pillow_weights(sw, tw, kind), true);
    cur = mid.data();
    cw = tw;
  }
  if (th != sh) {
    pillow_pass(cur, cw, sh, dst, tw, th, pillow_weights(sh, th, kind), false);
  } else {
    std::copy(cur, cur + tw * th * 3, dst);
  }
}

}  // namespace

const char* resize_filter_name(ResizeFilter f) {
  switch (f) {
    case ResizeFilter::Bilinear: return "bilinear";
    case ResizeFilter::Bicubic: return "bicubic";
    case ResizeFilter::BicubicPillow: return "bicubic-pillow";
    case ResizeFilter::BilinearPillow: return "bilinear-pillow";
  }
  return "?";
}

std::string PreprocessParams::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%lldx%lld %s %s pad=%u,%u,%u mean=%.9g,%.9g,%.9g std=%.9g,%.9g,%.9g",
                static_cast<long long>(width), static_cast<long long>(height), resize_filter_name(filter),
                letterbox ? "letterbox" : "stretch", pad_rgb[0], pad_rgb[1], pad_rgb[2], mean[0], mean[1],
                mean[2], std[0], std[1], std[2]);
  return buf;
}

std::vector<uint8_t> resize_rgb(const uint8_t* rgb, int64_t width, int64_t height, int64_t target_width,
                                int64_t target_height, ResizeFilter filter) {
  if (width <= 0 || height <= 0 || target_width <= 0 || target_height <= 0)
    throw Error("resize: empty image or target");
  std::vector<uint8_t> out(target_width * target_height * 3);
  if (width == target_width && height == target_height) {
    std::copy(rgb, rgb + out.size(), out.begin());
    return out;
  }
  switch (filter) {
    case ResizeFilter::Bilinear:
      resize_bilinear(rgb, width, height, out.data(), target_width, target_height);
      break;
    case ResizeFilter::Bicubic:
      resize_bicubic(rgb, width, height, out.data(), target_width, target_height);
      break;
    case ResizeFilter::BicubicPillow:
    case ResizeFilter::BilinearPillow:
      resize_pillow(rgb, width, height, out.data(), target_width, target_height, filter);
      break;
  }
  return out;
}

PreprocessedImage preprocess_image(const DecodedImage& image, const PreprocessParams& p) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width * image.height * 3))
    throw Error("preprocess: invalid decoded image");
  if (p.width <= 0 || p.height <= 0) throw Error("preprocess: invalid target size");
  PreprocessedImage out;
  out.width = p.width;
  out.height = p.height;
  out.source_width = image.width;
  out.source_height = image.height;
  const bool same_size = image.width == p.width && image.height == p.height;
  if (same_size || !p.letterbox) {
    out.resized_rgb = resize_rgb(image.rgb.data(), image.width, image.height, p.width, p.height, p.filter);
  } else {
    // Fit inside the target keeping the aspect ratio, centred on the pad colour.
    const float scale = std::min(static_cast<float>(p.width) / static_cast<float>(image.width),
                                 static_cast<float>(p.height) / static_cast<float>(image.height));
    auto fit = [&](int64_t side, int64_t target) {
      const auto scaled = static_cast<int64_t>(std::ceil(static_cast<float>(side) * scale));
      return std::clamp<int64_t>(scaled, 1, target);
    };
    const int64_t fit_w = fit(image.width, p.width), fit_h = fit(image.height, p.height);
    std::vector<uint8_t> fitted = resize_rgb(image.rgb.data(), image.width, image.height, fit_w, fit_h, p.filter);
    out.resized_rgb.resize(p.width * p.height * 3);
    for (size_t i = 0; i < out.resized_rgb.size(); i += 3)
      for (int c = 0; c < 3; ++c) out.resized_rgb[i + c] = p.pad_rgb[c];
    const int64_t ox = (p.width - fit_w) / 2, oy = (p.height - fit_h) / 2;
    for (int64_t y = 0; y < fit_h; ++y)
      std::copy(fitted.begin() + y * fit_w * 3, fitted.begin() + (y + 1) * fit_w * 3,
                out.resized_rgb.begin() + ((oy + y) * p.width + ox) * 3);
  }
  out.pixels.resize(out.resized_rgb.size());
  for (size_t i = 0; i < out.pixels.size(); ++i) {
    const int c = static_cast<int>(i % 3);
    out.pixels[i] = (static_cast<float>(out.resized_rgb[i]) / 255.0f - p.mean[c]) / p.std[c];
  }
  return out;
}

}  // namespace reprise
