// AVX-512 (F, BW, VL, DQ, VNNI) kernels, chosen at run time (kernels.cpp).
// Everything below the target pragma is compiled for AVX-512 and must only run
// after the CPU check, so this file uses intrinsics and plain C only: no
// standard-library inline functions are instantiated with these options.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "tensor/avx512_math.h"
#include "tensor/kernels_impl.h"
#include "tensor/tile_runner.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
// GCC 12 warns about _mm512_undefined_ps inside its own intrinsics headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2")
// Loops start on 64-byte boundaries: where the Q8_0 decode loop happened to
// land moved its speed by ~7 % between otherwise equal builds (Zen 5); aligned,
// paired tg256 Q8_0 1.066x, the other types within noise.
#pragma GCC optimize("align-loops=64")
#endif

#include "tensor/q8_k_lanes.h"

namespace reprise::kernels {
namespace {

#define RP_INLINE inline __attribute__((always_inline))
#define RP_INLINE_LAMBDA __attribute__((always_inline))

enum class FType { F32, F16, BF16 };

template <FType W>
constexpr size_t kElemBytes = W == FType::F32 ? 4 : 2;

template <FType W>
RP_INLINE __m512 load_row16(const uint8_t* p) {
  if constexpr (W == FType::F32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (W == FType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

RP_INLINE void store_rows(float* y, int64_t rows_left, __m512 v) {
  if (rows_left >= kGroupRows) {
    _mm512_storeu_ps(y, v);
  } else if (rows_left > 0) {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << rows_left) - 1), v);
  }
}

// Accumulators start at +0, or at y's values when continuing a k range.
template <int G, int T>
RP_INLINE void init_acc(const MatmulArgs& a, int64_t g0, int64_t t0, __m512 (&acc)[G][T]) {
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      if (a.k_begin == 0) {
        acc[g][t] = _mm512_setzero_ps();
      } else {
        const int64_t rows = a.n_rows - (g0 + g) * kGroupRows;
        const float* y = a.y + (t0 + t) * a.y_stride + (g0 + g) * kGroupRows;
        acc[g][t] = rows >= kGroupRows ? _mm512_loadu_ps(y)
                                       : _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << rows) - 1), y);
      }
    }
}

// Stores the tile's outputs (rows beyond n_rows are not written).
template <int G, int T>
RP_INLINE void store_acc(const MatmulArgs& a, int64_t g0, int64_t t0, __m512 (&acc)[G][T]) {
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
      store_rows(a.y + (t0 + t) * a.y_stride + (g0 + g) * kGroupRows, a.n_rows - (g0 + g) * kGroupRows,
                 acc[g][t]);
}

// Tiles whose accumulators live in L1 between uses (parked): init_acc's
// values stored there, and store_acc from there at the end.
template <int G, int T>
RP_INLINE void park_acc(const MatmulArgs& a, int64_t g0, int64_t t0, float (&parked)[G][T][kGroupRows]) {
  __m512 acc[G][T];
  init_acc<G, T>(a, g0, t0, acc);
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) _mm512_store_ps(parked[g][t], acc[g][t]);
}

template <int G, int T>
RP_INLINE void store_parked(const MatmulArgs& a, int64_t g0, int64_t t0, const float (&parked)[G][T][kGroupRows]) {
  __m512 acc[G][T];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_load_ps(parked[g][t]);
  store_acc<G, T>(a, g0, t0, acc);
}

// G groups x T tokens; every output is one sequential FMA chain over k.
// kNext: requests the next tile's weights (requests_next_groups).
template <FType W, int G, int T, bool kNext = false>
void tile_f(const MatmulArgs& a, int64_t g0, int64_t t0) {
  constexpr size_t kStep = kGroupRows * kElemBytes<W>;
  const uint8_t* w = a.w + g0 * a.group_stride;
  const float* x = static_cast<const float*>(a.x) + x_offset(a.t0 + t0, 0, a.x_tile, a.x_k);
  const size_t gb = a.group_stride, us = a.unit_stride;
  const int64_t xs = a.x_tile;
  __m512 acc[G][T];
  init_acc<G, T>(a, g0, t0, acc);
  for (int64_t k = a.k_begin; k < a.k_end; ++k) {
    // Decode streams the weights once: prefetch ahead (prefetch_f_unit).
    if (a.prefetch > 0) prefetch_f_unit<G, kStep>(w + k * us, gb, us, g0, k, a.prefetch);
    if constexpr (kNext)
      if ((k * kStep) % 64 == 0) prefetch_next_groups<G, 64, 1>(a, g0, k * us, 0);
    __m512 wv[G];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) wv[g] = load_row16<W>(w + g * gb + k * us);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(x[k * xs + t]);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) acc[g][t] = _mm512_fmadd_ps(wv[g], xb, acc[g][t]);
    }
  }
  store_acc<G, T>(a, g0, t0, acc);
}

// A loaded vector the compiler must keep in a register. GCC folds a load
// into every instruction that reads it, so a nibble chunk used for its low
// and its high nibbles was loaded twice; a single-token tile is bound by its
// loads (about one 64-byte load a cycle on Zen 5): one load a chunk made a
// kernel-only copy of Q4_0's decode loop 1.35-1.55x faster and BM_Matmul's
// Q4_0 decode 1.07-1.08x (docs/performance.md, session 43).
RP_INLINE __m512i loaded_once(__m512i v) {
  asm("" : "+v"(v));
  return v;
}

// Fifth bits of the 4 elements a nibble chunk's row bytes hold: plane bit k
// (k = c for low nibbles, 4 + c for high ones) moved to bit 4 (16-bit shifts:
// what spills from the neighbouring byte stays outside bit 4).
template <int K>
RP_INLINE __m512i fifth_bits(__m512i plane) {
  const __m512i v = K <= 4 ? _mm512_slli_epi16(plane, 4 - K) : _mm512_srli_epi16(plane, K - 4);
  return _mm512_and_si512(v, _mm512_set1_epi8(0x10));
}

// IQ4_NL's table plus 128 in every 128-bit lane (vpshufb looks up per lane).
RP_INLINE __m512i iq4nl_table() {
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4nlBiased.v)));
}

// kPrefetch false: a.prefetch is 0, and the tile has no branch for it (see
// QKernel). kNext: requests the next tile's weights (requests_next_groups).
template <QType Q, int G, int T, bool kPrefetch = true, bool kNext = false>
void tile_q(const MatmulArgs& a, int64_t g0, int64_t t0) {
  constexpr size_t kBytes = kBlockBytes<Q>;
  constexpr size_t kQuants = kQuantOffset<Q>;
  const uint8_t* w = a.w + g0 * a.group_stride;
  const XBlock* x = static_cast<const XBlock*>(a.x) + x_offset(a.t0 + t0, 0, a.x_tile, a.x_k);
  const size_t gb = a.group_stride, us = a.unit_stride;
  const int64_t xs = a.x_tile;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 acc[G][T];
  init_acc<G, T>(a, g0, t0, acc);
  for (int64_t b = a.k_begin / kQK8_0; b < a.k_end / kQK8_0; ++b) {
    const uint8_t* wb = w + b * us;
    // Decode streams the weights once: each chunk prefetches its share of
    // the block's lines ahead (prefetch_share).
    __m512i ia[G][T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const XBlock& xb = x[b * xs + t];
      // Offsets of the unsigned quants: Q8_0 stores q + 128 (IQ4_NL's table
      // is looked up as value + 128), Q4_0 nibble = q + 8, Q5_0 u = q + 16;
      // the _1 types' quants are unsigned already.
      const int32_t corr = Q == QType::Q8_0 || Q == QType::IQ4NL ? xb.corr_q8
                           : Q == QType::Q4_0 ? xb.corr_q4
                           : Q == QType::Q5_0 ? 2 * xb.corr_q4
                                              : 0;
      const __m512i c = _mm512_set1_epi32(corr);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) ia[g][t] = c;
    }
    // ia[g][t] += per-row integer dots of the weight chunks wv (4 bytes per
    // row) with each token's 4 activation quants at qs + offset.
    auto dot_chunk = [&](const __m512i (&wv)[G], int offset) RP_INLINE_LAMBDA {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        int32_t q;
        std::memcpy(&q, x[b * xs + t].qs + offset, 4);
        const __m512i xv = _mm512_set1_epi32(q);
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], wv[g], xv);
      }
    };
    if constexpr (Q == QType::Q8_0) {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        if (kPrefetch && a.prefetch > 0) prefetch_share<G, kBytes, 8>(wb, gb, us, g0, c, a.prefetch);
        if constexpr (kNext) prefetch_next_groups<G, kBytes, 8>(a, g0, b * us, c);
        __m512i wv[G];
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_si512(wb + g * gb + 32 + c * 64);
        dot_chunk(wv, 4 * c);
      }
    } else {
      [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
        (
            [&]() RP_INLINE_LAMBDA {
              if (kPrefetch && a.prefetch > 0) prefetch_share<G, kBytes, 4>(wb, gb, us, g0, C, a.prefetch);
              if constexpr (kNext) prefetch_next_groups<G, kBytes, 4>(a, g0, b * us, C);
              // One and two tokens: the chunk (and the fifth-bit plane) is
              // loaded once for its low and its high nibbles (loaded_once;
              // 4-token tiles measured 0.98x with it, prompt tiles 0.98-1.00x).
              __m512i raw[G], wv[G], plane[G];
#pragma GCC unroll 16
              for (int g = 0; g < G; ++g) {
                raw[g] = _mm512_loadu_si512(wb + g * gb + kQuants + C * 64);
                if constexpr (T <= 2) raw[g] = loaded_once(raw[g]);
                wv[g] = _mm512_and_si512(raw[g], nibble);
                if constexpr (kHasFifthBit<Q>) {
                  plane[g] = _mm512_loadu_si512(wb + g * gb + kQuants + 256);
                  if constexpr (T <= 2) plane[g] = loaded_once(plane[g]);
                  wv[g] = _mm512_or_si512(wv[g], fifth_bits<C>(plane[g]));
                }
                if constexpr (Q == QType::IQ4NL) wv[g] = _mm512_shuffle_epi8(iq4nl_table(), wv[g]);
              }
              dot_chunk(wv, 4 * C);
#pragma GCC unroll 16
              for (int g = 0; g < G; ++g) {
                wv[g] = _mm512_and_si512(_mm512_srli_epi16(raw[g], 4), nibble);
                if constexpr (kHasFifthBit<Q>)
                  wv[g] = _mm512_or_si512(wv[g], fifth_bits<4 + C>(plane[g]));
                if constexpr (Q == QType::IQ4NL) wv[g] = _mm512_shuffle_epi8(iq4nl_table(), wv[g]);
              }
              dot_chunk(wv, 16 + 4 * C);
            }(),
            ...);
      }(std::make_integer_sequence<int, 4>{});
    }
    __m512 dw[G];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
      dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * gb)));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 dx = _mm512_set1_ps(x[b * xs + t].d);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g)
        acc[g][t] = _mm512_fmadd_ps(_mm512_mul_ps(dw[g], dx), _mm512_cvtepi32_ps(ia[g][t]), acc[g][t]);
    }
    if constexpr (kHasMin<Q>) {
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) {
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * gb + 32)));
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          const XBlock& xb = x[b * xs + t];
          const __m512 sum = _mm512_set1_ps(static_cast<float>(xb.sum_lo + xb.sum_hi));
          acc[g][t] = _mm512_fmadd_ps(_mm512_mul_ps(mw, _mm512_set1_ps(xb.d)), sum, acc[g][t]);
        }
      }
    }
  }
  store_acc<G, T>(a, g0, t0, acc);
}


