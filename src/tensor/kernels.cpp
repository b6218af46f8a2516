#include "tensor/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/fp16.h"
#include "tensor/quant_blocks.h"

namespace reprise {
namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

float vec_dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float vec_dot_f16(const uint16_t* a, const uint16_t* b, int64_t n) {
  if (n < 32) {  // short rows (small attention heads): ggml sums these in double
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(f16_to_f32(a[i])) * f16_to_f32(b[i]);
    return static_cast<float>(acc);
  }
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  auto ld = [](const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  };
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(ld(a + i), ld(b + i), acc0);
    acc1 = _mm256_fmadd_ps(ld(a + i + 8), ld(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(ld(a + i + 16), ld(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(ld(a + i + 24), ld(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(ld(a + i), ld(b + i), acc0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) s += f16_to_f32(a[i]) * f16_to_f32(b[i]);
  return s;
}

float vec_dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  auto ld = [](const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  };
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(ld(a + i), ld(b + i), acc0);
    acc1 = _mm256_fmadd_ps(ld(a + i + 8), ld(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(ld(a + i), ld(b + i), acc0);
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += bf16_to_f32(a[i]) * bf16_to_f32(b[i]);
  return s;
}

// Sum of products of 32 signed bytes, as 8 int32 lanes converted to float.
inline __m256 mul_sum_i8_pairs(__m256i x, __m256i y) {
  const __m256i ax = _mm256_sign_epi8(x, x);
  const __m256i sy = _mm256_sign_epi8(y, x);
  const __m256i dot16 = _mm256_maddubs_epi16(ax, sy);
  const __m256i dot32 = _mm256_madd_epi16(dot16, _mm256_set1_epi16(1));
  return _mm256_cvtepi32_ps(dot32);
}

float vec_dot_q8_0_q8_0(const BlockQ8_0* w, const BlockQ8_0* x, int64_t n_blocks) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256 d = _mm256_set1_ps(f16_to_f32(w[b].d) * f16_to_f32(x[b].d));
    __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs(qw, qx), acc);
  }
  return hsum(acc);
}

float vec_dot_q4_0_q8_0(const BlockQ4_0* w, const BlockQ8_0* x, int64_t n_blocks) {
  __m256 acc = _mm256_setzero_ps();
  const __m128i low_mask = _mm_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256 d = _mm256_set1_ps(f16_to_f32(w[b].d) * f16_to_f32(x[b].d));
    __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].qs));
    __m128i lo = _mm_and_si128(packed, low_mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_mask);
    __m256i qw = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight);
    __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs(qw, qx), acc);
  }
  return hsum(acc);
}

// Activation quantization to Q8_0 (round to nearest, as ggml's reference).
void quantize_q8_0(const float* x, BlockQ8_0* out, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float* v = x + b * kQK8_0;
    float amax = 0;
    for (int i = 0; i < kQK8_0; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    out[b].d = f32_to_f16(d);
    for (int i = 0; i < kQK8_0; ++i) out[b].qs[i] = static_cast<int8_t>(std::nearbyint(v[i] * id));
  }
}

// Activations in the form the weight type's dot product consumes.
struct PackedActivations {
  std::vector<uint8_t> bytes;
  size_t row_bytes = 0;
  const float* f32 = nullptr;  // F32 weights use the input directly
};

void pack_activations(DType type, const float* x, int64_t n_in, int64_t n_tokens,
                      PackedActivations& out) {
  switch (type) {
    case DType::F32:
      out.f32 = x;
      out.row_bytes = n_in * sizeof(float);
      return;
    case DType::F16:
    case DType::BF16: {
      out.row_bytes = n_in * 2;
      out.bytes.resize(out.row_bytes * n_tokens);
      auto* dst = reinterpret_cast<uint16_t*>(out.bytes.data());
      for (int64_t i = 0; i < n_in * n_tokens; ++i)
        dst[i] = type == DType::F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
      return;
    }
    case DType::Q8_0:
    case DType::Q4_0: {
      out.row_bytes = n_in / kQK8_0 * sizeof(BlockQ8_0);
      out.bytes.resize(out.row_bytes * n_tokens);
      for (int64_t t = 0; t < n_tokens; ++t)
        quantize_q8_0(x + t * n_in, reinterpret_cast<BlockQ8_0*>(out.bytes.data() + t * out.row_bytes),
                      n_in);
      return;
    }
    default:
      return;
  }
}

inline float row_dot(DType type, const uint8_t* w, const PackedActivations& a, int64_t t,
                     int64_t n_in) {
  switch (type) {
    case DType::F32:
      return vec_dot_f32(reinterpret_cast<const float*>(w), a.f32 + t * n_in, n_in);
    case DType::F16:
      return vec_dot_f16(reinterpret_cast<const uint16_t*>(w),
                         reinterpret_cast<const uint16_t*>(a.bytes.data() + t * a.row_bytes), n_in);
    case DType::BF16:
      return vec_dot_bf16(reinterpret_cast<const uint16_t*>(w),
                          reinterpret_cast<const uint16_t*>(a.bytes.data() + t * a.row_bytes), n_in);
    case DType::Q8_0:
      return vec_dot_q8_0_q8_0(reinterpret_cast<const BlockQ8_0*>(w),
                               reinterpret_cast<const BlockQ8_0*>(a.bytes.data() + t * a.row_bytes),
                               n_in / kQK8_0);
    case DType::Q4_0:
      return vec_dot_q4_0_q8_0(reinterpret_cast<const BlockQ4_0*>(w),
                               reinterpret_cast<const BlockQ8_0*>(a.bytes.data() + t * a.row_bytes),
                               n_in / kQK8_0);
    default:
      return 0;
  }
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) { return vec_dot_f32(a, b, n); }

