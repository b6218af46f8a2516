// AVX2 (x86-64-v3) helpers shared by the kernel driver and the AVX2
// attention kernels: ggml's vector expf and glibc's expf bit for bit, f16 loads and rounding, and
// ggml's 8-lane horizontal sum order.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "tensor/kernels_impl.h"

namespace reprise::kernels::avx2 {

// 32-bit halves of the table entries for the 8 lanes' k (k & 31), looked up
// in registers: vpermd picks among 8 entries by k's low 3 bits, bits 3 and 4
// choose among the 4 vectors.
inline __m256i table_half(const uint32_t* half, __m256i k) {
  const __m256i* t = reinterpret_cast<const __m256i*>(half);
  const __m256 a0 = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(t), k));
  const __m256 a1 = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(t + 1), k));
  const __m256 a2 = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(t + 2), k));
  const __m256 a3 = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(_mm256_load_si256(t + 3), k));
  const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(k, 28));  // blendv reads the sign bit
  const __m256 bit4 = _mm256_castsi256_ps(_mm256_slli_epi32(k, 27));
  return _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_blendv_ps(a0, a1, bit3), _mm256_blendv_ps(a2, a3, bit3), bit4));
}

// The glibc expf core for 4 lanes in double precision: z = x * N / ln 2,
// kd = z + shift (k in its low bits), t = table entry for k.
inline __m128 expf_core4(__m256d z, __m256d kd, __m256i t) {
  namespace g = glibc_expf;
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, _mm256_set1_pd(g::kShift));
  const __m256d r = _mm256_sub_pd(z, kd);
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
  const __m256d za = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), _mm256_set1_pd(g::kInvLn2N));
  const __m256d zb = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), _mm256_set1_pd(g::kInvLn2N));
  const __m256d kda = _mm256_add_pd(za, _mm256_set1_pd(g::kShift));
  const __m256d kdb = _mm256_add_pd(zb, _mm256_set1_pd(g::kShift));
  // k of all 8 lanes (the low halves of the 64-bit lanes), in lane order.
  const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m256i k = _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(kda), low_halves),
                                              _mm256_permutevar8x32_epi32(_mm256_castpd_si256(kdb), low_halves), 0x20);
  const __m256i lo = table_half(g::kSplitTable.lo, k), hi = table_half(g::kSplitTable.hi, k);
  const __m256i t01 = _mm256_unpacklo_epi32(lo, hi), t23 = _mm256_unpackhi_epi32(lo, hi);  // lanes 0 1 4 5, 2 3 6 7
  const __m256i ta = _mm256_permute2x128_si256(t01, t23, 0x20), tb = _mm256_permute2x128_si256(t01, t23, 0x31);
  __m256 y = _mm256_set_m128(expf_core4(zb, kdb, tb), expf_core4(za, kda, ta));
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


// ---------------------------------------------------------------------------
// exp (ggml's vector expf: Arm optimized-routines polynomial, with the
// AVX-512 finish: 2^n applied to j = 1 + p in one rounding, as scalef does),
// the same bits as a vector or a scalar. 2^n is one multiply by an exact
// power of two for n in [-149, 127]; n = -150 rounds to 2^-149 or 0; beyond
// that the result is 0 or +inf.

constexpr float kExpShift = 0x1.8p23f;
constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kLn2Hi = 0x1.62e4p-1f;
constexpr float kLn2Lo = 0x1.7f7d1cp-20f;
constexpr float kC5 = 0x1.0e4020p-7f, kC4 = 0x1.573e2ep-5f, kC3 = 0x1.555e66p-3f, kC2 = 0x1.fffdb6p-2f,
                kC1 = 0x1.ffffecp-1f;

// GELU's tanh form, 0.5 x (1 + tanh(kGeluSqrt2OverPi x (1 + kGeluCoef x^2))),
// which gelu_mul computes as a sigmoid on the vector exp (kernels.cpp).
constexpr float kGeluSqrt2OverPi = 0.79788456080286535587989211986876f;
constexpr float kGeluCoef = 0.044715f;

inline float pow2i(int n) {  // exact 2^n for n in [-149, 127]
  uint32_t bits = n >= -126 ? static_cast<uint32_t>(n + 127) << 23 : 1u << (n + 149);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float exp_scalar(float x) {
  const float z = std::fma(x, kLog2e, kExpShift);
  const float n = z - kExpShift;
  const float b = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(kC5, b, kC4), u, std::fma(kC3, b, kC2)), u, std::fma(kC1, b, 1.0f));
  if (std::isnan(n)) return x + x;
  if (n > 128.0f) return INFINITY;
  if (n < -150.0f) return 0.0f;
  // j * 2^-150 rounds to the smallest subnormal or to 0, as AVX-512's
  // scalef (ggml's finish) rounds it.
  if (n == -150.0f) return j > 1.0f ? 0x1p-149f : 0.0f;
  if (n == 128.0f) return (j * 0x1p127f) * 2.0f;
  return j * pow2i(static_cast<int>(n));
}

// 8 lanes; lanes outside the fast range go through exp_scalar.
__attribute__((always_inline)) inline __m256 exp8(__m256 x) {
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(kExpShift));
  const __m256 n = _mm256_sub_ps(z, _mm256_set1_ps(kExpShift));
  const __m256 b =
      _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(kC5), b, _mm256_set1_ps(kC4)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(kC3), b, _mm256_set1_ps(kC2))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(kC1), b, _mm256_set1_ps(1.0f)));
  // Fast range n in [-126, 127] (NaN compares false, so it takes the slow path).
  const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(n, _mm256_set1_ps(-126.0f), _CMP_GE_OQ),
                                  _mm256_cmp_ps(n, _mm256_set1_ps(127.0f), _CMP_LE_OQ));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 r = _mm256_mul_ps(j, _mm256_castsi256_ps(e));
  if (_mm256_movemask_ps(ok) != 0xff) {
    alignas(32) float xs[8], rs[8];
    _mm256_store_ps(xs, x);
    _mm256_store_ps(rs, r);
    const int m = _mm256_movemask_ps(ok);
    for (int i = 0; i < 8; ++i)
      if (!(m >> i & 1)) rs[i] = exp_scalar(xs[i]);
    r = _mm256_load_ps(rs);
  }
  return r;
}

// v[i][j] <- v[j][i] for 8 vectors of 8 32-bit elements (weight packing,
// attention's K transpose).
inline void transpose8x8_epi32(__m256i (&v)[8]) {
  const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  v[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
  v[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
  v[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
  v[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
  v[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
  v[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
  v[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
  v[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

}  // namespace reprise::kernels::avx2
