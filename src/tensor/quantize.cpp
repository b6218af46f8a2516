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

// The first of x[0..n) with the largest magnitude, with its sign (ggml's
// rule for the symmetric types, whose scale maps it to the negative end).
float signed_extreme(const float* x, int n) {
  float amax = 0.0f, extreme = 0.0f;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      extreme = x[j];
    }
  return extreme;
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
    // side that needs it.
    const float d = signed_extreme(x, kQK4_0) / -8.0f;
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

namespace {
// Q4_1 (levels 15) and Q5_1 (levels 31): d = (max - min) / levels, m = min,
// q = min(levels, trunc((x - min) / d + 0.5)), as ggml's reference.
template <int Levels>
void quantize_affine_block(const float* x, uint16_t* d_out, uint16_t* m_out, uint8_t (&q)[32]) {
  float lo = INFINITY, hi = -INFINITY;
  for (int j = 0; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / Levels;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *d_out = f32_to_f16(d);
  *m_out = f32_to_f16(lo);
  for (int j = 0; j < 32; ++j) {
    const float v = materialized((x[j] - lo) * id);
    q[j] = static_cast<uint8_t>(std::min<int>(Levels, static_cast<int8_t>(v + 0.5f)));
  }
}
}  // namespace

void quantize_row_q4_1(const float* src, BlockQ4_1* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    uint8_t q[32];
    quantize_affine_block<15>(src + b * 32, &dst[b].d, &dst[b].m, q);
    for (int j = 0; j < 16; ++j) dst[b].qs[j] = static_cast<uint8_t>(q[j] | (q[16 + j] << 4));
  }
}

void quantize_row_q5_1(const float* src, BlockQ5_1* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    uint8_t q[32];
    quantize_affine_block<31>(src + b * 32, &dst[b].d, &dst[b].m, q);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      dst[b].qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[16 + j] & 0x0f) << 4));
      qh |= static_cast<uint32_t>(q[j] >> 4) << j;
      qh |= static_cast<uint32_t>(q[16 + j] >> 4) << (16 + j);
    }
    std::memcpy(dst[b].qh, &qh, 4);
  }
}

void quantize_row_q5_0(const float* src, BlockQ5_0* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    const float d = signed_extreme(x, 32) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const float x0 = materialized(x[j] * id), x1 = materialized(x[16 + j] * id);
      const auto q0 = static_cast<uint8_t>(std::min<int>(31, static_cast<int8_t>(x0 + 16.5f)));
      const auto q1 = static_cast<uint8_t>(std::min<int>(31, static_cast<int8_t>(x1 + 16.5f)));
      dst[b].qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>(q0 >> 4) << j;
      qh |= static_cast<uint32_t>(q1 >> 4) << (16 + j);
    }
    std::memcpy(dst[b].qh, &qh, 4);
  }
}

