// AVX2 (x86-64-v3) helpers shared by the kernel driver and the AVX2
// attention kernel: glibc's expf bit for bit, f16 loads and rounding, and
// ggml's 8-lane horizontal sum order.
#pragma once
#include <immintrin.h>

#include <cmath>

#include "tensor/kernels_impl.h"

namespace reprise::kernels::avx2 {

// 4 lanes of the glibc expf core in double precision.
inline __m128 expf_exact4(__m128 x) {
  namespace g = glibc_expf;
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d z = _mm256_mul_pd(xd, _mm256_set1_pd(g::kInvLn2N));
  __m256d kd = _mm256_add_pd(z, _mm256_set1_pd(g::kShift));
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, _mm256_set1_pd(g::kShift));
  const __m256d r = _mm256_sub_pd(z, kd);
  const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  __m256i t = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(g::kTable), idx, 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
  const __m256d s = _mm256_castsi256_pd(t);
  const __m256d zz = _mm256_fmadd_pd(_mm256_set1_pd(g::kC0), r, _mm256_set1_pd(g::kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(g::kC2), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(zz, r2, y);
  y = _mm256_mul_pd(y, s);
  return _mm256_cvtpd_ps(y);
}

// 8 lanes, with glibc's special cases (overflow, underflow, NaN).
inline __m256 expf_exact8(__m256 x) {
  namespace g = glibc_expf;
  __m256 y = _mm256_set_m128(expf_exact4(_mm256_extractf128_ps(x, 1)), expf_exact4(_mm256_castps256_ps128(x)));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(g::kOverflow), _CMP_GT_OQ));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(g::kUnderflow), _CMP_LT_OQ));
  return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

inline __m256 load_h8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 round_h8(__m256 v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }


}  // namespace reprise::kernels::avx2
