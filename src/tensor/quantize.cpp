#include "tensor/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tensor/fp16.h"
#include "util/error.h"

namespace reprise {
namespace {

// Forces v to be rounded to float before further use. The build enables FMA
// and GCC's default -ffp-contract=fast would fuse `x * id + 8.5f` into one
// FMA, which rounds differently from ggml's reference (plain C semantics) and
// would flip nibbles at exact .5 boundaries.
inline float materialized(float v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(v));
#endif
  return v;
}

void check_length(DType t, int64_t n, const char* what) {
  auto info = dtype_info(static_cast<uint32_t>(t));
  if (!quantize_supported(t))
    throw Error(std::string(what) + ": unsupported type " + dtype_name(static_cast<uint32_t>(t)));
  if (n < 0 || n % info->block_elems != 0)
    throw Error(std::string(what) + ": " + std::to_string(n) + " elements is not a multiple of the " +
                info->name + " block size " + std::to_string(info->block_elems));
}

}  // namespace

bool quantize_supported(DType t) { return dtype_supported(t); }

void quantize_row_f16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void quantize_row_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float* x = src + b * kQK8_0;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = f32_to_f16(d);
    for (int j = 0; j < kQK8_0; ++j) dst[b].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  }
}

void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t n) {
  constexpr int kHalf = kQK4_0 / 2;
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    const float* x = src + b * kQK4_0;
    // The signed extreme maps to -8, so the full [-8, 7] range is used on the
    // side that needs it (ggml keeps the first element of largest magnitude).
    float amax = 0.0f;
    float extreme = 0.0f;
    for (int j = 0; j < kQK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        extreme = x[j];
      }
    }
    const float d = extreme / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = f32_to_f16(d);
    for (int j = 0; j < kHalf; ++j) {
      const float x0 = materialized(x[j] * id);
      const float x1 = materialized(x[kHalf + j] * id);
      const auto q0 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x0 + 8.5f)));
      const auto q1 = static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(x1 + 8.5f)));
      dst[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_f16(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void dequantize_row_bf16(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void dequantize_row_q8_0(const BlockQ8_0* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float d = f16_to_f32(src[b].d);
    for (int j = 0; j < kQK8_0; ++j) dst[b * kQK8_0 + j] = src[b].qs[j] * d;
  }
}

void dequantize_row_q4_0(const BlockQ4_0* src, float* dst, int64_t n) {
  constexpr int kHalf = kQK4_0 / 2;
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    const float d = f16_to_f32(src[b].d);
    float* y = dst + b * kQK4_0;
    for (int j = 0; j < kHalf; ++j) {
      y[j] = ((src[b].qs[j] & 0x0f) - 8) * d;
      y[kHalf + j] = ((src[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  check_length(t, n, "quantize_row");
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case DType::F16: quantize_row_f16(src, static_cast<uint16_t*>(dst), n); return;
    case DType::BF16: quantize_row_bf16(src, static_cast<uint16_t*>(dst), n); return;
    case DType::Q8_0: quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n); return;
    case DType::Q4_0: quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), n); return;
    default: break;
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  check_length(t, n, "dequantize_row");
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
    case DType::F16: dequantize_row_f16(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::BF16: dequantize_row_bf16(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::Q8_0: dequantize_row_q8_0(static_cast<const BlockQ8_0*>(src), dst, n); return;
    case DType::Q4_0: dequantize_row_q4_0(static_cast<const BlockQ4_0*>(src), dst, n); return;
    default: break;
  }
}

}  // namespace reprise
