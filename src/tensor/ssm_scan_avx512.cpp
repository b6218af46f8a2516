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