// Small batches (2 to kTokenTile - 1 tokens) over one row of a region
// layout: the G groups' blocks in turn, each group's stream a block at a
// time as the decode tile reads them (G streams at once), every token's
// dots of a group-block from one load of it, the tile's accumulators parked
// in L1 between a group's blocks (the prompt tile, 2 groups x T tokens,
// would read 2 of the row's regions along all of k, then the next 2). Each
// output's operations are tile_q's, in its order (the same bits).
template <QType Q, int G, int T>
void tile_q_rows(const MatmulArgs& a, int64_t g0, int64_t t0) {
  static_assert(Q == QType::Q8_0, "the row tile reads Q8_0 blocks");
  constexpr size_t kBytes = kBlockBytes<Q>;
  const uint8_t* w = a.w + g0 * a.group_stride;
  const XBlock* x = static_cast<const XBlock*>(a.x) + x_offset(a.t0 + t0, 0, a.x_tile, a.x_k);
  const size_t gb = a.group_stride, us = a.unit_stride;
  const int64_t xs = a.x_tile;
  alignas(64) float parked[G][T][kGroupRows];
  park_acc<G, T>(a, g0, t0, parked);
  for (int64_t b = a.k_begin / kQK8_0; b < a.k_end / kQK8_0; ++b) {
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      // Beyond 2 tokens the block's 8 x T activation broadcasts, hoisted out
      // of the group loop, spill: the opaque pointer has each group read
      // them again (embedded broadcasts; loads are what the tile has spare).
      const XBlock* xb = x + b * xs;
      if constexpr (T > 2) asm("" : "+r"(xb));
      const uint8_t* wg = w + b * us + g * gb;
      if (a.prefetch > 0) prefetch_streams<1>(wg, 0, kBytes, a.prefetch);
      __m512i ia[T];
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) ia[t] = _mm512_set1_epi32(xb[t].corr_q8);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i wv = _mm512_loadu_si512(wg + 32 + c * 64);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          int32_t q;
          std::memcpy(&q, xb[t].qs + 4 * c, 4);
          ia[t] = _mm512_dpbusd_epi32(ia[t], wv, _mm512_set1_epi32(q));
        }
      }
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg)));
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512 acc = _mm512_load_ps(parked[g][t]);
        _mm512_store_ps(parked[g][t], _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb[t].d)),
                                                      _mm512_cvtepi32_ps(ia[t]), acc));
      }
    }
  }
  store_parked<G, T>(a, g0, t0, parked);
}

// Odd sub-blocks' Q4_K quants are read as 16 * u, their high nibble masked
// in place, and their dots divided by 16 (exactly: every term is a
// multiple) once per block: masks issue on more ports than shifts. (Q5_K
// and Q6_K: see q5k_chunk and q6k_halves.)
template <KType KT, bool Odd>
constexpr int kOddShift = Odd && KT == KType::Q4K ? 4 : 0;

// A Q4_K chunk's quants of sub-block 2 * pair + Odd as unsigned values
// (0..15, times 2^kOddShift), for 16 rows, from the chunk's nibble bytes v.
template <bool Odd>
RP_INLINE __m512i q4k_quants(__m512i v) {
  return _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(0x0f << kOddShift<KType::Q4K, Odd>)));
}

// Chunk C of a Q5_K section's sub-block j as u (0..31), for 16 rows, from
// the sub-block's five lines (kernels_impl.h): chunks 0-4 are a line's low
// 5 bits (one mask), chunks 5 and 6 two lines' top bits (two shifts, a
// select and a mask), chunk 7 three lines' (three shifts, two selects and
// a mask).
template <int C>
RP_INLINE __m512i q5k_chunk(const uint8_t* sec, int j) {
  constexpr int kSelect = 0xE4;  // operand 1 where operand 3 is set, else operand 2
  const __m512i low5 = _mm512_set1_epi8(0x1f);
  if constexpr (C < 5) {
    return _mm512_and_si512(_mm512_loadu_si512(sec + q5k_line_at(j, C)), low5);
  } else if constexpr (C < 7) {
    constexpr int l = 2 * (C - 5);  // chunk 5: lines 0 and 1; chunk 6: lines 2 and 3
    const __m512i a = _mm512_srli_epi16(_mm512_loadu_si512(sec + q5k_line_at(j, l)), 5);
    const __m512i b = _mm512_srli_epi16(_mm512_loadu_si512(sec + q5k_line_at(j, l + 1)), 2);
    return _mm512_and_si512(_mm512_ternarylogic_epi32(a, b, _mm512_set1_epi8(0x07), kSelect), low5);
  } else {
    const __m512i a = _mm512_srli_epi16(_mm512_loadu_si512(sec + q5k_line_at(j, 4)), 5);
    const __m512i b = _mm512_srli_epi16(_mm512_loadu_si512(sec + q5k_line_at(j, 1)), 4);
    const __m512i c = _mm512_srli_epi16(_mm512_loadu_si512(sec + q5k_line_at(j, 3)), 3);
    const __m512i low4 = _mm512_ternarylogic_epi32(a, b, _mm512_set1_epi8(0x07), kSelect);
    return _mm512_and_si512(_mm512_ternarylogic_epi32(low4, c, _mm512_set1_epi8(0x0f), kSelect), low5);
  }
}

// Where chunk C of pair `pair`'s nibble bytes are in a Q4_K section.
template <int C>
RP_INLINE const uint8_t* q4k_nibbles_at(const uint8_t* sec, int pair) {
  return sec + kQ4KNibbles + pair * 512 + C * 64;
}

// The unsigned quants of chunk C of sub-block 2 * pair + Odd of a K-type
// section at sec, for 16 rows.
template <KType KT, bool Odd, int C>
RP_INLINE __m512i k_affine_chunk(const uint8_t* sec, int pair) {
  if constexpr (KT == KType::Q6KWide) return _mm512_loadu_si512(sec + kQ6KQuants + (2 * pair + Odd) * 512 + C * 64);
  else if constexpr (KT == KType::Q5K) return q5k_chunk<C>(sec, 2 * pair + (Odd ? 1 : 0));
  else return q4k_quants<Odd>(_mm512_loadu_si512(q4k_nibbles_at<C>(sec, pair)));
}

// ia[g][t] += the dots of chunk c's weight quants wv (4 per row) with token
// t's activation quants 4c..4c+3 of block xb.
template <int G, int T>
RP_INLINE void dot_chunk_k(__m512i (&ia)[G][T], const __m512i (&wv)[G], const XBlock* xb, int c) {
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    int32_t q;
    std::memcpy(&q, xb[t].qs + 4 * c, 4);
    const __m512i xv = _mm512_set1_epi32(q);
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], wv[g], xv);
  }
}

// isum[g][t] += sc * (ia[g][t] >> Shift, exact), sc group g's 16 scale bytes
// at ws + g * gb + at (signed or unsigned): a K-type sub-block's integer
// dots, scaled, into the super-block's sums.
template <bool Signed, int Shift, int G, int T>
RP_INLINE void add_scaled_dots(const uint8_t* ws, size_t gb, size_t at, const __m512i (&ia)[G][T],
                               __m512i (&isum)[G][T]) {
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ws + g * gb + at));
    const __m512i sc = Signed ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512i dot = Shift > 0 ? _mm512_srai_epi32(ia[g][t], Shift) : ia[g][t];
      isum[g][t] = _mm512_add_epi32(isum[g][t], _mm512_mullo_epi32(dot, sc));
    }
  }
}

// isum[g][t] += sc[j] * (the dots of sub-block j = 2 * pair + Odd's unsigned
// Q4_K/Q5_K quants with token t's activation quants).
template <KType KT, bool Odd, int G, int T>
RP_INLINE void k_affine_block(const uint8_t* ws, size_t gb, int pair, const XBlock* xb, __m512i (&isum)[G][T]) {
  const int j = 2 * pair + (Odd ? 1 : 0);
  __m512i ia[G][T];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) ia[g][t] = _mm512_setzero_si512();
  [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          __m512i wv[G];
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) wv[g] = k_affine_chunk<KT, Odd, C>(ws + g * gb, pair);
          dot_chunk_k<G, T>(ia, wv, xb, C);
        }(),
        ...);
  }(std::make_integer_sequence<int, 8>{});
  add_scaled_dots<false, kOddShift<KT, Odd>>(ws, gb, kQ4KScales + j * 16, ia, isum);
}

// Both sub-blocks of pair `pair` (k_affine_block for 2 * pair, then for
// 2 * pair + 1) in one pass: each chunk's bytes are loaded once and split
// into both sub-blocks' quants, where k_affine_block loads them once per
// sub-block. Tiles of at most 4 groups x tokens take it (the decode tile's
// 4 x 1 among them; wider ones would spill its twice as many integer sums):
// Q4_K decode from L3 1.2x, from memory ~1.1x (docs/performance.md, K types
// from memory). Same integer sums. Q4_K only: Q5_K's sub-blocks have lines
// of their own (q5k_chunk), read by k_affine_block front to back.
template <KType KT, int G, int T>
RP_INLINE void k_affine_pair(const uint8_t* ws, size_t gb, int pair, const XBlock* xe, const XBlock* xo,
                             __m512i (&isum)[G][T]) {
  __m512i ie[G][T], io[G][T];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) ie[g][t] = io[g][t] = _mm512_setzero_si512();
  [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          __m512i we[G], wo[G];
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) {
            const uint8_t* sec = ws + g * gb;
            const __m512i v = _mm512_loadu_si512(q4k_nibbles_at<C>(sec, pair));
            we[g] = q4k_quants<false>(v);
            wo[g] = q4k_quants<true>(v);
          }
          dot_chunk_k<G, T>(ie, we, xe, C);
          dot_chunk_k<G, T>(io, wo, xo, C);
        }(),
        ...);
  }(std::make_integer_sequence<int, 8>{});
  add_scaled_dots<false, 0>(ws, gb, kQ4KScales + 2 * pair * 16, ie, isum);
  add_scaled_dots<false, kOddShift<KT, true>>(ws, gb, kQ4KScales + (2 * pair + 1) * 16, io, isum);
}

