// AVX-512 helpers shared by the AVX-512 kernel files (kernels_avx512.cpp,
// attention_tiled_avx512.cpp): avx2_math.h's functions on 16 lanes, the same
// operations per lane, so every ISA gives the same bits. Each function
// carries its target options, so the header may be included anywhere; only
// code that runs after the CPU check may call it.
#pragma once
#include <immintrin.h>

#include "tensor/avx2_math.h"

namespace reprise::kernels::avx512 {

#define RP_AVX512_INLINE \
  static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// ggml's vector expf on 16 lanes: the operations of avx2::exp8, lanes
// outside the fast range through avx2::exp_scalar.
RP_AVX512_INLINE __m512 exp16(__m512 x) {
  namespace a = avx2;
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(a::kLog2e), _mm512_set1_ps(a::kExpShift));
  const __m512 n = _mm512_sub_ps(z, _mm512_set1_ps(a::kExpShift));
  const __m512 b =
      _mm512_fnmadd_ps(n, _mm512_set1_ps(a::kLn2Lo), _mm512_fnmadd_ps(n, _mm512_set1_ps(a::kLn2Hi), x));
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(a::kC5), b, _mm512_set1_ps(a::kC4)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(a::kC3), b, _mm512_set1_ps(a::kC2))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(a::kC1), b, _mm512_set1_ps(1.0f)));
  const __mmask16 ok = _mm512_cmp_ps_mask(n, _mm512_set1_ps(-126.0f), _CMP_GE_OQ) &
                       _mm512_cmp_ps_mask(n, _mm512_set1_ps(127.0f), _CMP_LE_OQ);
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 r = _mm512_mul_ps(j, _mm512_castsi512_ps(e));
  if (ok != 0xFFFF) {
    alignas(64) float xs[16], rs[16];
    _mm512_store_ps(xs, x);
    _mm512_store_ps(rs, r);
    for (int i = 0; i < 16; ++i)
      if (!(ok >> i & 1)) rs[i] = a::exp_scalar(xs[i]);
    r = _mm512_load_ps(rs);
  }
  return r;
}

#undef RP_AVX512_INLINE

}  // namespace reprise::kernels::avx512