void matmul(const MatrixView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  thread_local PackedActivations packed;
  packed.f32 = nullptr;
  pack_activations(w.type, x, w.n_in, n_tokens, packed);
  // Rows are split into chunks; inside a chunk, a few weight rows are reused
  // across all tokens while they sit in cache.
  constexpr int64_t kRowsPerChunk = 16;
  const int64_t n_chunks = (w.n_out + kRowsPerChunk - 1) / kRowsPerChunk;
  const PackedActivations& a = packed;
  pool.parallel_for(n_chunks, [&](int64_t chunk) {
    const int64_t r0 = chunk * kRowsPerChunk;
    const int64_t r1 = std::min(w.n_out, r0 + kRowsPerChunk);
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* yt = y + t * w.n_out;
      for (int64_t r = r0; r < r1; ++r) yt[r] = row_dot(w.type, w.row(r), a, t, w.n_in);
    }
  });
}

void dequantize_row(const MatrixView& w, int64_t r, float* out) {
  const uint8_t* p = w.row(r);
  switch (w.type) {
    case DType::F32:
      std::memcpy(out, p, w.n_in * sizeof(float));
      return;
    case DType::F16: {
      auto* h = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < w.n_in; ++i) out[i] = f16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      auto* h = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < w.n_in; ++i) out[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::Q8_0: {
      auto* b = reinterpret_cast<const BlockQ8_0*>(p);
      for (int64_t k = 0; k < w.n_in / kQK8_0; ++k) {
        float d = f16_to_f32(b[k].d);
        for (int i = 0; i < kQK8_0; ++i) out[k * kQK8_0 + i] = d * b[k].qs[i];
      }
      return;
    }
    case DType::Q4_0: {
      auto* b = reinterpret_cast<const BlockQ4_0*>(p);
      for (int64_t k = 0; k < w.n_in / kQK4_0; ++k) {
        float d = f16_to_f32(b[k].d);
        for (int i = 0; i < kQK4_0 / 2; ++i) {
          out[k * kQK4_0 + i] = d * ((b[k].qs[i] & 0x0f) - 8);
          out[k * kQK4_0 + i + kQK4_0 / 2] = d * ((b[k].qs[i] >> 4) - 8);
        }
      }
      return;
    }
    default:
      return;
  }
}

void convert_f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void attend_one_query(const float* q, int64_t head_dim, int64_t first, int64_t end, float scale,
                      RowFetch key, RowFetch value, const void* ctx, float* out) {
  thread_local std::vector<uint16_t> q16, acc16;
  thread_local std::vector<float> accf;
  q16.resize(head_dim);
  acc16.assign(head_dim, 0);
  accf.resize(head_dim);
  convert_f32_to_f16(q, q16.data(), head_dim);
  float running_max = -INFINITY;
  float sum = 0.0f;
  for (int64_t p = first; p < end; ++p) {
    const float s = vec_dot_f16(q16.data(), key(ctx, p), head_dim) * scale;
    float ms = 1.0f, vs = 1.0f;
    const uint16_t* v = value(ctx, p);
    if (s > running_max) {
      const float old = running_max;
      running_max = s;
      ms = std::exp(old - running_max);
      for (int64_t d = 0; d < head_dim; ++d) acc16[d] = f32_to_f16(f16_to_f32(acc16[d]) * ms);
    } else {
      vs = std::exp(s - running_max);
    }
    for (int64_t d = 0; d < head_dim; ++d)
      acc16[d] = f32_to_f16(f16_to_f32(acc16[d]) + f16_to_f32(v[d]) * vs);
    sum = sum * ms + vs;
  }
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  for (int64_t d = 0; d < head_dim; ++d) out[d] = f16_to_f32(acc16[d]) * inv;
}

void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out) {
  double sum = 0;  // ggml accumulates the sum of squares in double (ggml_float)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
  if (weight) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void layer_norm(const float* x, const float* weight, const float* bias, float eps, int64_t n,
                float* out) {
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= n;
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(var) + eps);
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(x[i] - mean) * scale;
    if (weight) v *= weight[i];
    if (bias) v += bias[i];
    out[i] = v;
  }
}

void rope(float* x, int n_heads, int head_dim, int n_rot, int64_t pos, float freq_base,
          float freq_scale, RopeStyle style) {
  // theta_i = pos * base^(-2i/n_rot), built by repeated multiplication as ggml does.
  const float theta_scale = std::pow(freq_base, -2.0f / n_rot);
  float cos_cache[512], sin_cache[512];
  float theta = static_cast<float>(pos) * freq_scale;
  for (int i = 0; i < n_rot / 2; ++i) {
    cos_cache[i] = std::cos(theta);
    sin_cache[i] = std::sin(theta);
    theta *= theta_scale;
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    if (style == RopeStyle::Normal) {
      for (int i = 0; i < n_rot / 2; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cos_cache[i] - b * sin_cache[i];
        v[2 * i + 1] = a * sin_cache[i] + b * cos_cache[i];
      }
    } else {
      const int half = n_rot / 2;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_cache[i] - b * sin_cache[i];
        v[i + half] = a * sin_cache[i] + b * cos_cache[i];
      }
    }
  }
}

void softmax_inplace(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoef = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)));
}

}  // namespace reprise