namespace {

inline int nearest(float v) { return static_cast<int>(std::nearbyint(v)); }

// The inverse of k_scale_min: 8 six-bit scales and mins into 12 bytes.
void pack_scale_mins(const uint8_t (&sc)[8], const uint8_t (&m)[8], uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
}

// The affine K types' super-block: n_sub sub-blocks of `len` elements, each
// scaled from its range [min(0, x), max(x)] to quants 0..levels, the
// sub-block scales and mins quantized to 0..scale_max against d and dmin
// (largest / scale_max). Writes d, dmin (f16), sc[n_sub], m[n_sub] and the
// quants q[n_sub * len]. Q4_K: 8 x 32, levels 15, scales 63; Q5_K: levels 31;
// Q2_K: 16 x 16, levels 3, scales 15.
void quantize_affine_sub_blocks(const float* x, int n_sub, int len, int levels, int scale_max, uint16_t* d_out,
                                uint16_t* dmin_out, uint8_t* sc, uint8_t* m, uint8_t* q) {
  float scale[16], min[16], max_scale = 0, max_min = 0;
  for (int j = 0; j < n_sub; ++j) {
    float lo = 0.0f, hi = -INFINITY;
    for (int l = 0; l < len; ++l) {
      lo = std::min(lo, x[len * j + l]);
      hi = std::max(hi, x[len * j + l]);
    }
    scale[j] = std::max(0.0f, hi - lo) / static_cast<float>(levels);
    min[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  *d_out = f32_to_f16(max_scale / static_cast<float>(scale_max));
  *dmin_out = f32_to_f16(max_min / static_cast<float>(scale_max));
  const float d = f16_to_f32(*d_out), dmin = f16_to_f32(*dmin_out);
  for (int j = 0; j < n_sub; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0 ? std::clamp(nearest(scale[j] / d), 0, scale_max) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0 ? std::clamp(nearest(min[j] / dmin), 0, scale_max) : 0);
    const float step = d * sc[j], offset = dmin * m[j];
    for (int l = 0; l < len; ++l)
      q[len * j + l] =
          static_cast<uint8_t>(step > 0 ? std::clamp(nearest((x[len * j + l] + offset) / step), 0, levels) : 0);
  }
}

// Q4_K (levels 15) and Q5_K (levels 31): one super-block's d, dmin, packed
// scales and the quants q[256] (0..levels).
void quantize_k_affine(const float* x, int levels, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales_out,
                       uint8_t (&q)[kQK_K]) {
  uint8_t sc[8], m[8];
  quantize_affine_sub_blocks(x, 8, 32, levels, 63, d_out, dmin_out, sc, m, q);
  pack_scale_mins(sc, m, scales_out);
}

}  // namespace

void quantize_row_q2_k(const float* src, BlockQ2_K* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    BlockQ2_K& o = dst[b];
    uint8_t sc[16], m[16], q[kQK_K];
    quantize_affine_sub_blocks(src + b * kQK_K, 16, 16, 3, 15, &o.d, &o.dmin, sc, m, q);
    for (int k = 0; k < 16; ++k) o.scales[k] = static_cast<uint8_t>(sc[k] | (m[k] << 4));
    std::memset(o.qs, 0, sizeof(o.qs));
    for (int i = 0; i < kQK_K; ++i) {
      const int h = i / 128, s = (i % 128) / 32, l = i % 32;
      o.qs[32 * h + l] = static_cast<uint8_t>(o.qs[32 * h + l] | (q[i] << (2 * s)));
    }
  }
}

void quantize_row_q4_k(const float* src, BlockQ4_K* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K];
    quantize_k_affine(src + b * kQK_K, 15, &dst[b].d, &dst[b].dmin, dst[b].scales, q);
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l)
        dst[b].qs[32 * p + l] = static_cast<uint8_t>(q[64 * p + l] | (q[64 * p + 32 + l] << 4));
  }
}

void quantize_row_q5_k(const float* src, BlockQ5_K* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    uint8_t q[kQK_K];
    quantize_k_affine(src + b * kQK_K, 31, &dst[b].d, &dst[b].dmin, dst[b].scales, q);
    std::memset(dst[b].qh, 0, sizeof(dst[b].qh));
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = q[64 * p + l], hi = q[64 * p + 32 + l];
        dst[b].qs[32 * p + l] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
        dst[b].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
      }
  }
}

namespace {

// Q6_K (half 32, d_steps 127, sc_min -128) and Q3_K (4, 32, -32): one
// super-block's sixteen 16-element sub-blocks, each scaled so its value of
// largest magnitude maps to -half, the scales quantized against
// d = largest |scale| / d_steps to [sc_min, -sc_min - 1]. Writes the scales
// and the quants q (-half .. half - 1); returns d in f16.
uint16_t quantize_symmetric_16s(const float* x, int half, float d_steps, int sc_min, int (&sc)[16],
                                int (&q)[kQK_K]) {
  float scale[16], max_abs_scale = 0;
  for (int s = 0; s < 16; ++s) {
    scale[s] = signed_extreme(x + 16 * s, 16) / static_cast<float>(-half);
    max_abs_scale = std::max(max_abs_scale, std::fabs(scale[s]));
  }
  const uint16_t d16 = f32_to_f16(max_abs_scale / d_steps);
  const float d = f16_to_f32(d16);
  for (int s = 0; s < 16; ++s) {
    sc[s] = d > 0 ? std::clamp(nearest(scale[s] / d), sc_min, -sc_min - 1) : 0;
    const float step = d * static_cast<float>(sc[s]);
    for (int l = 0; l < 16; ++l)
      q[16 * s + l] = step != 0 ? std::clamp(nearest(x[16 * s + l] / step), -half, half - 1) : 0;
  }
  return d16;
}

}  // namespace

