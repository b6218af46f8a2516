// Mamba-1's selective scan: the AVX2 kernel (8 channels a vector), the
// plain reference, and the dispatch (ssm_scan.h states the operations).
#include "tensor/ssm_scan.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "tensor/kernels_impl.h"

namespace reprise::kernels {
namespace {

namespace e = scan_exp;

// The exp of ssm_scan.h over 8 lanes.
inline __m256 exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(e::kExpLo), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(e::kExpLo)), _mm256_set1_ps(e::kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(e::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(e::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(e::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(e::kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(e::kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(e::kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(e::kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(e::kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(e::kP5));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // Scaled by 2^n in two steps so that n = 128 (x near the top) works.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
}

// The log of ssm_scan.h over 8 lanes (positive normal inputs).
inline __m256 log8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  __m256 ex = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
  __m256 m = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x807FFFFF)), _mm256_set1_epi32(0x3F000000)));
  const __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(e::kSqrtHalf), _CMP_LT_OQ);
  ex = _mm256_sub_ps(ex, _mm256_and_ps(small, _mm256_set1_ps(1.0f)));
  m = _mm256_sub_ps(_mm256_add_ps(m, _mm256_and_ps(small, m)), _mm256_set1_ps(1.0f));
  const __m256 z = _mm256_mul_ps(m, m);
  __m256 p = _mm256_set1_ps(e::kL0);
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(e::kL1));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(e::kL2));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(e::kL3));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(e::kL4));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(e::kL5));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(e::kL6));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(e::kL7));
  p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(e::kL8));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, m), z);
  y = _mm256_fmadd_ps(ex, _mm256_set1_ps(e::kLn2Lo), y);
  y = _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), z, y);
  return _mm256_fmadd_ps(ex, _mm256_set1_ps(e::kLn2Hi), _mm256_add_ps(m, y));
}

inline __m256 softplus8(__m256 x) {
  const __m256 sp = log8(_mm256_add_ps(_mm256_set1_ps(1.0f), exp8(x)));
  return _mm256_blendv_ps(sp, x, _mm256_cmp_ps(x, _mm256_set1_ps(e::kSoftplusLinear), _CMP_GT_OQ));
}

// The same, one value at a time.
float exp_reference(float x) {
  const bool underflow = x < e::kExpLo;
  x = std::fmin(std::fmax(x, e::kExpLo), e::kExpHi);
  const float n = std::nearbyint(x * e::kLog2e);
  float r = std::fma(-n, e::kLn2Hi, x);
  r = std::fma(-n, e::kLn2Lo, r);
  float p = e::kP0;
  p = std::fma(p, r, e::kP1);
  p = std::fma(p, r, e::kP2);
  p = std::fma(p, r, e::kP3);
  p = std::fma(p, r, e::kP4);
  p = std::fma(p, r, e::kP5);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t ni = static_cast<int32_t>(n), half = ni >> 1;
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(half + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(ni - half + 127) << 23);
  return underflow ? 0.0f : (p * s1) * s2;
}

float log_reference(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  float ex = static_cast<float>(static_cast<int32_t>(bits >> 23) - 126);
  float m = std::bit_cast<float>((bits & 0x807FFFFFu) | 0x3F000000u);
  if (m < e::kSqrtHalf) {
    ex = ex - 1.0f;
    m = (m + m) - 1.0f;
  } else {
    m = (m + 0.0f) - 1.0f;
  }
  const float z = m * m;
  float p = e::kL0;
  for (const float l : {e::kL1, e::kL2, e::kL3, e::kL4, e::kL5, e::kL6, e::kL7, e::kL8}) p = std::fma(p, m, l);
  float y = (p * m) * z;
  y = std::fma(ex, e::kLn2Lo, y);
  y = std::fma(-0.5f, z, y);
  return std::fma(ex, e::kLn2Hi, m + y);
}

float softplus_reference(float x) {
  return x > e::kSoftplusLinear ? x : log_reference(1.0f + exp_reference(x));
}

}  // namespace

void mamba1_scan_avx2(const Mamba1Scan& s) {
  const int64_t ds = s.d_state, nc = s.channels;
  alignas(32) static const int32_t kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  // Softplus for kChunk tokens ahead of their scan: its exp-log chain is
  // long, and independent from token to token where the scan is not.
  constexpr int64_t kChunk = 16;
  alignas(32) float sp[kChunk][8];
  // Each 8-channel half of the block through all the tokens.
  for (int64_t c0 = 0; c0 < nc; c0 += 8) {
    const int64_t lanes = nc - c0 < 8 ? nc - c0 : 8;
    const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - lanes));
    for (int64_t t0 = 0; t0 < s.n_tokens; t0 += kChunk) {
      const int64_t t1 = std::min(t0 + kChunk, s.n_tokens);
      for (int64_t t = t0; t < t1; ++t)
        _mm256_store_ps(sp[t - t0], softplus8(_mm256_maskload_ps(s.dt + t * s.row_stride + c0, m)));
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t row = t * s.row_stride + c0;
        const __m256 dt = _mm256_load_ps(sp[t - t0]);
        const __m256 x_dt = _mm256_mul_ps(_mm256_maskload_ps(s.x + row, m), dt);
        const float* b = s.bc + t * s.bc_stride;
        const float* c = b + ds;
        __m256 y = _mm256_setzero_ps();
        for (int64_t k = 0; k < ds; ++k) {
          const __m256 dA = exp8(_mm256_mul_ps(dt, _mm256_maskload_ps(s.A + k * nc + c0, m)));
          float* st = s.state + k * nc + c0;
          const __m256 v = _mm256_fmadd_ps(_mm256_maskload_ps(st, m), dA, _mm256_mul_ps(_mm256_set1_ps(b[k]), x_dt));
          _mm256_maskstore_ps(st, m, v);
          y = _mm256_fmadd_ps(v, _mm256_set1_ps(c[k]), y);
        }
        _mm256_maskstore_ps(s.y + row, m, y);
      }
    }
  }
}

void mamba1_scan_reference(const Mamba1Scan& s) {
  const int64_t ds = s.d_state, nc = s.channels;
  for (int64_t c = 0; c < nc; ++c) {
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      const int64_t row = t * s.row_stride + c;
      const float dt = softplus_reference(s.dt[row]), x_dt = s.x[row] * dt;
      const float* b = s.bc + t * s.bc_stride;
      const float* cv = b + ds;
      float y = 0.0f;
      for (int64_t k = 0; k < ds; ++k) {
        float& st = s.state[k * nc + c];
        st = std::fma(st, exp_reference(dt * s.A[k * nc + c]), b[k] * x_dt);
        y = std::fma(st, cv[k], y);
      }
      s.y[row] = y;
    }
  }
}

void mamba1_scan(const Mamba1Scan& s) { isa_kernels().mamba1_scan(s); }

}  // namespace reprise::kernels
