// Mamba-1's selective scan with 16-lane AVX-512 vectors: a block's 16
// channels in one vector, so each state element of a token costs one vector
// exp where the AVX2 kernel takes two (ssm_scan.h states the operations; the
// same bits as ssm_scan.cpp's kernel).
//
// Everything below the target pragma is compiled for AVX-512 and runs only
// after the CPU check, so it uses intrinsics only: no standard-library inline
// function is instantiated with these options.
#include <immintrin.h>

#include <cstdint>

#include "tensor/ssm_scan.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#endif

namespace reprise::kernels {
namespace {

namespace e = scan_exp;

// The exp of ssm_scan.h over 16 lanes (ssm_scan.cpp's exp8, operation for
// operation but the scaling by 2^n, which vscalefps does in one).
__attribute__((always_inline)) inline __m512 exp16(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(e::kExpLo), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(e::kExpLo)), _mm512_set1_ps(e::kExpHi));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(e::kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(e::kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(e::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(e::kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(e::kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(e::kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(e::kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(e::kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(e::kP5));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  // p * 2^n rounded once, as the two steps of exp8 round it (the first is
  // exact), subnormal results included.
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_scalef_ps(p, n));
}

// The log of ssm_scan.h over 16 lanes (ssm_scan.cpp's log8).
__attribute__((always_inline)) inline __m512 log16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  __m512 ex = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(126)));
  __m512 m = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(0x807FFFFF)), _mm512_set1_epi32(0x3F000000)));
  const __mmask16 small = _mm512_cmp_ps_mask(m, _mm512_set1_ps(e::kSqrtHalf), _CMP_LT_OQ);
  ex = _mm512_mask_sub_ps(ex, small, ex, _mm512_set1_ps(1.0f));
  m = _mm512_sub_ps(_mm512_mask_add_ps(m, small, m, m), _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(m, m);
  __m512 p = _mm512_set1_ps(e::kL0);
  p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(e::kL1));
  p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(e::kL2));
  p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(e::kL3));
  p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(e::kL4));
  p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(e::kL5));
  p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(e::kL6));
  p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(e::kL7));
  p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(e::kL8));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, m), z);
  y = _mm512_fmadd_ps(ex, _mm512_set1_ps(e::kLn2Lo), y);
  y = _mm512_fnmadd_ps(_mm512_set1_ps(0.5f), z, y);
  return _mm512_fmadd_ps(ex, _mm512_set1_ps(e::kLn2Hi), _mm512_add_ps(m, y));
}

__attribute__((always_inline)) inline __m512 softplus16(__m512 x) {
  const __m512 sp = log16(_mm512_add_ps(_mm512_set1_ps(1.0f), exp16(x)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(e::kSoftplusLinear), _CMP_GT_OQ), sp, x);
}

}  // namespace

void mamba1_scan_avx512(const Mamba1Scan& s) {
  const int64_t ds = s.d_state, nc = s.channels;
  const __mmask16 m = static_cast<__mmask16>((1u << nc) - 1);
  // Softplus for kChunk tokens ahead of their scan: its exp-log chain is
  // long, and independent from token to token where the scan is not.
  constexpr int64_t kChunk = 16;
  alignas(64) float sp[kChunk][16];
  for (int64_t t0 = 0; t0 < s.n_tokens; t0 += kChunk) {
    const int64_t t1 = t0 + kChunk < s.n_tokens ? t0 + kChunk : s.n_tokens;
    for (int64_t t = t0; t < t1; ++t)
      _mm512_store_ps(sp[t - t0], softplus16(_mm512_maskz_loadu_ps(m, s.dt + t * s.row_stride)));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = t * s.row_stride;
      const __m512 dt = _mm512_load_ps(sp[t - t0]);
      const __m512 x_dt = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s.x + row), dt);
      const float* b = s.bc + t * s.bc_stride;
      const float* c = b + ds;
      __m512 y = _mm512_setzero_ps();
      for (int64_t k = 0; k < ds; ++k) {
        const __m512 dA = exp16(_mm512_mul_ps(dt, _mm512_maskz_loadu_ps(m, s.A + k * nc)));
        float* st = s.state + k * nc;
        const __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, st), dA, _mm512_mul_ps(_mm512_set1_ps(b[k]), x_dt));
        _mm512_mask_storeu_ps(st, m, v);
        y = _mm512_fmadd_ps(v, _mm512_set1_ps(c[k]), y);
      }
      _mm512_mask_storeu_ps(s.y + row, m, y);
    }
  }
}

}  // namespace reprise::kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