void quantize_row_q6_k(const float* src, BlockQ6_K* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    BlockQ6_K& o = dst[b];
    int sc[16], q[kQK_K];
    o.d = quantize_symmetric_16s(src + b * kQK_K, 32, 127.0f, -128, sc, q);
    uint8_t u[kQK_K];
    for (int s = 0; s < 16; ++s) o.scales[s] = static_cast<int8_t>(sc[s]);
    for (int i = 0; i < kQK_K; ++i) u[i] = static_cast<uint8_t>(q[i] + 32);
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* v = u + 128 * h + l;
        o.ql[64 * h + l] = static_cast<uint8_t>((v[0] & 0x0f) | ((v[64] & 0x0f) << 4));
        o.ql[64 * h + 32 + l] = static_cast<uint8_t>((v[32] & 0x0f) | ((v[96] & 0x0f) << 4));
        o.qh[32 * h + l] = static_cast<uint8_t>((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
      }
  }
}

void quantize_row_q3_k(const float* src, BlockQ3_K* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    BlockQ3_K& o = dst[b];
    std::memset(&o, 0, sizeof(o));
    int sc[16], q[kQK_K];
    o.d = quantize_symmetric_16s(src + b * kQK_K, 4, 32.0f, -32, sc, q);
    for (int s = 0; s < 16; ++s) {
      const int biased = sc[s] + 32;  // 6 bits: low nibble, then the top 2 bits
      o.scales[s % 8] = static_cast<uint8_t>(o.scales[s % 8] | ((biased & 0x0f) << (s < 8 ? 0 : 4)));
      o.scales[8 + s % 4] = static_cast<uint8_t>(o.scales[8 + s % 4] | ((biased >> 4) << (2 * (s / 4))));
    }
    for (int i = 0; i < kQK_K; ++i) {
      // Stored as the low 2 bits of q + 4 and a high bit that means "no -4".
      const int u = q[i] + 4, h = i / 128, quarter = (i % 128) / 32, e = i % 32;
      o.qs[32 * h + e] = static_cast<uint8_t>(o.qs[32 * h + e] | ((u & 3) << (2 * quarter)));
      if (u & 4) o.hmask[e] = static_cast<uint8_t>(o.hmask[e] | (1 << (4 * h + quarter)));
    }
  }
}

namespace {

// The index of the table value whose multiple by step is nearest x (the
// first on ties).
uint8_t nearest_iq4nl_index(float x, float step) {
  int best = 0;
  float best_err = INFINITY;
  for (int v = 0; v < 16; ++v) {
    const float err = std::fabs(x - step * kIq4nlValues[v]);
    if (err < best_err) {
      best_err = err;
      best = v;
    }
  }
  return static_cast<uint8_t>(best);
}

// 32 elements' nearest table indices for step, as nibbles in IQ4_NL's order
// (low nibbles elements 0..15), to qs[0..15].
void pack_iq4nl_nibbles(const float* x, float step, uint8_t* qs) {
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>(nearest_iq4nl_index(x[j], step) | (nearest_iq4nl_index(x[j + 16], step) << 4));
}

}  // namespace

void quantize_row_iq4_nl(const float* src, BlockIQ4_NL* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    // The largest magnitude maps to the table's -127 end (as ggml's first guess).
    BlockIQ4_NL& o = dst[b];
    o.d = f32_to_f16(signed_extreme(x, 32) / -127.0f);
    pack_iq4nl_nibbles(x, f16_to_f32(o.d), o.qs);
  }
}

