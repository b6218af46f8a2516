// The selective scans with 16-lane AVX-512 vectors (scan_lanes' loops over
// this file's primitives): a block's 16 channels in one vector, so each
// state element of a token costs one vector exp (Mamba-1) where the AVX2
// kernel takes two; the same bits as ssm_scan.cpp's kernels.
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

// After the target options: its templates are instantiated with them.
#include "tensor/ssm_scan_lanes.h"

namespace reprise::kernels {
namespace {

// scan_lanes' primitives over 16 lanes.
struct Avx512 {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr int kWidth = 16;
  using Lanes = __mmask16;  // the first n of the 16
  static Lanes lanes(int64_t n) { return static_cast<Lanes>(n < 16 ? (1u << n) - 1 : 0xFFFFu); }
  static Vec load(const float* p, Lanes l) { return _mm512_maskz_loadu_ps(l, p); }
  static void store(float* p, Lanes l, Vec v) { _mm512_mask_storeu_ps(p, l, v); }
  static Vec load_all(const float* p) { return _mm512_load_ps(p); }
  static void store_all(float* p, Vec v) { _mm512_store_ps(p, v); }
  static Vec set1(float v) { return _mm512_set1_ps(v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
  static Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Mask less(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static Mask greater(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Vec select(Mask m, Vec if_set, Vec if_clear) { return _mm512_mask_blend_ps(m, if_clear, if_set); }
  static Vec zero_where(Mask m, Vec v) { return _mm512_maskz_mov_ps(static_cast<Mask>(~m), v); }
  static Vec add_where(Mask m, Vec a, Vec b) { return _mm512_mask_add_ps(a, m, a, b); }
  static Vec sub_where(Mask m, Vec a, Vec b) { return _mm512_mask_sub_ps(a, m, a, b); }
  static Vec round_nearest(Vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p * 2^n rounded once, as AVX2's two steps round it (the first is
  // exact), subnormal results included.
  static Vec scale_pow2(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }
  static Vec exponent(Vec v) {
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(v), 23), _mm512_set1_epi32(126)));
  }
  static Vec mantissa(Vec v) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x807FFFFF)),
                                               _mm512_set1_epi32(0x3F000000)));
  }
};

}  // namespace

// 4 tokens at a time through a block in prompts: its state and A loaded
// once for the 4 (paired pp512, 768-embd Mamba-1: 1.30x against one).
void mamba1_scan_avx512(const Mamba1Scan& s) { scan_lanes::mamba1<Avx512, 4>(s); }
void mamba2_scan_avx512(const Mamba2Scan& s) { scan_lanes::mamba2<Avx512>(s); }

}  // namespace reprise::kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