// Q6_K wide (a prompt's widened scratch): isum[g][t] += sc (the group's 16
// signed scales of this half of block j = 2 * pair + Odd) * (the dots of
// chunks C0..C0+3 of its u quants with the activations - 32 * their sum).
template <KType KT, bool Odd, int C0, int G, int T>
RP_INLINE void q6k_half(const uint8_t* ws, size_t gb, int pair, const XBlock* xb, __m512i (&isum)[G][T]) {
  static_assert(KT == KType::Q6KWide);
  const int j = 2 * pair + (Odd ? 1 : 0);
  __m512i ia[G][T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m512i c = _mm512_set1_epi32(-32 * (C0 == 0 ? xb[t].sum_lo : xb[t].sum_hi));
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) ia[g][t] = c;
  }
  [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          __m512i wv[G];
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) wv[g] = k_affine_chunk<KT, Odd, C0 + C>(ws + g * gb, pair);
          dot_chunk_k<G, T>(ia, wv, xb, C0 + C);
        }(),
        ...);
  }(std::make_integer_sequence<int, 4>{});
  add_scaled_dots<true, 0>(ws, gb, 64 + (2 * j + C0 / 4) * 16, ia, isum);
}

// Q6_K pair `pair`'s halves First..First + N - 1 (0: the even sub-block's
// chunks 0-3, 1: its chunks 4-7, 2: the odd one's 0-3, 3: its 4-7, read as
// 4 * u) in one pass over the pair's quads, front to back: each quad's
// lines are loaded once a pass and give one chunk of each half, N
// independent vpdpbusd chains side by side. Read half by half (four passes
// over lines at a 192-byte stride) the same bytes decoded 1.11-1.28x slower
// from L3 and memory. Same integer sums.
template <int First, int N, int G, int T>
RP_INLINE void q6k_halves(const uint8_t* ws, size_t gb, int pair, const XBlock* xe, const XBlock* xo,
                          __m512i (&isum)[G][T]) {
  constexpr int kSelect = 0xE4;  // operand 1 where operand 3 is set, else operand 2
  constexpr bool kNeedC = First + N > 2;
  const XBlock* xh[4] = {xe, xe, xo, xo};
  __m512i ia[N][G][T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 4
    for (int n = 0; n < N; ++n) {
      const int h = First + n;
      const __m512i c = _mm512_set1_epi32(-(h == 3 ? 128 : 32) * (h % 2 == 0 ? xh[h][t].sum_lo : xh[h][t].sum_hi));
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) ia[n][g][t] = c;
    }
  const __m512i six = _mm512_set1_epi8(0x3f);
  [&]<int... Q>(std::integer_sequence<int, Q...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          __m512i w[N][G];
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) {
            const uint8_t* sec = ws + g * gb;
            __m512i a = _mm512_loadu_si512(sec + q6k_line_at(pair, Q, 0));
            __m512i b = _mm512_loadu_si512(sec + q6k_line_at(pair, Q, 1));
            __m512i c = kNeedC ? _mm512_loadu_si512(sec + q6k_line_at(pair, Q, 2)) : _mm512_setzero_si512();
            // The fourth half combines all three lines, which the other
            // halves use too: on a single token each line is loaded once
            // (loaded_once; BM_Matmul Q6_K decode 1.07-1.13x; two tokens
            // measured 0.95x with it).
            if constexpr (T == 1 && First + N > 3) {
              a = loaded_once(a);
              b = loaded_once(b);
              c = loaded_once(c);
            }
#pragma GCC unroll 4
            for (int n = 0; n < N; ++n) {
              const int h = First + n;
              if (h < 3) {
                w[n][g] = _mm512_and_si512(h == 0 ? a : h == 1 ? b : c, six);
              } else {
                const __m512i ab = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4), _mm512_srli_epi16(b, 2),
                                                             _mm512_set1_epi8(0x0c), kSelect);
                w[n][g] = _mm512_ternarylogic_epi32(
                    ab, _mm512_and_si512(c, _mm512_set1_epi8(static_cast<char>(0xc0))), _mm512_set1_epi8(0x3c),
                    kSelect);
              }
            }
          }
#pragma GCC unroll 4
          for (int n = 0; n < N; ++n) dot_chunk_k<G, T>(ia[n], w[n], xh[First + n], (First + n) % 2 ? 4 + Q : Q);
        }(),
        ...);
  }(std::make_integer_sequence<int, 4>{});
#pragma GCC unroll 4
  for (int n = 0; n < N; ++n) {
    const int h = First + n;
    const int j = 2 * pair + h / 2;
    if (h == 3) add_scaled_dots<true, 2>(ws, gb, 64 + (2 * j + 1) * 16, ia[n], isum);
    else add_scaled_dots<true, 0>(ws, gb, 64 + (2 * j + h % 2) * 16, ia[n], isum);
  }
}

// isum[g][t] += sc[j] (signed) * (the dots of IQ4_XS sub-block j's table
// values with token t's activation quants): looked up as value + 128, so each
// dot starts from -128 * the activations' sum.
template <int G, int T>
RP_INLINE void iq4xs_block(const uint8_t* ws, size_t gb, int j, const XBlock* xb, __m512i (&isum)[G][T]) {
  __m512i ia[G][T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m512i c = _mm512_set1_epi32(-128 * (xb[t].sum_lo + xb[t].sum_hi));
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) ia[g][t] = c;
  }
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          __m512i wv[G];
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g)
            wv[g] = _mm512_shuffle_epi8(
                iq4nl_table(), _mm512_and_si512(_mm512_loadu_si512(ws + g * gb + kIq4XsNibbles + j * 256 + C * 64), nibble));
          dot_chunk_k<G, T>(ia, wv, xb, C);
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g)
            wv[g] = _mm512_shuffle_epi8(
                iq4nl_table(),
                _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(ws + g * gb + kIq4XsNibbles + j * 256 + C * 64), 4),
                                 nibble));
          dot_chunk_k<G, T>(ia, wv, xb, 4 + C);
        }(),
        ...);
  }(std::make_integer_sequence<int, 4>{});
  add_scaled_dots<true, 0>(ws, gb, kIq4XsScales + j * 16, ia, isum);
}

// isum[g][t] += sc[k] * (the dots of Q2_K sub-block k = 8h + 2S + b's quants
// with token t's activations, xb the block 4h + S, its half b). The quants
// are read in place as 4^S * q (masked, not shifted: shifts issue only on
// port 0, beside vpdpbusd); the dots are divided by 4^S (exactly) once.
template <int S, int G, int T>
RP_INLINE void q2k_sub_block(const uint8_t* ws, size_t gb, int quad, const XBlock* xb, __m512i (&isum)[G][T]) {
  const int h = quad / 2, b = quad % 2, k = 8 * h + 2 * S + b;
  __m512i ia[G][T];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) ia[g][t] = _mm512_setzero_si512();
  const __m512i mask = _mm512_set1_epi8(static_cast<char>(3 << (2 * S)));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    __m512i wv[G];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
      wv[g] = _mm512_and_si512(_mm512_loadu_si512(ws + g * gb + q2k_line_at(quad, c)), mask);
    dot_chunk_k<G, T>(ia, wv, xb, 4 * b + c);
  }
  add_scaled_dots<false, 2 * S>(ws, gb, q2k_scales_at(k), ia, isum);
}

// isum[g][t] += sc[k] * (the dots of Q3_K sub-block k = 2m + Odd's quants q =
// u - 4 with token t's activations, xb the block m, its half Odd), from the
// pair's three lines (kernels_impl.h). Odd sub-blocks' chunks are read in
// place as 8u (a mask each; bits 3-5), their dots divided by 8 (exactly)
// once; both chunk 3s are gathered from the lines' bits 6-7 with two 16-bit
// shifts (what crosses a byte is masked off), a select and a mask.
template <bool Odd, int G, int T>
RP_INLINE void q3k_sub_block(const uint8_t* ws, size_t gb, int m, const XBlock* xb, __m512i (&isum)[G][T]) {
  constexpr int kShift = Odd ? 3 : 0;
  __m512i ia[G][T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m512i start = _mm512_set1_epi32(-(4 << kShift) * (Odd ? xb[t].sum_hi : xb[t].sum_lo));
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) ia[g][t] = start;
  }
  auto line = [&](int g, int l) RP_INLINE_LAMBDA { return _mm512_loadu_si512(ws + g * gb + q3k_line_at(m, l)); };
  const __m512i field = _mm512_set1_epi8(static_cast<char>(7 << kShift));
#pragma GCC unroll 4
  for (int c = 0; c < 3; ++c) {
    __m512i wv[G];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) wv[g] = _mm512_and_si512(line(g, c), field);
    dot_chunk_k<G, T>(ia, wv, xb, 4 * Odd + c);
  }
  __m512i wv[G];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g) {
    // Even: A bits 6-7 to bits 0-1, B bit 6 to bit 2. Odd: B bit 7 to bit
    // 3, C bits 6-7 to bits 4-5.
    const __m512i lo = Odd ? _mm512_srli_epi16(line(g, 1), 4) : _mm512_srli_epi16(line(g, 0), 6);
    const __m512i hi = Odd ? _mm512_srli_epi16(line(g, 2), 2) : _mm512_srli_epi16(line(g, 1), 4);
    const __m512i lo_bits = _mm512_set1_epi8(static_cast<char>(Odd ? 0x08 : 0x03));
    wv[g] = _mm512_and_si512(_mm512_ternarylogic_epi32(lo, hi, lo_bits, 0xe4), field);  // lo_bits ? lo : hi
  }
  dot_chunk_k<G, T>(ia, wv, xb, 4 * Odd + 3);
  add_scaled_dots<true, kShift>(ws, gb, kQ3KScales + (2 * m + Odd) * 16, ia, isum);
}

// Q6_K tiles of at most this many outputs (groups x tokens: decode's 1 x 1
// and 2 x 1) read a pair's four halves in one pass (q6k_halves), larger
// ones in two (their accumulators would spill): against the half-by-half
// order, one pass decoded 1.04x from L2, 1.09x from L3 and 1.33x from
// memory (one thread); two passes for 2-4 tokens 0.97-1.01x from L2.
constexpr int kQ6KOnePassOutputs = 2;

// Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS weights against Q8_K activations
// (rule in kernels_impl.h): the sub-blocks add up in integers, and each
// super-block costs two (Q3_K, Q6_K, IQ4_XS: one) float updates per output.
// kNext: requests the next tile's weights (requests_next_groups).
template <KType KT, int G, int T, bool kNext = false>
void tile_k(const MatmulArgs& a, int64_t g0, int64_t t0) {
  constexpr size_t kSec = kSection<KT>;
  constexpr bool kAffine = KT == KType::Q4K || KT == KType::Q5K;
  // Types with mins: Q4_K/Q5_K's per sub-block pair, Q2_K's per block.
  constexpr bool kMins = kAffine || KT == KType::Q2K;
  constexpr int kMinWords = KT == KType::Q2K ? 8 : 4;
  constexpr size_t kMinsAt = KT == KType::Q2K ? kQ2KMins : kQ4KMins;
  const uint8_t* w = a.w + g0 * a.group_stride;
  const XBlock* x = static_cast<const XBlock*>(a.x) + x_offset(a.t0 + t0, 0, a.x_tile, a.x_k);
  const size_t gb = a.group_stride, us = a.unit_stride;
  const int64_t xs = a.x_tile;
  // The float accumulators change once per super-block: they wait in memory
  // (the barrier below keeps the compiler from holding them in registers),
  // which leaves the registers to the integer sums; in registers they made
  // the compiler spill inside the block loop.
  alignas(64) float acc_mem[G][T][kGroupRows];
  park_acc<G, T>(a, g0, t0, acc_mem);
  for (int64_t s = a.k_begin / kQK_K; s < a.k_end / kQK_K; ++s) {
    asm volatile("" : : "r"(acc_mem) : "memory");
    const uint8_t* ws = w + s * us;
    const XBlock* xsec = x + s * 8 * xs;
    __m512i isum[G][T];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) isum[g][t] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      if (a.prefetch > 0) prefetch_share_at<G, kSec, 4>(ws, gb, us, g0, p, a.prefetch);
      if constexpr (kNext) prefetch_next_groups<G, kSec, 4>(a, g0, s * us, p);
      if constexpr (KT == KType::Q4K && G * T <= 4) {  // the pair's sums fit in registers (k_affine_pair)
        k_affine_pair<KT, G, T>(ws, gb, p, xsec + 2 * p * xs, xsec + (2 * p + 1) * xs, isum);
      } else if constexpr (kAffine) {
        k_affine_block<KT, false, G, T>(ws, gb, p, xsec + 2 * p * xs, isum);
        k_affine_block<KT, true, G, T>(ws, gb, p, xsec + (2 * p + 1) * xs, isum);
      } else if constexpr (KT == KType::IQ4XS) {
        iq4xs_block<G, T>(ws, gb, 2 * p, xsec + 2 * p * xs, isum);
        iq4xs_block<G, T>(ws, gb, 2 * p + 1, xsec + (2 * p + 1) * xs, isum);
      } else if constexpr (KT == KType::Q2K) {
        // Quad p = 2h + b: sub-blocks 8h + 2S + b, activation blocks 4h + S.
        const XBlock* xq = xsec + 4 * (p / 2) * xs;
        q2k_sub_block<0, G, T>(ws, gb, p, xq, isum);
        q2k_sub_block<1, G, T>(ws, gb, p, xq + xs, isum);
        q2k_sub_block<2, G, T>(ws, gb, p, xq + 2 * xs, isum);
        q2k_sub_block<3, G, T>(ws, gb, p, xq + 3 * xs, isum);
      } else if constexpr (KT == KType::Q3K) {
        // Sub-block pairs 2p and 2p + 1 (activation blocks 2p, 2p + 1).
        for (int m = 2 * p; m < 2 * p + 2; ++m) {
          q3k_sub_block<false, G, T>(ws, gb, m, xsec + m * xs, isum);
          q3k_sub_block<true, G, T>(ws, gb, m, xsec + m * xs, isum);
        }
      } else if constexpr (KT == KType::Q6K && G * T <= kQ6KOnePassOutputs) {
        q6k_halves<0, 4, G, T>(ws, gb, p, xsec + 2 * p * xs, xsec + (2 * p + 1) * xs, isum);
      } else if constexpr (KT == KType::Q6K) {
        q6k_halves<0, 2, G, T>(ws, gb, p, xsec + 2 * p * xs, xsec + (2 * p + 1) * xs, isum);
        q6k_halves<2, 2, G, T>(ws, gb, p, xsec + 2 * p * xs, xsec + (2 * p + 1) * xs, isum);
      } else {
        q6k_half<KT, false, 0, G, T>(ws, gb, p, xsec + 2 * p * xs, isum);
        q6k_half<KT, false, 4, G, T>(ws, gb, p, xsec + 2 * p * xs, isum);
        q6k_half<KT, true, 0, G, T>(ws, gb, p, xsec + (2 * p + 1) * xs, isum);
        q6k_half<KT, true, 4, G, T>(ws, gb, p, xsec + (2 * p + 1) * xs, isum);
      }
    }
    int32_t npair[T][kMinWords];
    if constexpr (kMins) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        for (int p = 0; p < kMinWords; ++p)
          npair[t][p] = KT == KType::Q2K ? neg_xsum_halves(xsec[p * xs + t])
                                         : neg_xsum_pair(xsec[2 * p * xs + t], xsec[(2 * p + 1) * xs + t]);
    }
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      const uint8_t* sec = ws + g * gb;
      const __m512 d = _mm512_loadu_ps(sec);
      __m512 acc[T];
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t)
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xsec[t].d)), _mm512_cvtepi32_ps(isum[g][t]),
                                 _mm512_load_ps(acc_mem[g][t]));
      if constexpr (kMins) {
        __m512i msum[T];
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) msum[t] = _mm512_setzero_si512();
        for (int p = 0; p < kMinWords; ++p) {
          const __m512i m =
              _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sec + kMinsAt + p * 32)));
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) msum[t] = _mm512_dpwssd_epi32(msum[t], m, _mm512_set1_epi32(npair[t][p]));
        }
        const __m512 dmin = _mm512_loadu_ps(sec + 64);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t)
          acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dmin, _mm512_set1_ps(xsec[t].d)), _mm512_cvtepi32_ps(msum[t]),
                                   acc[t]);
      }
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) _mm512_store_ps(acc_mem[g][t], acc[t]);
    }
  }
  store_parked<G, T>(a, g0, t0, acc_mem);
}

template <FType W>
struct FKernel {
  template <int G, int T>
  struct K {
    static void run(const MatmulArgs& a, int64_t g0, int64_t t0) {
      if constexpr (T > 1)
        if (requests_next_groups<G>(a, g0, t0)) return tile_f<W, G, T, true>(a, g0, t0);
      tile_f<W, G, T>(a, g0, t0);
    }
  };
};
template <QType Q>
struct QKernel {
  template <int G, int T>
  struct K {
    static void run(const MatmulArgs& a, int64_t g0, int64_t t0) {
      // Q8_0's single-token tile with a run-time prefetch branch in its
      // chunk loop ran 7 % slower with the prefetch off, from the branch
      // alone (session 24), so it is compiled both ways. Whether its decode
      // prefetches is the tuner's call: 2 rows ahead measured 1.17-1.28x
      // none while the host's memory was slow, 0.97x while it was fast
      // (session 27); before, this tile never prefetched.
      if constexpr (T > 1)
        if (requests_next_groups<G>(a, g0, t0)) return tile_q<Q, G, T, true, true>(a, g0, t0);
      if constexpr (Q == QType::Q8_0) {
        if (a.prefetch > 0) tile_q<Q, G, T, true>(a, g0, t0);
        else tile_q<Q, G, T, false>(a, g0, t0);
      } else {
        tile_q<Q, G, T>(a, g0, t0);
      }
    }
  };
};

// Groups per region row of Q8_0's region layout (IsaKernels::regions_q8_0),
// read by its decode tile and by tile_q_rows.
constexpr int kRowGroupsQ = 8;

// Q8_0: QKernel's tiles, and tile_q_rows for small batches' whole region
// rows (run_tiles_rows).
struct Q8RowsKernel {
  template <int G, int T>
  struct K {
    static void run(const MatmulArgs& a, int64_t g0, int64_t t0) {
      if constexpr (T > 1 && G == kRowGroupsQ) tile_q_rows<QType::Q8_0, G, T>(a, g0, t0);
      else QKernel<QType::Q8_0>::K<G, T>::run(a, g0, t0);
    }
  };
};

template <KType KT>
struct KKernel {
  template <int G, int T>
  struct K {
    static void run(const MatmulArgs& a, int64_t g0, int64_t t0) {
      if constexpr (T > 1)
        if (requests_next_groups<G>(a, g0, t0)) return tile_k<KT, G, T, true>(a, g0, t0);
      tile_k<KT, G, T>(a, g0, t0);
    }
  };
};

constexpr int kTileF = 6;   // 4 groups x 6 tokens = 24 accumulators
constexpr int kTileQ = 6;   // 2 groups x 6 tokens: 12 float + 12 integer accumulators
// Groups per decode tile: 8 weight streams at once for the F and 32-block Q
// types; the K types' integer sums per group take more registers.
constexpr int kDecodeGroupsFQ = 8;
constexpr int kDecodeGroupsK = 4;
// The F types' decode streams (IsaKernels::regions_f, regions_f_long): a
// matrix of up to 4 MiB is dealt to 4 regions, read by the 4-group decode
// tile, so a thread's share of a short product is 4 streams, which start
// faster after each dispatch than 8; larger matrices keep 8 (session 25's
// one per group of the 8-group tile), which read long shares faster
// (session 28: the 60M F16 model's 0.5-1.6 MB products read 8-10 % faster
// with 4 in BM_DecodeSequence, but the 534 MB model's 8 MB ones lost 3 %).
constexpr int kRegionsF = 4;
constexpr int kRegionsFLong = kDecodeGroupsFQ;
// Small batches' remainder tiles (run_tiles_small) read whole interleaved
// rows where the registers allow: F types 8 groups x up to 2 tokens (x2:
// 1.15x paired), K types 4 groups x up to 4 tokens (Q4_K x2 1.30x, x4
// 1.12x; Q3_K up to 2 tokens). Not for Q6_K (4 x 2 measured 0.97x) nor
// the 32-element block types (4 x 2: 1.01-1.03x, within noise).