void quantize_row_iq4_xs(const float* src, BlockIQ4_XS* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    BlockIQ4_XS& o = dst[b];
    std::memset(&o, 0, sizeof(o));
    float scale[8], max_abs_scale = 0;
    for (int j = 0; j < 8; ++j) {
      scale[j] = signed_extreme(x + 32 * j, 32) / -127.0f;
      max_abs_scale = std::max(max_abs_scale, std::fabs(scale[j]));
    }
    o.d = f32_to_f16(max_abs_scale / 32.0f);
    const float d = f16_to_f32(o.d);
    for (int j = 0; j < 8; ++j) {
      const int sc = d > 0 ? std::clamp(nearest(scale[j] / d), -32, 31) : 0;
      const int biased = sc + 32;  // 6 bits: a nibble of scales_l, 2 bits of scales_h
      o.scales_l[j / 2] = static_cast<uint8_t>(o.scales_l[j / 2] | ((biased & 0x0f) << (4 * (j % 2))));
      o.scales_h = static_cast<uint16_t>(o.scales_h | ((biased >> 4) << (2 * j)));
      pack_iq4nl_nibbles(x + 32 * j, d * static_cast<float>(sc), o.qs + 16 * j);
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

void dequantize_row_q4_1(const BlockQ4_1* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = f16_to_f32(src[b].d), m = f16_to_f32(src[b].m);
    for (int j = 0; j < 16; ++j) {
      dst[b * 32 + j] = (src[b].qs[j] & 0x0f) * d + m;
      dst[b * 32 + 16 + j] = (src[b].qs[j] >> 4) * d + m;
    }
  }
}

namespace {
// Element j's (0..31) 5-bit quant of a Q5_0/Q5_1 block.
inline int q5_quant(const uint8_t* qs, const uint8_t* qh_bytes, int j) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const int nibble = j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
  return nibble | static_cast<int>(((qh >> j) & 1) << 4);
}
}  // namespace

void dequantize_row_q5_0(const BlockQ5_0* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = f16_to_f32(src[b].d);
    for (int j = 0; j < 32; ++j) dst[b * 32 + j] = (q5_quant(src[b].qs, src[b].qh, j) - 16) * d;
  }
}

void dequantize_row_q5_1(const BlockQ5_1* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = f16_to_f32(src[b].d), m = f16_to_f32(src[b].m);
    for (int j = 0; j < 32; ++j) dst[b * 32 + j] = q5_quant(src[b].qs, src[b].qh, j) * d + m;
  }
}

namespace {
// Q4_K and Q5_K: sub-block j's quants are the low (even j) or high (odd j)
// nibbles of qs[32 * (j / 2) + l], plus 16 * bit j of qh[l] for Q5_K (qh
// non-null); x = d * sc * q - dmin * m.
void dequantize_k_affine(uint16_t d16, uint16_t dmin16, const uint8_t* scales, const uint8_t* qh,
                         const uint8_t* qs, float* y) {
  const float d = f16_to_f32(d16), dmin = f16_to_f32(dmin16);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, scales, &sc, &m);
    const float step = d * sc, offset = dmin * m;
    const uint8_t* q = qs + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((j & 1) ? q[l] >> 4 : q[l] & 0x0f) + (qh ? ((qh[l] >> j) & 1) << 4 : 0);
      y[32 * j + l] = step * v - offset;
    }
  }
}
}  // namespace

void dequantize_row_q4_k(const BlockQ4_K* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b)
    dequantize_k_affine(src[b].d, src[b].dmin, src[b].scales, nullptr, src[b].qs, dst + b * kQK_K);
}

void dequantize_row_q5_k(const BlockQ5_K* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b)
    dequantize_k_affine(src[b].d, src[b].dmin, src[b].scales, src[b].qh, src[b].qs, dst + b * kQK_K);
}

void dequantize_row_q6_k(const BlockQ6_K* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(src[b].d);
    float* y = dst + b * kQK_K;
    for (int i = 0; i < kQK_K; ++i) y[i] = d * src[b].scales[i / 16] * (q6_k_quant(src[b], i) - 32);
  }
}

