// The selective scans with 16-lane AVX-512 vectors: a block's 16 channels
// in one vector, so each state element of a token costs one vector exp
// (Mamba-1) where the AVX2 kernel takes two (ssm_scan.h states the operations; the
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

// After the target options: its templates are instantiated with them.
#include "tensor/ssm_scan_lanes.h"

namespace reprise::kernels {
namespace {

// scan_lanes' primitives over 16 lanes.
struct Avx512 {
  using Vec = __m512;
  using Mask = __mmask16;
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

__attribute__((always_inline)) inline __m512 exp16(__m512 x) { return scan_lanes::exp<Avx512>(x); }
__attribute__((always_inline)) inline __m512 softplus16(__m512 x) { return scan_lanes::softplus<Avx512>(x); }

}  // namespace

namespace {

// Tokens t0 .. t0 + T - 1 of a Mamba-1 block (sp: their softplus'd time
// steps): each state element and its A are loaded once for the T tokens,
// and their T sums are independent chains. Each token's operations are the
// one-token ones.
template <int T>
__attribute__((always_inline)) inline void mamba1_tokens(const Mamba1Scan& s, __mmask16 m, int64_t t0,
                                                         const float (*sp)[16]) {
  __m512 dt[T], x_dt[T], y[T];
  const float *b[T], *c[T];
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) {
    const int64_t t = t0 + j;
    dt[j] = _mm512_load_ps(sp[j]);
    x_dt[j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s.x + t * s.row_stride), dt[j]);
    b[j] = s.bc + t * s.bc_stride;
    c[j] = b[j] + s.d_state;
    y[j] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < s.d_state; ++k) {
    const __m512 a = _mm512_maskz_loadu_ps(m, s.A + k * s.channels);
    float* st = s.state + k * s.channels;
    __m512 v = _mm512_maskz_loadu_ps(m, st);
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      const __m512 dA = exp16(_mm512_mul_ps(dt[j], a));
      v = _mm512_fmadd_ps(v, dA, _mm512_mul_ps(_mm512_set1_ps(b[j][k]), x_dt[j]));
      y[j] = _mm512_fmadd_ps(v, _mm512_set1_ps(c[j][k]), y[j]);
    }
    _mm512_mask_storeu_ps(st, m, v);
  }
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) _mm512_mask_storeu_ps(s.y + (t0 + j) * s.row_stride, m, y[j]);
}

}  // namespace

void mamba1_scan_avx512(const Mamba1Scan& s) {
  const __mmask16 m = static_cast<__mmask16>((1u << s.channels) - 1);
  // Softplus for kChunk tokens ahead of their scan: its exp-log chain is
  // long, and independent from token to token where the scan is not.
  constexpr int64_t kChunk = 16;
  alignas(64) float sp[kChunk][16];
  for (int64_t t0 = 0; t0 < s.n_tokens; t0 += kChunk) {
    const int64_t t1 = t0 + kChunk < s.n_tokens ? t0 + kChunk : s.n_tokens;
    for (int64_t t = t0; t < t1; ++t)
      _mm512_store_ps(sp[t - t0], softplus16(_mm512_maskz_loadu_ps(m, s.dt + t * s.row_stride)));
    int64_t t = t0;
    for (; t + 4 <= t1; t += 4) mamba1_tokens<4>(s, m, t, sp + (t - t0));
    for (; t < t1; ++t) mamba1_tokens<1>(s, m, t, sp + (t - t0));
  }
}

namespace {

// The rows of a Mamba-2 block: its first row, count, lane mask and state.
struct Block2 {
  int64_t r0, nc;
  __mmask16 m;
  float* state;
};

Block2 block2(const Mamba2Scan& s, int64_t r0) {
  const int64_t nc = s.channels - r0 < kScanBlock ? s.channels - r0 : kScanBlock;
  return {r0, nc, static_cast<__mmask16>((1u << nc) - 1), s.state + r0 * s.d_state};
}

// Tokens t0 .. t0 + T - 1 of one block: each state element is loaded once
// and taken through the T tokens in order; the T sums are independent
// chains. Each token's operations are the one-token ones.
template <int T>
__attribute__((always_inline)) inline void mamba2_tokens(const Mamba2Scan& s, const Block2& k2, int64_t t0) {
  __m512 x_dt[T], dA[T], y[T];
  const float *b[T], *c[T];
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) {
    const int64_t t = t0 + j;
    x_dt[j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(k2.m, s.x + t * s.x_stride + k2.r0), _mm512_set1_ps(s.sp[t]));
    dA[j] = _mm512_set1_ps(s.dA[t]);
    b[j] = s.b + t * s.bc_stride;
    c[j] = s.c + t * s.bc_stride;
    y[j] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < s.d_state; ++k) {
    float* st = k2.state + k * k2.nc;
    __m512 v = _mm512_maskz_loadu_ps(k2.m, st);
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      v = _mm512_fmadd_ps(v, dA[j], _mm512_mul_ps(_mm512_set1_ps(b[j][k]), x_dt[j]));
      y[j] = _mm512_fmadd_ps(v, _mm512_set1_ps(c[j][k]), y[j]);
    }
    _mm512_mask_storeu_ps(st, k2.m, v);
  }
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) _mm512_mask_storeu_ps(s.y + (t0 + j) * s.y_stride + k2.r0, k2.m, y[j]);
}

// Token t of NB blocks, whose sums are independent chains.
template <int NB>
__attribute__((always_inline)) inline void mamba2_blocks(const Mamba2Scan& s, const Block2* blocks, int64_t t) {
  const __m512 dA = _mm512_set1_ps(s.dA[t]), sp = _mm512_set1_ps(s.sp[t]);
  const float* b = s.b + t * s.bc_stride;
  const float* c = s.c + t * s.bc_stride;
  __m512 x_dt[NB], y[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    x_dt[j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(blocks[j].m, s.x + t * s.x_stride + blocks[j].r0), sp);
    y[j] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < s.d_state; ++k) {
    const __m512 bk = _mm512_set1_ps(b[k]), ck = _mm512_set1_ps(c[k]);
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      float* st = blocks[j].state + k * blocks[j].nc;
      const __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(blocks[j].m, st), dA, _mm512_mul_ps(bk, x_dt[j]));
      _mm512_mask_storeu_ps(st, blocks[j].m, v);
      y[j] = _mm512_fmadd_ps(v, ck, y[j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) _mm512_mask_storeu_ps(s.y + t * s.y_stride + blocks[j].r0, blocks[j].m, y[j]);
}

}  // namespace

void mamba2_scan_avx512(const Mamba2Scan& s) {
  const int64_t tokens4 = s.n_tokens / 4 * 4;
  // Groups of up to 4 blocks: 4 tokens at a time in each block, then the
  // tokens left over (all of them in decode) with the blocks interleaved.
  for (int64_t g0 = 0; g0 < s.channels; g0 += 4 * kScanBlock) {
    Block2 blocks[4];
    int nb = 0;
    for (int64_t r0 = g0; r0 < s.channels && nb < 4; r0 += kScanBlock) blocks[nb++] = block2(s, r0);
    for (int j = 0; j < nb; ++j)
      for (int64_t t = 0; t < tokens4; t += 4) mamba2_tokens<4>(s, blocks[j], t);
    for (int64_t t = tokens4; t < s.n_tokens; ++t) {
      switch (nb) {
        case 4: mamba2_blocks<4>(s, blocks, t); break;
        case 3: mamba2_blocks<3>(s, blocks, t); break;
        case 2: mamba2_blocks<2>(s, blocks, t); break;
        default: mamba2_blocks<1>(s, blocks, t); break;
      }
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