// Decode is bound by memory: a tile of 8 groups reads their interleaved
// super-group as one stream (8 separate streams read ~40 % faster than 4 on
// the Ice Lake VM, and one interleaved stream faster still on Zen 5).
void matmul_f32(const MatmulArgs& a) { run_tiles_small<FKernel<FType::F32>::K, 4, kTileF, kDecodeGroupsFQ, 2, kDecodeGroupsFQ, 4, 1>(a); }
void matmul_f16(const MatmulArgs& a) { run_tiles_small<FKernel<FType::F16>::K, 4, kTileF, kDecodeGroupsFQ, 2, kDecodeGroupsFQ, 4, 1>(a); }
void matmul_bf16(const MatmulArgs& a) { run_tiles_small<FKernel<FType::BF16>::K, 4, kTileF, kDecodeGroupsFQ, 2, kDecodeGroupsFQ, 4, 1>(a); }
void matmul_q8_0(const MatmulArgs& a) { run_tiles_rows<Q8RowsKernel::K, 2, kTileQ, kRowGroupsQ, kDecodeGroupsFQ, 4, 1>(a); }
void matmul_q4_0(const MatmulArgs& a) { run_tiles<QKernel<QType::Q4_0>::K, 2, kTileQ, kDecodeGroupsFQ, 4, 1>(a); }
void matmul_q4_1(const MatmulArgs& a) { run_tiles<QKernel<QType::Q4_1>::K, 2, kTileQ, kDecodeGroupsFQ, 4, 1>(a); }
void matmul_q5_0(const MatmulArgs& a) { run_tiles<QKernel<QType::Q5_0>::K, 2, kTileQ, kDecodeGroupsFQ, 4, 1>(a); }
void matmul_q5_1(const MatmulArgs& a) { run_tiles<QKernel<QType::Q5_1>::K, 2, kTileQ, kDecodeGroupsFQ, 4, 1>(a); }
// K types: 2 groups x 6 tokens (Q6_K: x 4, its two halves hold 3 register
// sets; Q3_K: x 4, its masks and per-token starts spilled the 6-token tile,
// paired pp32 on the 60M shape 1.16x that tile); decode 4 groups (one interleaved stream), not 8: the integer sums per
// super-block take registers the 8-group tile then spills (paired tg256,
// 60M: Q4_K 1.026x, Q5_K 1.079x, Q6_K 1.065x the 8-group tile).
// Q6_K and Q3_K decode read one group at a time: in the contiguous layout
// (IsaKernels::interleave_q6_k) each tile is then one sequential stream,
// which memory serves faster than the 4-group tile's interleaved runs of
// low- and high-bit lines (docs/performance.md, Q6_K and Q3_K decode read
// one stream). Other layouts (REPRISE_INTERLEAVE, REPRISE_REGIONS) keep the
// 4-group tile.
bool contiguous_groups(const MatmulArgs& a) { return a.layout.interleave <= 1 && a.layout.regions <= 1; }
void matmul_q2_k(const MatmulArgs& a) { run_tiles_small<KKernel<KType::Q2K>::K, 2, 6, kDecodeGroupsK, 4, kDecodeGroupsK, 1>(a); }
void matmul_q3_k(const MatmulArgs& a) {
  if (!contiguous_groups(a)) return run_tiles_small<KKernel<KType::Q3K>::K, 2, 4, kDecodeGroupsK, 2, kDecodeGroupsK, 1>(a);
  run_tiles_small<KKernel<KType::Q3K>::K, 2, 4, kDecodeGroupsK, 2, 1>(a);
}
// Q4_K batches of 6 or more tokens take 4 groups x 3 tokens (the same 24
// integer sums as 2 x 6, half the activation broadcasts per vpdpbusd). One
// thread, both builds at once (scripts/ab_kernels.py, medians of 6 and 8
// rounds): 6 tokens 1.14x / 1.16x, 8 tokens 1.13x / 1.16x, 12 tokens
// 1.07x / 1.09x, a 512-token prompt 1.05x / 1.03x. End to end, paired
// across builds, within this host's +-3 %: pp512 0.99-1.03x, pp16 1.01x, 8
// sequences decoding 1.02-1.03x. Smaller batches keep 2 x 6's path, whose
// 4 x 4 and 4 x 2 tiles read whole interleaved rows (4 sequences through
// 4 x 3 then 4 x 1 measured 0.915x). Q5_K, IQ4_XS and Q2_K lost with 4 x 3
// (Q5_K 0.94x at the kernel). Same bits (MatmulTest tiles every batch size
// against single tokens).
void matmul_q4_k(const MatmulArgs& a) {
  if (a.n_tokens >= 6) return run_tiles_small<KKernel<KType::Q4K>::K, 4, 3, kDecodeGroupsK, 4, kDecodeGroupsK, 1>(a);
  run_tiles_small<KKernel<KType::Q4K>::K, 2, 6, kDecodeGroupsK, 4, kDecodeGroupsK, 1>(a);
}
// Q5_K: small batches of 2 on the 4-group tile, 3 and 4 on the 2-group one
// (the 4 x 3 tile spilled its five-line chunks: 0.77x at the kernel, 2 x 3
// 1.05x, against the former layout's 4 x 3).
void matmul_q5_k(const MatmulArgs& a) { run_tiles_small<KKernel<KType::Q5K>::K, 2, 6, kDecodeGroupsK, 2, kDecodeGroupsK, 1>(a); }
void matmul_q6_k(const MatmulArgs& a) {
  if (!contiguous_groups(a)) return run_tiles<KKernel<KType::Q6K>::K, 2, 4, kDecodeGroupsK, 1>(a);
  run_tiles<KKernel<KType::Q6K>::K, 2, 4, 1>(a);
}
void matmul_q6_k_wide(const MatmulArgs& a) { run_tiles<KKernel<KType::Q6KWide>::K, 2, 4, 8, 4, 1>(a); }
void matmul_iq4_nl(const MatmulArgs& a) { run_tiles<QKernel<QType::IQ4NL>::K, 2, kTileQ, kDecodeGroupsFQ, 4, 1>(a); }
void matmul_iq4_xs(const MatmulArgs& a) { run_tiles_small<KKernel<KType::IQ4XS>::K, 2, 6, kDecodeGroupsK, 4, kDecodeGroupsK, 1>(a); }

// r[i][j] <- r[j][i] for a 16 x 16 block.
RP_INLINE void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xdd);
  }
}

// ---------------------------------------------------------------------------
// Batched attention (see AttnArgs). Scores run with keys across lanes, but
// each (query, key) score is the same operation tree as the per-key score
// in kernels.cpp (Attention): four 8-lane accumulator chains over 32-element steps, then
// ((c0 + c1) + (c2 + c3)), lanes l + l+4, then (w0 + w1) + (w2 + w3).

// glibc's expf, 8 lanes in double precision (same operations as expf_exact4
// in kernels.cpp).
RP_INLINE __m256 expf_exact_half(__m256 x) {
  namespace g = glibc_expf;
  const __m512d xd = _mm512_cvtps_pd(x);
  const __m512d z = _mm512_mul_pd(xd, _mm512_set1_pd(g::kInvLn2N));
  __m512d kd = _mm512_add_pd(z, _mm512_set1_pd(g::kShift));
  const __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, _mm512_set1_pd(g::kShift));
  const __m512d r = _mm512_sub_pd(z, kd);
  const __m512i* tab = reinterpret_cast<const __m512i*>(g::kTable);
  const __m512i lo = _mm512_permutex2var_epi64(_mm512_loadu_si512(tab), ki, _mm512_loadu_si512(tab + 1));
  const __m512i hi = _mm512_permutex2var_epi64(_mm512_loadu_si512(tab + 2), ki, _mm512_loadu_si512(tab + 3));
  __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
  t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
  const __m512d s = _mm512_castsi512_pd(t);
  const __m512d zz = _mm512_fmadd_pd(_mm512_set1_pd(g::kC0), r, _mm512_set1_pd(g::kC1));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(g::kC2), r, _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(zz, r2, y);
  y = _mm512_mul_pd(y, s);
  return _mm512_cvtpd_ps(y);
}

RP_INLINE __m512 expf_exact16(__m512 x) {
  namespace g = glibc_expf;
  __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(expf_exact_half(_mm512_castps512_ps256(x))),
                                expf_exact_half(_mm512_extractf32x8_ps(x, 1)), 1);
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(g::kOverflow), _CMP_GT_OQ), _mm512_set1_ps(__builtin_inff()));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(g::kUnderflow), _CMP_LT_OQ), _mm512_setzero_ps());
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_add_ps(x, x));
}

RP_INLINE __m512 round_h16(__m512 v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }

// Chains at dims 32 s + off for R queries x C key blocks.
template <int R, int C, int S>
RP_INLINE void score_chains(const float* const* q, const float* const* kt, int off, __m512 (&acc)[R][C]) {
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s) {
    const int64_t dim = 32 * s + off;
    __m512 kv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) kv[c] = _mm512_loadu_ps(kt[c] + dim * 16);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 qb = _mm512_set1_ps(q[r][dim]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(qb, kv[c], acc[r][c]);
    }
  }
}

// u_l = (chain(l) + chain(8 + l)) + (chain(16 + l) + chain(24 + l))
template <int R, int C, int S>
RP_INLINE void score_u(const float* const* q, const float* const* kt, int l, __m512 (&u)[R][C]) {
  __m512 a[R][C], b[R][C];
  score_chains<R, C, S>(q, kt, l, a);
  score_chains<R, C, S>(q, kt, 8 + l, b);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) a[r][c] = _mm512_add_ps(a[r][c], b[r][c]);
  __m512 x[R][C], y[R][C];
  score_chains<R, C, S>(q, kt, 16 + l, x);
  score_chains<R, C, S>(q, kt, 24 + l, y);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) u[r][c] = _mm512_add_ps(a[r][c], _mm512_add_ps(x[r][c], y[r][c]));
}

template <int R, int C, int S>
RP_INLINE void score_w(const float* const* q, const float* const* kt, int l, __m512 (&w)[R][C]) {
  __m512 lo[R][C], hi[R][C];
  score_u<R, C, S>(q, kt, l, lo);
  score_u<R, C, S>(q, kt, l + 4, hi);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) w[r][c] = _mm512_add_ps(lo[r][c], hi[r][c]);
}

// Not inlined: the caller keeps its value accumulators in registers around
// the call rather than interleaving them with the score chains. The loop over
// l is kept rolled so the compiler schedules 8 chains per (query, block) at a
// time instead of all 32 (which spills).
template <int R, int C, int S>
__attribute__((noinline)) void score_tile(const float* const* q, const float* const* kt, float scale,
                                          float (*out)[32]) {
  __m512 w[4][R][C];
#pragma GCC unroll 1
  for (int l = 0; l < 4; ++l) score_w<R, C, S>(q, kt, l, w[l]);
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      _mm512_storeu_ps(out[r] + 16 * c,
                       _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(w[0][r][c], w[1][r][c]),
                                                   _mm512_add_ps(w[2][r][c], w[3][r][c])),
                                     sc));
}

// Per query and 32-key step: which keys count, which set a new running
// maximum, and the exponential each needs. The sequential rule ("s > m: new
// maximum") is evaluated with an exclusive prefix maximum, which selects the
// same values, and the exponentials are the same function of the same
// arguments as in the per-query path.
struct KeyPlan {
  alignas(64) float e[32];
  uint32_t valid;
  uint32_t is_new;
};

template <int K>
RP_INLINE __m512 shift_lanes(__m512 v, __m512 fill) {
  return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v), _mm512_castps_si512(fill), 16 - K));
}

// One vector of 16 keys at p0 (lanes < nk counted); m is the running maximum
// before them and is updated.
RP_INLINE void plan16(const float* sc, int nk, int64_t p0, int64_t first, int64_t end, float& m, float* e,
                      uint32_t& valid_out, uint32_t& new_out) {
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Positions relative to p0 fit in 32 bits.
  const __m512i rel_first = _mm512_set1_epi32(static_cast<int>(first - p0 < -1 ? -1 : (first - p0 > 16 ? 16 : first - p0)));
  const __m512i rel_end = _mm512_set1_epi32(static_cast<int>(end - p0 > 16 ? 16 : (end - p0 < 0 ? 0 : end - p0)));
  __mmask16 valid = _mm512_cmpge_epi32_mask(lane, rel_first) & _mm512_cmplt_epi32_mask(lane, rel_end) &
                    _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(nk));
  valid_out = valid;
  new_out = 0;
  if (!valid) {
    _mm512_store_ps(e, _mm512_setzero_ps());
    return;
  }
  const __m512 s = _mm512_loadu_ps(sc);
  __m512 incl = _mm512_mask_blend_ps(valid, ninf, s);
  incl = _mm512_max_ps(incl, shift_lanes<1>(incl, ninf));
  incl = _mm512_max_ps(incl, shift_lanes<2>(incl, ninf));
  incl = _mm512_max_ps(incl, shift_lanes<4>(incl, ninf));
  incl = _mm512_max_ps(incl, shift_lanes<8>(incl, ninf));
  const __m512 mv = _mm512_set1_ps(m);
  const __m512 excl = _mm512_max_ps(shift_lanes<1>(incl, ninf), mv);
  const __mmask16 is_new = _mm512_cmp_ps_mask(s, excl, _CMP_GT_OQ) & valid;
  new_out = is_new;
  const __m512 arg = _mm512_maskz_mov_ps(
      valid, _mm512_mask_blend_ps(is_new, _mm512_sub_ps(s, excl), _mm512_sub_ps(excl, s)));
  _mm512_store_ps(e, expf_exact16(arg));
  // Running maximum after these keys: max(m, valid scores).
  alignas(64) float tmp[16];
  _mm512_store_ps(tmp, incl);
  m = tmp[15] > m ? tmp[15] : m;
}