void dequantize_row_q2_k(const BlockQ2_K* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(src[b].d), dmin = f16_to_f32(src[b].dmin);
    float* y = dst + b * kQK_K;
    for (int k = 0; k < 16; ++k) {
      const float step = d * static_cast<float>(src[b].scales[k] & 0x0f);
      const float offset = dmin * static_cast<float>(src[b].scales[k] >> 4);
      for (int l = 0; l < 16; ++l) y[16 * k + l] = step * static_cast<float>(q2_k_quant(src[b], 16 * k + l)) - offset;
    }
  }
}

void dequantize_row_q3_k(const BlockQ3_K* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(src[b].d);
    float* y = dst + b * kQK_K;
    for (int s = 0; s < 16; ++s) {
      const float step = d * static_cast<float>(q3_k_scale(src[b], s));
      for (int l = 0; l < 16; ++l) y[16 * s + l] = step * static_cast<float>(q3_k_quant(src[b], 16 * s + l));
    }
  }
}

void dequantize_row_iq4_nl(const BlockIQ4_NL* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = f16_to_f32(src[b].d);
    for (int j = 0; j < 16; ++j) {
      dst[b * 32 + j] = d * kIq4nlValues[src[b].qs[j] & 0x0f];
      dst[b * 32 + 16 + j] = d * kIq4nlValues[src[b].qs[j] >> 4];
    }
  }
}

void dequantize_row_iq4_xs(const BlockIQ4_XS* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = f16_to_f32(src[b].d);
    for (int j = 0; j < 8; ++j) {
      const float step = d * static_cast<float>(iq4_xs_scale(src[b], j));
      float* y = dst + b * kQK_K + 32 * j;
      const uint8_t* qs = src[b].qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        y[l] = step * kIq4nlValues[qs[l] & 0x0f];
        y[l + 16] = step * kIq4nlValues[qs[l] >> 4];
      }
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
    case DType::Q4_1: quantize_row_q4_1(src, static_cast<BlockQ4_1*>(dst), n); return;
    case DType::Q5_0: quantize_row_q5_0(src, static_cast<BlockQ5_0*>(dst), n); return;
    case DType::Q5_1: quantize_row_q5_1(src, static_cast<BlockQ5_1*>(dst), n); return;
    case DType::Q4_K: quantize_row_q4_k(src, static_cast<BlockQ4_K*>(dst), n); return;
    case DType::Q5_K: quantize_row_q5_k(src, static_cast<BlockQ5_K*>(dst), n); return;
    case DType::Q6_K: quantize_row_q6_k(src, static_cast<BlockQ6_K*>(dst), n); return;
    case DType::Q2_K: quantize_row_q2_k(src, static_cast<BlockQ2_K*>(dst), n); return;
    case DType::Q3_K: quantize_row_q3_k(src, static_cast<BlockQ3_K*>(dst), n); return;
    case DType::IQ4_NL: quantize_row_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), n); return;
    case DType::IQ4_XS: quantize_row_iq4_xs(src, static_cast<BlockIQ4_XS*>(dst), n); return;
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
    case DType::Q4_1: dequantize_row_q4_1(static_cast<const BlockQ4_1*>(src), dst, n); return;
    case DType::Q5_0: dequantize_row_q5_0(static_cast<const BlockQ5_0*>(src), dst, n); return;
    case DType::Q5_1: dequantize_row_q5_1(static_cast<const BlockQ5_1*>(src), dst, n); return;
    case DType::Q4_K: dequantize_row_q4_k(static_cast<const BlockQ4_K*>(src), dst, n); return;
    case DType::Q5_K: dequantize_row_q5_k(static_cast<const BlockQ5_K*>(src), dst, n); return;
    case DType::Q6_K: dequantize_row_q6_k(static_cast<const BlockQ6_K*>(src), dst, n); return;
    case DType::Q2_K: dequantize_row_q2_k(static_cast<const BlockQ2_K*>(src), dst, n); return;
    case DType::Q3_K: dequantize_row_q3_k(static_cast<const BlockQ3_K*>(src), dst, n); return;
    case DType::IQ4_NL: dequantize_row_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, n); return;
    case DType::IQ4_XS: dequantize_row_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, n); return;
    default: break;
  }
}

}  // namespace reprise