RP_INLINE void plan_keys(KeyPlan& kp, float& m, const float* sc, int nk, int64_t p0, int64_t first, int64_t end) {
  uint32_t v0, n0, v1 = 0, n1 = 0;
  plan16(sc, nk, p0, first, end, m, kp.e, v0, n0);
  if (nk > 16) plan16(sc + 16, nk - 16, p0 + 16, first, end, m, kp.e + 16, v1, n1);
  kp.valid = v0 | (v1 << 16);
  kp.is_new = n0 | (n1 << 16);
}

// Up to kMaxQ queries of head size 16 * DC. Each 32-key step scores every
// query while the step's K block is in L1, then updates the f16 value
// accumulators QG queries at a time (their serial rounding chains overlap);
// between steps the accumulators live in L1.
constexpr int kMaxQ = 16;

// Masked: head sizes below 16 (DC = 1); value rows are a.d floats apart and
// are read with a lane mask, so the accumulator's unused lanes stay zero.
template <bool Masked>
RP_INLINE __m512 load_value(const float* p, __mmask16 lanes) {
  if constexpr (Masked) return _mm512_maskz_loadu_ps(lanes, p);
  else return _mm512_loadu_ps(p);
}

template <int DC, int QG, bool Masked = false>
RP_INLINE void update_values(int r0, int nr, int nk, int64_t p0, const AttnArgs& a, const float (*sc)[32],
                             const KeyPlan* plan, float* s, float (*acc_mem)[16 * DC]) {
  static_assert(!Masked || DC == 1);
  const int64_t d = Masked ? a.d : 16 * DC;
  const __mmask16 lanes = Masked ? static_cast<__mmask16>((1u << a.d) - 1) : static_cast<__mmask16>(0xffff);
  __m512 acc[QG][DC];
#pragma GCC unroll 4
  for (int r = 0; r < QG; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c)
      acc[r][c] = r < nr ? _mm512_load_ps(acc_mem[r0 + r] + 16 * c) : _mm512_setzero_ps();
  float sr[QG];
#pragma GCC unroll 4
  for (int r = 0; r < QG; ++r) sr[r] = r < nr ? s[r0 + r] : 0.0f;
  // Keys where every query of the group takes the key and none sets a new
  // maximum (ms = 1, so S = fma(S, 1, vs) = S + vs), the common case, run
  // branch-free; the others check each query.
  uint32_t common = nr == QG ? (nk == 32 ? 0xffffffffu : (1u << nk) - 1) : 0;
#pragma GCC unroll 4
  for (int r = 0; r < QG; ++r)
    if (r < nr) common &= plan[r0 + r].valid & ~plan[r0 + r].is_new;
  for (int j = 0; j < nk; ++j) {
    const float* vr = a.v + (p0 + j - a.base) * d;
    if (common >> j & 1) {
      __m512 vv[DC];
#pragma GCC unroll 16
      for (int c = 0; c < DC; ++c) vv[c] = load_value<Masked>(vr + 16 * c, lanes);
#pragma GCC unroll 4
      for (int r = 0; r < QG; ++r) {
        const float e = plan[r0 + r].e[j];
        const __m512 ev = _mm512_set1_ps(e);
#pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) acc[r][c] = round_h16(_mm512_fmadd_ps(vv[c], ev, acc[r][c]));
        sr[r] = __builtin_fmaf(sr[r], 1.0f, e);
      }
      continue;
    }
#pragma GCC unroll 4
    for (int r = 0; r < QG; ++r) {
      if (r >= nr || !(plan[r0 + r].valid >> j & 1)) continue;
      float ms = 1.0f, vs = 1.0f;
      if (plan[r0 + r].is_new >> j & 1) {
        ms = plan[r0 + r].e[j];
        const __m512 mv = _mm512_set1_ps(ms);
#pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) acc[r][c] = round_h16(_mm512_mul_ps(acc[r][c], mv));
      } else {
        vs = plan[r0 + r].e[j];
      }
      const __m512 vv = _mm512_set1_ps(vs);
#pragma GCC unroll 16
      for (int c = 0; c < DC; ++c)
        acc[r][c] = round_h16(_mm512_fmadd_ps(load_value<Masked>(vr + 16 * c, lanes), vv, acc[r][c]));
      sr[r] = __builtin_fmaf(sr[r], ms, vs);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < QG; ++r) {
    if (r >= nr) continue;
    s[r0 + r] = sr[r];
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c) _mm512_store_ps(acc_mem[r0 + r] + 16 * c, acc[r][c]);
  }
}

// Head sizes up to 16. ggml's f16 dot has no full 32-element step at these
// sizes and sums every product in double (as the per-key score in kernels.cpp does),
// so each step's 32 keys are widened to double once and every query's scores
// run as 4 chains of 8 keys, two queries at a time; value rows are one masked
// vector.
struct SmallStep {
  __m512d k[16][4];  // [dim][keys 8 c .. 8 c + 7]
};

RP_INLINE void widen_step(const float* kt0, const float* kt1, int64_t d, SmallStep& st) {
  for (int64_t i = 0; i < d; ++i) {
    const __m512 a = _mm512_loadu_ps(kt0 + i * 16), b = _mm512_loadu_ps(kt1 + i * 16);
    st.k[i][0] = _mm512_cvtps_pd(_mm512_castps512_ps256(a));
    st.k[i][1] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1));
    st.k[i][2] = _mm512_cvtps_pd(_mm512_castps512_ps256(b));
    st.k[i][3] = _mm512_cvtps_pd(_mm512_extractf32x8_ps(b, 1));
  }
}

// Scores (times scale, in float) of R queries against a step's 32 keys.
template <int R>
RP_INLINE void score_small(const float* const* q, const SmallStep& st, int64_t d, float scale, float (*const* out)) {
  __m512d acc[R][4];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_pd();
  for (int64_t i = 0; i < d; ++i) {
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      const __m512d qd = _mm512_set1_pd(q[r][i]);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_pd(qd, st.k[i][c], acc[r][c]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(out[r] + 8 * c, _mm256_mul_ps(_mm512_cvtpd_ps(acc[r][c]), sc));
}

// The batched driver: runs of up to kMaxQ queries; per 32-key step the scores
// of the queries whose range meets the step (score_step(p0, nk, i0, live, n,
// sc) scores some of the n queries r in live, at least one, into sc[r] and
// says how many), their key plans, then the value updates, QG queries at a
// time. Masked: head sizes below 16 (see update_values).
template <int DC, int QG, bool Masked, typename ScoreStep>
RP_INLINE void attention_runs(const AttnArgs& a, ScoreStep&& score_step) {
  const __mmask16 lanes = Masked ? static_cast<__mmask16>((1u << a.d) - 1) : static_cast<__mmask16>(0xffff);
  alignas(64) float acc[kMaxQ][16 * DC];
  alignas(64) float sc[kMaxQ][32];
  KeyPlan plan[kMaxQ];
  float m[kMaxQ], s[kMaxQ];
  for (int64_t i0 = 0; i0 < a.n_q; i0 += kMaxQ) {
    const int nq = static_cast<int>(a.n_q - i0 < kMaxQ ? a.n_q - i0 : kMaxQ);
    const int64_t* first = a.first + i0;
    const int64_t* end = a.end + i0;
    int64_t lo = first[0], hi = end[0];
    for (int r = 0; r < nq; ++r) {
      m[r] = -__builtin_inff();
      s[r] = 0.0f;
      for (int c = 0; c < DC; ++c) _mm512_store_ps(acc[r] + 16 * c, _mm512_setzero_ps());
      lo = lo < first[r] ? lo : first[r];
      hi = hi > end[r] ? hi : end[r];
    }
    for (int64_t p0 = a.base + ((lo - a.base) & ~int64_t(15)); p0 < hi; p0 += 32) {
      const int nk = static_cast<int>(hi - p0 < 32 ? hi - p0 : 32);
      // Queries whose range misses this step skip the scores.
      int live[kMaxQ], n_live = 0;
      for (int r = 0; r < nq; ++r) {
        if (end[r] <= p0 || first[r] >= p0 + nk) {
          plan[r].valid = 0;
          plan[r].is_new = 0;
        } else {
          live[n_live++] = r;
        }
      }
      // Each query's plan follows its scores, so one query's plan overlaps
      // the next one's scores (measured faster than all scores first).
      for (int l = 0; l < n_live;) {
        const int n = score_step(p0, nk, i0, live + l, n_live - l, sc);
        for (int j = l; j < l + n; ++j) {
          const int r = live[j];
          const int kn = static_cast<int>(end[r] - p0 < nk ? end[r] - p0 : nk);
          plan_keys(plan[r], m[r], sc[r], kn, p0, first[r], end[r]);
        }
        l += n;
      }
      for (int r0 = 0; r0 < nq; r0 += QG)
        update_values<DC, QG, Masked>(r0, nq - r0 < QG ? nq - r0 : QG, nk, p0, a, sc, plan, s, acc);
    }
    for (int r = 0; r < nq; ++r) {
      const __m512 inv = _mm512_set1_ps(s[r] == 0.0f ? 0.0f : 1.0f / s[r]);
      float* o = a.out + (i0 + r) * a.out_stride;
      for (int c = 0; c < DC; ++c)
        _mm512_mask_storeu_ps(o + 16 * c, lanes, _mm512_mul_ps(_mm512_load_ps(acc[r] + 16 * c), inv));
    }
  }
}

// Head size 16 * DC (DC even): scores from score_tile, one query at a time.
template <int DC>
void attention_dc(const AttnArgs& a) {
  constexpr int64_t d = 16 * DC;
  constexpr int QG = DC <= 4 ? 4 : DC <= 8 ? 2 : 1;
  attention_runs<DC, QG, false>(a, [&](int64_t p0, int nk, int64_t i0, const int* live, int, float (*sc)[32]) {
    const float* kt[2] = {a.kt + ((p0 - a.base) / 16) * d * 16, a.kt + ((p0 - a.base) / 16 + 1) * d * 16};
    const int r = live[0];
    const float* q = a.q + (i0 + r) * a.q_stride;
    const int kn = static_cast<int>(a.end[i0 + r] - p0 < nk ? a.end[i0 + r] - p0 : nk);
    if (kn > 16) score_tile<1, 2, DC / 2>(&q, kt, a.scale, sc + r);
    else score_tile<1, 1, DC / 2>(&q, kt, a.scale, sc + r);
    return 1;
  });
}

void attention_small(const AttnArgs& a) {
  SmallStep st;
  int64_t widened = -1;  // the step st holds
  attention_runs<1, 4, true>(a, [&](int64_t p0, int, int64_t i0, const int* live, int n, float (*sc)[32]) {
    if (widened != p0) {
      const float* kt0 = a.kt + ((p0 - a.base) / 16) * a.d * 16;
      widen_step(kt0, kt0 + a.d * 16, a.d, st);
      widened = p0;
    }
    if (n >= 2) {
      const float* q[2] = {a.q + (i0 + live[0]) * a.q_stride, a.q + (i0 + live[1]) * a.q_stride};
      float* out[2] = {sc[live[0]], sc[live[1]]};
      score_small<2>(q, st, a.d, a.scale, out);
      return 2;
    }
    const float* q[1] = {a.q + (i0 + live[0]) * a.q_stride};
    float* out[1] = {sc[live[0]]};
    score_small<1>(q, st, a.d, a.scale, out);
    return 1;
  });
}

// Keys p0 .. p0 + nb - 1 (nb <= 16) of the KV head at koff as [dim][16] f32
// in kt, lanes from nb zero. A block that is one stored 16-position group
// (every block of a context from position 0, in memory with 16-position
// key groups) is widened in place; otherwise its keys are gathered as rows
// into `rows` and transposed.
template <int DC>
RP_INLINE void key_block_f32(const AttnRowsArgs& a, int64_t koff, int64_t p0, int nb, float* kt, uint16_t* rows) {
  const KeyView keys{a.key_rows, koff, a.key_group, 16 * DC};
  const __mmask16 lanes = static_cast<__mmask16>(nb >= 16 ? 0xffffu : (1u << nb) - 1);
  if (a.key_group == 16 && (p0 & 15) == 0) {
    const uint16_t* g = a.key_rows[p0] + koff;  // (not KeyView's inline members: see the top of this file)
#pragma GCC unroll 16
    for (int i = 0; i < 16 * DC; ++i)
      _mm512_store_ps(kt + i * 16,
                      _mm512_maskz_mov_ps(lanes, _mm512_cvtph_ps(_mm256_loadu_si256(
                                                     reinterpret_cast<const __m256i*>(g + i * 16)))));
    return;
  }
  gather_key_rows(keys, p0, nb, rows);
#pragma GCC unroll 1
  for (int c = 0; c < DC; ++c) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] = i < nb ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + i * 16 * DC + 16 * c)))
                    : _mm512_setzero_ps();
    transpose16(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) _mm512_store_ps(kt + (16 * c + i) * 16, r[i]);
  }
}

// What the heads of one decode task share (grouped-query attention).
enum class KvShare {
  kNone,      // each head reads its own K and V
  kValues,    // one KV head: each V row is widened once for all heads
  kKeysToo,   // and each K block is transposed once, the heads scored with
              // keys across lanes like a prompt's queries (score_tile's tree)
};

// H heads of one query, keys in blocks of 16: scores, the sequential
// new-maximum rule, 16 exponentials per head, then the value updates with
// the heads' accumulators interleaved.
template <int DC, int H, KvShare Share = KvShare::kNone>
void attend_rows_heads(const AttnRowsArgs& a, int64_t h0) {
  constexpr bool Shared = Share == KvShare::kKeysToo;
  constexpr bool SharedV = Share != KvShare::kNone;
  __m512 acc[H][DC];
  float M[H], S[H];
  const float* q[H];
  int64_t koff[H], voff[H];
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c) acc[h][c] = _mm512_setzero_ps();
    M[h] = -__builtin_inff();
    S[h] = 0.0f;
    q[h] = a.q + (h0 + h) * 16 * DC;
    koff[h] = a.k_off[h0 + h];
    voff[h] = a.v_off[h0 + h];
  }
  alignas(64) float sc[H][32], arg[H][16], e[H][16];
  alignas(64) float kt[16 * DC * 16];
  alignas(64) uint16_t rows[16 * 16 * DC];
  uint32_t is_new[H];
  for (int64_t p0 = a.first; p0 < a.end; p0 += 16) {
    const int nb = static_cast<int>(a.end - p0 < 16 ? a.end - p0 : 16);
    // Scores with keys across lanes (score_tile: per lane, ggml's AVX2 f16
    // dot tree for one query and key), from each KV head's block as
    // [dim][16] f32.
    const float* blocks[1] = {kt};
    if constexpr (Shared) {
      key_block_f32<DC>(a, koff[0], p0, nb, kt, rows);
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) score_tile<1, 1, DC / 2>(&q[h], blocks, a.scale, sc + h);
    } else {
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        if (!SharedV || h == 0) key_block_f32<DC>(a, koff[h], p0, nb, kt, rows);  // heads sharing V share K too
        score_tile<1, 1, DC / 2>(&q[h], blocks, a.scale, sc + h);
      }
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; ++h) {
      float m = M[h];
      uint32_t mask = 0;
      for (int j = 0; j < nb; ++j) {
        const float s = sc[h][j];
        const bool nw = s > m;
        arg[h][j] = nw ? m - s : s - m;
        if (nw) {
          m = s;
          mask |= 1u << j;
        }
      }
      for (int j = nb; j < 16; ++j) arg[h][j] = 0.0f;
      is_new[h] = mask;
      _mm512_store_ps(e[h], expf_exact16(_mm512_load_ps(arg[h])));
    }
    for (int j = 0; j < nb; ++j) {
      const uint16_t* vr = a.value_rows[p0 + j];
      __m512 vw[SharedV ? DC : 1];
      if constexpr (SharedV) {
#pragma GCC unroll 16
        for (int c = 0; c < DC; ++c)
          vw[c] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + voff[0] + 16 * c)));
      }
#pragma GCC unroll 8
      for (int h = 0; h < H; ++h) {
        float ms = 1.0f, vs = 1.0f;
        if (is_new[h] >> j & 1) {
          M[h] = sc[h][j];
          ms = e[h][j];
          const __m512 mv = _mm512_set1_ps(ms);
#pragma GCC unroll 16
          for (int c = 0; c < DC; ++c) acc[h][c] = round_h16(_mm512_mul_ps(acc[h][c], mv));
        } else {
          vs = e[h][j];
        }
        const __m512 vv = _mm512_set1_ps(vs);
        const uint16_t* v = vr + voff[h];
#pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) {
          const __m512 vc = SharedV ? vw[c] : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * c)));
          acc[h][c] = round_h16(_mm512_fmadd_ps(vc, vv, acc[h][c]));
        }
        S[h] = __builtin_fmaf(S[h], ms, vs);
      }
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < H; ++h) {
    const __m512 iv = _mm512_set1_ps(S[h] == 0.0f ? 0.0f : 1.0f / S[h]);
    float* o = a.out + (h0 + h) * 16 * DC;
#pragma GCC unroll 16
    for (int c = 0; c < DC; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[h][c], iv));
  }
}

// Up to 16 accumulator registers: 4 heads of 64, 2 of 128, 1 of 256.
// Heads that share a KV head (grouped-query attention) share the V widening,
// and with 4 heads also the K transpose: 1.15x for 4 heads of 64
// (BM_Attention/1/2048/1/64/4). For 2 heads of 128 the transpose is shared
// too little (0.93x), so they share only the values (one V conversion per
// key instead of two; within noise of no sharing, 0.96-1.04x).
template <int DC>
void attend_rows_dc(const AttnRowsArgs& a) {
  constexpr int H = DC <= 4 ? 4 : DC <= 8 ? 2 : 1;
  int64_t h = 0;
  for (; h + H <= a.n_heads; h += H) {
    if constexpr (H >= 2) {
      bool shared = true;
      for (int i = 1; i < H; ++i) shared = shared && a.k_off[h + i] == a.k_off[h] && a.v_off[h + i] == a.v_off[h];
      if (shared) {
        attend_rows_heads<DC, H, H >= 4 ? KvShare::kKeysToo : KvShare::kValues>(a, h);
        continue;
      }
    }
    attend_rows_heads<DC, H>(a, h);
  }
  for (; h < a.n_heads; ++h) attend_rows_heads<DC, 1>(a, h);
}

void attend_rows(const AttnRowsArgs& a) {
  switch (a.d) {
    case 32: attend_rows_dc<2>(a); return;
    case 64: attend_rows_dc<4>(a); return;
    case 96: attend_rows_dc<6>(a); return;
    case 128: attend_rows_dc<8>(a); return;
    case 256: attend_rows_dc<16>(a); return;
  }
}

bool attend_rows_supports(int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

bool attention_supports(int64_t head_dim) { return (head_dim >= 1 && head_dim <= 16) || attend_rows_supports(head_dim); }

void attention(const AttnArgs& a) {
  if (a.d <= 16) {
    attention_small(a);
    return;
  }
  switch (a.d) {
    case 32: attention_dc<2>(a); return;
    case 64: attention_dc<4>(a); return;
    case 96: attention_dc<6>(a); return;
    case 128: attention_dc<8>(a); return;
    case 256: attention_dc<16>(a); return;
    default: return;
  }
}

// ---------------------------------------------------------------------------
// Activation tiles: 16 token rows x 16 inputs transposed in registers.

// Same rounding as the AVX2 conversions in kernels.cpp.
RP_INLINE __m512 round_bf16_16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  const __mmask16 is_nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i nan = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xffff0000u))),
                                      _mm512_set1_epi32(64 << 16));
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_nan, r, nan));
}

void pack_f_tile(const float* x, int64_t n_in, int nt, int tile, int round, float* out) {
  const __mmask16 out_mask = static_cast<__mmask16>((1u << tile) - 1);
  for (int64_t k0 = 0; k0 < n_in; k0 += 16) {
    const int kn = static_cast<int>(n_in - k0 < 16 ? n_in - k0 : 16);
    const __mmask16 in_mask = static_cast<__mmask16>((1u << kn) - 1);
    __m512 r[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {
      __m512 v = t < nt ? _mm512_maskz_loadu_ps(in_mask, x + t * n_in + k0) : _mm512_setzero_ps();
      if (round == 1) v = _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
      else if (round == 2) v = round_bf16_16(v);
      r[t] = v;
    }
    transpose16(r);
#pragma GCC unroll 16
    for (int kk = 0; kk < 16; ++kk)
      if (kk < kn) _mm512_mask_storeu_ps(out + (k0 + kk) * tile, out_mask, r[kk]);
  }
}

// Vector i's 16 lanes combined by op (an associative and commutative integer
// operation, so the order is free) into lane i: pairs interleaved by 32
// bits, then by 64, then the 128-bit lanes of four vectors transposed. One
// such reduction of 16 vectors costs about what two horizontal reductions
// of one vector do.
template <typename Op>
RP_INLINE __m512i lanes_reduced16(const __m512i (&v)[16], Op op) {
  __m512i p2[8], p4[4], p8[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    p2[i] = op(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    p4[i] = op(_mm512_unpacklo_epi64(p2[2 * i], p2[2 * i + 1]), _mm512_unpackhi_epi64(p2[2 * i], p2[2 * i + 1]));
  // Each 128-bit lane of p4[i] holds vectors 4i..4i+3's partial results, in
  // order; the four lanes are to be combined.
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    p8[i] = op(_mm512_shuffle_i32x4(p4[2 * i], p4[2 * i + 1], 0x44), _mm512_shuffle_i32x4(p4[2 * i], p4[2 * i + 1], 0xEE));
  return op(_mm512_shuffle_i32x4(p8[0], p8[1], 0x88), _mm512_shuffle_i32x4(p8[0], p8[1], 0xDD));
}

RP_INLINE __m512i add_epi32(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
RP_INLINE __m512i max_epu32(__m512i a, __m512i b) { return _mm512_max_epu32(a, b); }

// Q8_0 quantization by ggml's AVX2 rule (kernels_avx2.cpp quantize_q8, which
// this must match bit for bit): per block d = amax / 127 stored as f16,
// q = round-half-even(x * (127 / amax)) saturated to int8. Sixteen blocks at a
// time, so the divisions and f16 conversions run once per 16 blocks, and the
// blocks' maxima and halves' sums each come out of one transposed reduction
// (of integers: the same values as block by block).
void quantize_q8(const float* x, int64_t n_blocks, XBlock* out, int64_t out_stride) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512i lo = _mm512_set1_epi32(-128), hi = _mm512_set1_epi32(127);
  for (int64_t b0 = 0; b0 < n_blocks; b0 += 16) {
    const int nb = static_cast<int>(n_blocks - b0 < 16 ? n_blocks - b0 : 16);
    const float* xb = x + b0 * kQK8_0;
    // |x| compared as integers: the order of non-negative floats, with NaNs
    // above infinity, so a block that holds a NaN shows one. The rule's max
    // tree keeps or drops a NaN by its position: such blocks take that tree.
    __m512i mags[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j)
      mags[j] = j < nb ? _mm512_max_epu32(_mm512_castps_si512(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + j * kQK8_0))),
                                          _mm512_castps_si512(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + j * kQK8_0 + 16))))
                       : _mm512_setzero_si512();
    __m512 m = _mm512_castsi512_ps(lanes_reduced16(mags, max_epu32));
    if (const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_castps_si512(m), _mm512_set1_epi32(0x7f800000))) {
      alignas(64) float amax[16];
      _mm512_store_ps(amax, m);
      for (int j = 0; j < nb; ++j)
        if (nan >> j & 1) amax[j] = q8_0_block_amax(xb + j * kQK8_0);
      m = _mm512_load_ps(amax);
    }
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_div_ps(m, _mm512_set1_ps(127.0f)),
                                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __mmask16 nonzero = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    const __m512 id = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.0f), m);
    alignas(64) float ds[16], ids[16];
    _mm512_store_ps(ds, d);
    _mm512_store_ps(ids, id);
    // Eight blocks at a time: the saturated quants of block j's halves are
    // vectors 2j and 2j + 1 of one reduction.
    for (int j0 = 0; j0 < nb; j0 += 8) {
      __m512i halves[16];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const int j = j0 + i;
        if (j >= nb) {
          halves[2 * i] = halves[2 * i + 1] = _mm512_setzero_si512();
          continue;
        }
        const __m512 mul = _mm512_set1_ps(ids[j]);
        const __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + j * kQK8_0), mul),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + j * kQK8_0 + 16), mul),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        XBlock& o = out[(b0 + j) * out_stride];
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o.qs), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o.qs + 16), _mm512_cvtsepi32_epi8(q1));
        halves[2 * i] = _mm512_min_epi32(_mm512_max_epi32(q0, lo), hi);
        halves[2 * i + 1] = _mm512_min_epi32(_mm512_max_epi32(q1, lo), hi);
      }
      alignas(64) int32_t sums[16];
      _mm512_store_si512(sums, lanes_reduced16(halves, add_epi32));
      for (int i = 0; i < 8 && j0 + i < nb; ++i) {
        XBlock& o = out[(b0 + j0 + i) * out_stride];
        const int32_t sum = sums[2 * i] + sums[2 * i + 1];  // of the stored (saturated) quants
        o.sum_lo = static_cast<int16_t>(sums[2 * i]);
        o.sum_hi = static_cast<int16_t>(sums[2 * i + 1]);
        o.d = ds[j0 + i];
        o.corr_q8 = -128 * sum;
        o.corr_q4 = -8 * sum;
      }
    }
  }
}

// q8_k_lanes.h's primitives on 16 lanes.
struct Q8kLanes512 {
  using Vec = __m512;
  static constexpr int kWidth = 16;
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
  static float hmax(Vec v) { return _mm512_reduce_max_ps(v); }
  static float hmin(Vec v) { return _mm512_reduce_min_ps(v); }
};

// Q8_K quantization by the rule of kernels_avx2.cpp's quantize_q8_k (ggml's
// quantize_row_q8_K), which this must match bit for bit, 16 floats a vector:
// the scale's element by q8_k_lanes.h, then q = rne(x * (-127 / max))
// saturated to int8 as the AVX2 packs saturate, and each block's halves'
// sums of the stored quants, 16 at once (a transposed reduction).
void quantize_q8_k_avx512(const float* x, int64_t n_sections, XBlock* out, int64_t out_stride) {
  const __m512i lo = _mm512_set1_epi32(-128), hi = _mm512_set1_epi32(127);
  for (int64_t s = 0; s < n_sections; ++s) {
    const float* xs = x + s * kQK_K;
    XBlock* o = out + s * 8 * out_stride;
    const auto [iscale, d] = q8_k_lanes::section_scale<Q8kLanes512>(xs);
    const __m512 is = _mm512_set1_ps(iscale);
    __m512i sums[16];
#pragma GCC unroll 8
    for (int b = 0; b < 8; ++b) {
      XBlock& xb = o[b * out_stride];
      // cvtps rounds as MXCSR says (to nearest even), as the AVX2 rule's does.
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 32 * b), is));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 32 * b + 16), is));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xb.qs), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xb.qs + 16), _mm512_cvtsepi32_epi8(q1));
      xb.d = d;
      xb.corr_q8 = 0;
      xb.corr_q4 = 0;
      sums[2 * b] = _mm512_min_epi32(_mm512_max_epi32(q0, lo), hi);
      sums[2 * b + 1] = _mm512_min_epi32(_mm512_max_epi32(q1, lo), hi);
    }
    const __m512i total = lanes_reduced16(sums, add_epi32);
    alignas(64) int32_t sum[16];
    _mm512_store_si512(sum, total);
#pragma GCC unroll 8
    for (int b = 0; b < 8; ++b) {
      XBlock& xb = o[b * out_stride];
      xb.sum_lo = static_cast<int16_t>(sum[2 * b]);
      xb.sum_hi = static_cast<int16_t>(sum[2 * b + 1]);
    }
  }
}

// The driver's silu_mul and gelu_mul (kernels.cpp) on 16 lanes: the same
// operations per element (avx512::exp16 is avx2::exp8's, and the division
// is correctly rounded at any width), so the same bits.
int64_t silu_mul(float* g, const float* u, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(one, avx512::exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
  }
  return i;
}

int64_t gelu_mul(float* g, const float* u, int64_t n) {
  const __m512 c1 = _mm512_set1_ps(2.0f * avx2::kGeluSqrt2OverPi), c2 = _mm512_set1_ps(avx2::kGeluCoef);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 t = _mm512_fmadd_ps(_mm512_mul_ps(c2, x), x, one);
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(c1, x), t);
    const __m512 e = avx512::exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(y), sign)));
    const __m512 r = _mm512_div_ps(x, _mm512_add_ps(one, e));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(r, _mm512_loadu_ps(u + i)));
  }
  return i;
}

// Reads n bytes (a multiple of 512) as `streams` (8 or 1) sequential
// streams, each prefetched 1 KiB ahead: 8 interleaved streams were the
// decode tiles' pattern and the fastest read on the Ice Lake VM (~1.5x one
// stream); one stream per thread is the interleaved layout's, and the
// faster on Zen 5.
uint64_t read_sum(const uint8_t* p, size_t n, int streams) {
  constexpr int kAcc = 8;
  const int n_streams = streams == 1 ? 1 : kAcc;
  // Stream s covers [s * len, (s + 1) * len); a step reads kAcc lines, one
  // from each stream, or kAcc consecutive lines of the one stream.
  const size_t len = n / n_streams, stride = n_streams == 1 ? 64 : len, step = n_streams == 1 ? 64 * kAcc : 64;
  __m512i acc[kAcc];
#pragma GCC unroll 8
  for (int s = 0; s < kAcc; ++s) acc[s] = _mm512_setzero_si512();
  for (size_t i = 0; i < len; i += step) {
#pragma GCC unroll 8
    for (int s = 0; s < kAcc; ++s) {
      const uint8_t* q = p + s * stride + i;
      _mm_prefetch(reinterpret_cast<const char*>(q + 1024), _MM_HINT_T0);
      acc[s] = _mm512_add_epi64(acc[s], _mm512_loadu_si512(q));
    }
  }
  __m512i t = acc[0];
  for (int s = 1; s < kAcc; ++s) t = _mm512_add_epi64(t, acc[s]);
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(t));
}

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels k{"avx512", &matmul_f32, &matmul_f16, &matmul_bf16, &matmul_q8_0, &matmul_q4_0, &matmul_q4_1, &matmul_q5_0, &matmul_q5_1, &matmul_q2_k, &matmul_q3_k, &matmul_q4_k, &matmul_q5_k, &matmul_q6_k, &matmul_q6_k_wide, &matmul_iq4_nl, &matmul_iq4_xs, &read_sum, &pack_f_tile, &quantize_q8, &quantize_q8_k_avx512, &attention, &attention_supports, &attend_rows, &attend_rows_supports, &attend_tiled_avx512, &attend_tiled_rows_avx512,
                            kDecodeGroupsFQ, kDecodeGroupsFQ, kDecodeGroupsK, /*interleave_q6_k=*/1,
                            /*regions_f=*/kRegionsF, /*regions_f_long=*/kRegionsFLong, /*regions_k=*/kDecodeGroupsK, /*regions_q=*/0, /*regions_q6_k=*/0,
                            /*regions_q8_0=*/kRowGroupsQ,
                            /*tiled_heads_together=*/2, /*decode_prefetch_f=*/256,
                            /*decode_prefetch_q=*/1088, /*decode_prefetch_k=*/512, &mamba1_scan_avx512, &mamba2_scan_avx512,
                            &silu_mul, &gelu_mul};
  return k;
}

}  // namespace reprise::kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
