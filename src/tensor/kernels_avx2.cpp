// AVX2 + FMA + F16C kernels (the x86-64-v3 baseline). A 16-row group is two
// 8-lane halves; the operations per output are those of the AVX-512 kernels
// (see kernels_impl.h), so both give the same bits.
//
// kernels_avx2_vnni.cpp builds this file a second time with REPRISE_AVX_VNNI
// defined, for CPUs with AVX-VNNI but no AVX-512: only the integer dot
// helpers below differ, and that build defines only the integer products and
// their table (avx2_vnni_kernels).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "tensor/kernels_impl.h"
#include "tensor/q8_k_lanes.h"
#include "tensor/tile_runner.h"

namespace reprise::kernels {
namespace {

#define RP_INLINE inline __attribute__((always_inline))
#define RP_INLINE_LAMBDA __attribute__((always_inline))

enum class FType { F32, F16, BF16 };

// Integer dots of 4-byte chunks: 8 rows of unsigned weight bytes against one
// chunk of 4 signed activation bytes (broadcast), per row the sum of the 4
// products. These helpers are the only code in which this file's two builds
// differ: AVX2 multiplies pairs into 16 bits (vpmaddubsw) and widens them
// (vpmaddwd with ones); AVX-VNNI (kernels_avx2_vnni.cpp) adds all 4 products
// into 32 bits with one vpdpbusd. The callers keep every 16-bit sum below
// saturation, so both builds give the same, exact integers.
//
// A "partial" is a running sum of such dots (AVX2: in 16-bit pairs, AVX-VNNI:
// in 32 bits); partial_widen gives each row's 32-bit sum.
#ifdef REPRISE_AVX_VNNI
RP_INLINE __m256i partial_add(__m256i p, __m256i w, __m256i xv) { return _mm256_dpbusd_avx_epi32(p, w, xv); }
RP_INLINE __m256i partial_sum(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
RP_INLINE __m256i partial_widen(__m256i p) { return p; }
RP_INLINE __m256i dot_u8_acc(__m256i acc, __m256i w, __m256i xv) { return partial_add(acc, w, xv); }
constexpr bool kPartials16 = false;
#else
RP_INLINE __m256i partial_add(__m256i p, __m256i w, __m256i xv) {
  return _mm256_add_epi16(p, _mm256_maddubs_epi16(w, xv));
}
RP_INLINE __m256i partial_sum(__m256i a, __m256i b) { return _mm256_add_epi16(a, b); }
RP_INLINE __m256i partial_widen(__m256i p) { return _mm256_madd_epi16(p, _mm256_set1_epi16(1)); }
// acc + the dots of unsigned weights w (at most 63 here: a pair cannot
// saturate 16 bits).
RP_INLINE __m256i dot_u8_acc(__m256i acc, __m256i w, __m256i xv) {
  return _mm256_add_epi32(acc, partial_widen(_mm256_maddubs_epi16(w, xv)));
}
constexpr bool kPartials16 = true;
#endif

// A loaded vector the compiler must keep in a register: GCC folds a load
// into every instruction that reads it, so a nibble chunk used for its low
// and its high nibbles was loaded twice (as in the AVX-512 tiles,
// kernels_avx512.cpp).
RP_INLINE __m256i loaded_once(__m256i v) {
  asm("" : "+x"(v));
  return v;
}

// How many chunks of unsigned quants below 2^Bits one 16-bit partial can
// sum exactly (per 16-bit lane a pair of products with activations of at
// most 127 in magnitude): 8 for Q4_K's nibbles, 4 for Q5_K, 2 for Q6_K, 1
// for IQ4_XS's table values (|w| up to 127, the sign trick).
template <int Bits>
constexpr int kChunksPerPartial = 32767 / (2 * 127 * ((1 << Bits) - 1)) >= 8   ? 8
                                  : 32767 / (2 * 127 * ((1 << Bits) - 1)) >= 4 ? 4
                                  : 32767 / (2 * 127 * ((1 << Bits) - 1)) >= 2 ? 2
                                                                               : 1;
static_assert(kChunksPerPartial<4> == 8 && kChunksPerPartial<5> == 4 && kChunksPerPartial<6> == 2 &&
              kChunksPerPartial<7> == 1);

template <int C>
using ChunkIndex = std::integral_constant<int, C>;

// Rows 0-7 and 8-15's dots of a block's 8 chunks of unsigned quants below
// 2^Bits (w(ChunkIndex<c>, h): chunk c of rows 8h..8h+7) with the
// activation chunks xv(ChunkIndex<c>), added to acc[h] in 32 bits. AVX2
// sums them as 16-bit partials and widens once per kChunksPerPartial
// chunks (vpmaddubsw + vpaddw per chunk where dot_u8_acc takes vpmaddubsw
// + vpmaddwd + vpaddd); AVX-VNNI adds each chunk's dots directly.
template <int Bits, class W, class X>
RP_INLINE void dot_u8_chunks(__m256i (&acc)[2], W&& w, X&& xv) {
  constexpr int kPer = kPartials16 ? kChunksPerPartial<Bits> : 1;
  static_assert(8 % kPer == 0);
  [&]<int... P>(std::integer_sequence<int, P...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          constexpr int kFirst = P * kPer;
          if constexpr (!kPartials16) {
            const __m256i x = xv(ChunkIndex<kFirst>{});
            for (int h = 0; h < 2; ++h) acc[h] = partial_add(acc[h], w(ChunkIndex<kFirst>{}, h), x);
          } else {
            __m256i part[2];
            const __m256i x = xv(ChunkIndex<kFirst>{});
            for (int h = 0; h < 2; ++h) part[h] = _mm256_maddubs_epi16(w(ChunkIndex<kFirst>{}, h), x);
            [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
              (
                  [&]() RP_INLINE_LAMBDA {
                    const __m256i xc = xv(ChunkIndex<kFirst + 1 + C>{});
                    for (int h = 0; h < 2; ++h) part[h] = partial_add(part[h], w(ChunkIndex<kFirst + 1 + C>{}, h), xc);
                  }(),
                  ...);
            }(std::make_integer_sequence<int, kPer - 1>{});
            for (int h = 0; h < 2; ++h) acc[h] = _mm256_add_epi32(acc[h], partial_widen(part[h]));
          }
        }(),
        ...);
  }(std::make_integer_sequence<int, 8 / kPer>{});
}

// acc + the dots of signed weights q (-128..127) with signed activations
// (-127..127): |q| against x with q's sign (a pair of 128 * 127 products
// cannot saturate).
RP_INLINE __m256i dot_s8_acc(__m256i acc, __m256i q, __m256i xv) {
  return dot_u8_acc(acc, _mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q));
}

// Q8_0's stored quants (q + 128) as the signed q.
RP_INLINE __m256i q8_unbiased(__m256i w_biased) {
  return _mm256_xor_si256(w_biased, _mm256_set1_epi8(static_cast<char>(0x80)));
}

// Q8_0's rows, stored as q + 128: a block's dots start from q8_start, and
// q8_dot_acc adds a chunk's. AVX2 undoes the bias (signed dots from 0);
// AVX-VNNI takes the biased bytes as they are and starts from the
// activations' correction, -128 * their sum.
#ifdef REPRISE_AVX_VNNI
RP_INLINE __m256i q8_start(const XBlock& xb) { return _mm256_set1_epi32(xb.corr_q8); }
RP_INLINE __m256i q8_dot_acc(__m256i acc, __m256i w_biased, __m256i xv) { return dot_u8_acc(acc, w_biased, xv); }
#else
RP_INLINE __m256i q8_start(const XBlock&) { return _mm256_setzero_si256(); }
RP_INLINE __m256i q8_dot_acc(__m256i acc, __m256i w_biased, __m256i xv) {
  return dot_s8_acc(acc, q8_unbiased(w_biased), xv);
}
#endif

template <FType W>
constexpr size_t kElemBytes = W == FType::F32 ? 4 : 2;

// Rows 8h..8h+7 of a group's 16 elements at p.
template <FType W>
RP_INLINE __m256 load_row8(const uint8_t* p, int h) {
  if constexpr (W == FType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * h);
  } else if constexpr (W == FType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + h));
  } else {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

RP_INLINE void store_rows(float* y, int64_t rows_left, __m256 lo, __m256 hi) {
  if (rows_left >= 16) {
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
    return;
  }
  alignas(32) float tmp[16];
  _mm256_store_ps(tmp, lo);
  _mm256_store_ps(tmp + 8, hi);
  for (int64_t r = 0; r < rows_left; ++r) y[r] = tmp[r];
}

// Accumulators start at +0, or at y's values when continuing a k range.
template <int G, int T>
RP_INLINE void init_acc(const MatmulArgs& a, int64_t g0, int64_t t0, __m256 (&acc)[G][T][2]) {
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      if (a.k_begin == 0) {
        acc[g][t][0] = acc[g][t][1] = _mm256_setzero_ps();
      } else {
        const int64_t rows = a.n_rows - (g0 + g) * kGroupRows;
        const float* y = a.y + (t0 + t) * a.y_stride + (g0 + g) * kGroupRows;
        alignas(32) float tmp[16] = {};
        for (int64_t r = 0; r < (rows < 16 ? rows : 16); ++r) tmp[r] = y[r];
        acc[g][t][0] = _mm256_load_ps(tmp);
        acc[g][t][1] = _mm256_load_ps(tmp + 8);
      }
    }
}

// Stores the tile's outputs (rows beyond n_rows are not written).
template <int G, int T>
RP_INLINE void store_acc(const MatmulArgs& a, int64_t g0, int64_t t0, __m256 (&acc)[G][T][2]) {
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
      store_rows(a.y + (t0 + t) * a.y_stride + (g0 + g) * kGroupRows, a.n_rows - (g0 + g) * kGroupRows,
                 acc[g][t][0], acc[g][t][1]);
}

// kNext: requests the next tile's weights (requests_next_groups).
template <FType W, int G, int T, bool kNext = false>
void tile_f(const MatmulArgs& a, int64_t g0, int64_t t0) {
  constexpr size_t kStep = kGroupRows * kElemBytes<W>;
  const uint8_t* w = a.w + g0 * a.group_stride;
  const float* x = static_cast<const float*>(a.x) + x_offset(a.t0 + t0, 0, a.x_tile, a.x_k);
  const size_t gb = a.group_stride, us = a.unit_stride;
  const int64_t xs = a.x_tile;
  __m256 acc[G][T][2];
  init_acc<G, T>(a, g0, t0, acc);
  for (int64_t k = a.k_begin; k < a.k_end; ++k) {
    // Decode streams the weights once: prefetch ahead (one line per 2 k for 16-bit weights).
    if (a.prefetch > 0) prefetch_f_unit<G, kStep>(w + k * us, gb, us, g0, k, a.prefetch);
    if constexpr (kNext)
      if ((k * kStep) % 64 == 0) prefetch_next_groups<G, 64, 1>(a, g0, k * us, 0);
    __m256 wv[G][2];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      wv[g][0] = load_row8<W>(w + g * gb + k * us, 0);
      wv[g][1] = load_row8<W>(w + g * gb + k * us, 1);
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x + k * xs + t);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) {
        acc[g][t][0] = _mm256_fmadd_ps(wv[g][0], xb, acc[g][t][0]);
        acc[g][t][1] = _mm256_fmadd_ps(wv[g][1], xb, acc[g][t][1]);
      }
    }
  }
  store_acc<G, T>(a, g0, t0, acc);
}

// IQ4_NL's table in both 128-bit lanes (vpshufb looks up per lane): signed,
// or plus 128 (unsigned, for AVX-VNNI's vpdpbusd, whose 32-bit sums cannot
// saturate; AVX2's 16-bit pair sums of such bytes would).
template <bool Biased = false>
RP_INLINE __m256i iq4nl_table() {
  const void* table = Biased ? static_cast<const void*>(kIq4nlBiased.v) : static_cast<const void*>(kIq4nlSigned.v);
  return _mm256_broadcastsi128_si256(_mm_load_si128(static_cast<const __m128i*>(table)));
}

// The table values (Biased: plus 128) of a nibble chunk's low (High = false)
// or high nibbles.
template <bool High, bool Biased = false>
RP_INLINE __m256i iq4nl_lookup(__m256i v) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  return _mm256_shuffle_epi8(iq4nl_table<Biased>(), _mm256_and_si256(High ? _mm256_srli_epi16(v, 4) : v, nibble));
}

// is[h] += rows 8h..8h+7's dots of the table values of 32 elements, whose
// nibbles are in 4 chunks of 64 bytes at p (as Q4_0's: low nibbles elements
// 4c..4c+3, high nibbles 16+4c..16+4c+3), with the activation block xb.
// AVX2 takes the signed values through the sign trick (its 16-bit pair sums
// of unsigned bytes up to 241 would saturate); AVX-VNNI looks up the values
// plus 128 and adds them with vpdpbusd, whose 32-bit sums cannot, from -128
// * the block's activation sum (two vpsignb fewer a lookup).
RP_INLINE void iq4nl_dots(const uint8_t* p, const XBlock& xb, __m256i (&is)[2]) {
#ifdef REPRISE_AVX_VNNI
  const __m256i start = _mm256_set1_epi32(-128 * (xb.sum_lo + xb.sum_hi));
  for (int h = 0; h < 2; ++h) is[h] = _mm256_add_epi32(is[h], start);
#endif
  [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          int32_t ql, qh;
          std::memcpy(&ql, xb.qs + 4 * C, 4);
          std::memcpy(&qh, xb.qs + 16 + 4 * C, 4);
          const __m256i xl = _mm256_set1_epi32(ql), xh = _mm256_set1_epi32(qh);
          for (int h = 0; h < 2; ++h) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + C * 64 + 32 * h));
#ifdef REPRISE_AVX_VNNI
            is[h] = _mm256_dpbusd_avx_epi32(
                _mm256_dpbusd_avx_epi32(is[h], iq4nl_lookup<false, true>(v), xl), iq4nl_lookup<true, true>(v), xh);
#else
            is[h] = dot_s8_acc(dot_s8_acc(is[h], iq4nl_lookup<false>(v), xl), iq4nl_lookup<true>(v), xh);
#endif
          }
        }(),
        ...);
  }(std::make_integer_sequence<int, 4>{});
}

// Plane bit K of each byte moved to bit 4 (see the AVX-512 version).
template <int K>
RP_INLINE __m256i fifth_bits(__m256i plane) {
  const __m256i v = K <= 4 ? _mm256_slli_epi16(plane, 4 - K) : _mm256_srli_epi16(plane, K - 4);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// Activation chunk c (bytes 4c..4c+3) of xb in every 32-bit lane.
RP_INLINE __m256i broadcast_chunk(const XBlock& xb, int c) {
  int32_t q;
  std::memcpy(&q, xb.qs + 4 * c, 4);
  return _mm256_set1_epi32(q);
}

// kNext: requests the next tile's weights (requests_next_groups).
template <QType Q, int G, int T, bool kNext = false>
void tile_q(const MatmulArgs& a, int64_t g0, int64_t t0) {
  constexpr size_t kBytes = kBlockBytes<Q>;
  constexpr size_t kQuants = kQuantOffset<Q>;
  const uint8_t* w = a.w + g0 * a.group_stride;
  const XBlock* x = static_cast<const XBlock*>(a.x) + x_offset(a.t0 + t0, 0, a.x_tile, a.x_k);
  const size_t gb = a.group_stride, us = a.unit_stride;
  const int64_t xs = a.x_tile;
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  __m256 acc[G][T][2];
  init_acc<G, T>(a, g0, t0, acc);
  for (int64_t b = a.k_begin / kQK8_0; b < a.k_end / kQK8_0; ++b) {
    // Decode streams the weights once: prefetch each group's stream ahead.
    if (a.prefetch > 0) prefetch_share<G, kBytes, 1>(w + b * us, gb, us, g0, 0, a.prefetch);
    if constexpr (kNext) prefetch_next_groups<G, kBytes, 1>(a, g0, b * us, 0);
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      const uint8_t* wb = w + g * gb + b * us;
      const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb)));
      const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb) + 1));
      // Without VNNI a Q8_0 chunk's weights are unbiased and made absolute
      // (2 operations a half) before vpmaddubsw: for several tokens, once a
      // chunk rather than once a token (the tokens' sums are exact integers
      // either way).
      constexpr bool kHoistQ8 = Q == QType::Q8_0 && kPartials16 && T > 1;
      [[maybe_unused]] __m256i q8_sums[kHoistQ8 ? T : 1][2];
      if constexpr (kHoistQ8) {
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) q8_sums[t][0] = q8_sums[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          const __m256i* wc = reinterpret_cast<const __m256i*>(wb + 32 + c * 64);
          const __m256i q0 = q8_unbiased(_mm256_loadu_si256(wc));
          const __m256i q1 = q8_unbiased(_mm256_loadu_si256(wc + 1));
          const __m256i u0 = _mm256_sign_epi8(q0, q0), u1 = _mm256_sign_epi8(q1, q1);
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            const __m256i xv = broadcast_chunk(x[b * xs + t], c);
            q8_sums[t][0] = dot_u8_acc(q8_sums[t][0], u0, _mm256_sign_epi8(xv, q0));
            q8_sums[t][1] = dot_u8_acc(q8_sums[t][1], u1, _mm256_sign_epi8(xv, q1));
          }
        }
      }
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const XBlock& xb = x[b * xs + t];
        __m256i i0, i1;
        if constexpr (kHoistQ8) {
          i0 = q8_sums[t][0];
          i1 = q8_sums[t][1];
        } else if constexpr (Q == QType::Q8_0) {
          // Two chains per half (even and odd chunks): vpdpbusd's latency
          // would otherwise bound the tile.
          __m256i s0[2] = {q8_start(xb), _mm256_setzero_si256()};
          __m256i s1[2] = {s0[0], _mm256_setzero_si256()};
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) {
            int32_t q;
            std::memcpy(&q, xb.qs + 4 * c, 4);
            const __m256i xv = _mm256_set1_epi32(q);
            const __m256i* wc = reinterpret_cast<const __m256i*>(wb + 32 + c * 64);
            s0[c & 1] = q8_dot_acc(s0[c & 1], _mm256_loadu_si256(wc), xv);
            s1[c & 1] = q8_dot_acc(s1[c & 1], _mm256_loadu_si256(wc + 1), xv);
          }
          i0 = _mm256_add_epi32(s0[0], s0[1]);
          i1 = _mm256_add_epi32(s1[0], s1[1]);
        } else if constexpr (Q == QType::IQ4NL) {
          // Signed table values, as Q8_0's quants (no correction).
          __m256i is[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
          iq4nl_dots(wb + kQuants, xb, is);
          i0 = is[0];
          i1 = is[1];
        } else {
          // Products of unsigned quants add up in 16 bits before widening:
          // 4-bit quants over the whole block (a pair is at most 2 * 15 *
          // 128 = 3840 in magnitude, 8 pairs per lane fit), 5-bit ones over
          // each half (7936, 4 pairs). Integer sums are exact either way.
          __m256i lo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
          __m256i hi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
          [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
            (
                [&]() RP_INLINE_LAMBDA {
                  int32_t ql, qh;
                  std::memcpy(&ql, xb.qs + 4 * C, 4);
                  std::memcpy(&qh, xb.qs + 16 + 4 * C, 4);
                  const __m256i xl = _mm256_set1_epi32(ql), xh = _mm256_set1_epi32(qh);
                  for (int h = 0; h < 2; ++h) {
                    const __m256i v =
                        loaded_once(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kQuants + C * 64) + h));
                    __m256i ul = _mm256_and_si256(v, nibble);
                    __m256i uh = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
                    if constexpr (kHasFifthBit<Q>) {
                      const __m256i plane =
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kQuants + 256) + h);
                      ul = _mm256_or_si256(ul, fifth_bits<C>(plane));
                      uh = _mm256_or_si256(uh, fifth_bits<4 + C>(plane));
                    }
                    lo[h] = partial_add(lo[h], ul, xl);
                    hi[h] = partial_add(hi[h], uh, xh);
                  }
                }(),
                ...);
          }(std::make_integer_sequence<int, 4>{});
          const int32_t corr = Q == QType::Q4_0 ? xb.corr_q4 : Q == QType::Q5_0 ? 2 * xb.corr_q4 : 0;
          const __m256i c = _mm256_set1_epi32(corr);
          if constexpr (kHasFifthBit<Q>) {
            i0 = _mm256_add_epi32(c, _mm256_add_epi32(partial_widen(lo[0]), partial_widen(hi[0])));
            i1 = _mm256_add_epi32(c, _mm256_add_epi32(partial_widen(lo[1]), partial_widen(hi[1])));
          } else {
            i0 = _mm256_add_epi32(c, partial_widen(partial_sum(lo[0], hi[0])));
            i1 = _mm256_add_epi32(c, partial_widen(partial_sum(lo[1], hi[1])));
          }
        }
        const __m256 dx = _mm256_set1_ps(xb.d);
        acc[g][t][0] = _mm256_fmadd_ps(_mm256_mul_ps(dw0, dx), _mm256_cvtepi32_ps(i0), acc[g][t][0]);
        acc[g][t][1] = _mm256_fmadd_ps(_mm256_mul_ps(dw1, dx), _mm256_cvtepi32_ps(i1), acc[g][t][1]);
        if constexpr (kHasMin<Q>) {
          const __m256 mw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 32)));
          const __m256 mw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 32) + 1));
          const __m256 sum = _mm256_set1_ps(static_cast<float>(xb.sum_lo + xb.sum_hi));
          acc[g][t][0] = _mm256_fmadd_ps(_mm256_mul_ps(mw0, dx), sum, acc[g][t][0]);
          acc[g][t][1] = _mm256_fmadd_ps(_mm256_mul_ps(mw1, dx), sum, acc[g][t][1]);
        }
      }
    }
  }
  store_acc<G, T>(a, g0, t0, acc);
}


// Rows 8h..8h+7 of chunk C's unsigned quants of sub-block 2 * pair + Odd of
// a K-type section; see the AVX-512 version.
template <KType KT, bool Odd, int C>
RP_INLINE __m256i k_affine_chunk(const uint8_t* sec, int pair, int h) {
  if constexpr (KT == KType::Q6KWide) {
    return _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(sec + kQ6KQuants + (2 * pair + Odd) * 512 + C * 64 + 32 * h));
  } else if constexpr (KT == KType::Q6K) {
    // Quad C % 4's lines (kernels_impl.h): three chunks are a line's low 6
    // bits, the odd sub-block's second half gathers the lines' bits 6-7.
    auto line = [&](int l) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sec + q6k_line_at(pair, C % 4, l) + 32 * h));
    };
    if constexpr (!Odd || C < 4) {
      return _mm256_and_si256(line(!Odd ? C / 4 : 2), _mm256_set1_epi8(0x3f));
    } else {
      const __m256i d0 = _mm256_and_si256(_mm256_srli_epi16(line(0), 6), _mm256_set1_epi8(0x03));
      const __m256i d1 = _mm256_and_si256(_mm256_srli_epi16(line(1), 4), _mm256_set1_epi8(0x0c));
      const __m256i d2 = _mm256_and_si256(_mm256_srli_epi16(line(2), 2), _mm256_set1_epi8(0x30));
      return _mm256_or_si256(_mm256_or_si256(d0, d1), d2);
    }
  } else if constexpr (KT == KType::Q5K) {
    // Sub-block 2 * pair + Odd's lines (kernels_impl.h): chunks 0-4 are a
    // line's low 5 bits, chunks 5-7 gather the lines' bits 5-7.
    auto line = [&](int l) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sec + q5k_line_at(2 * pair + Odd, l) + 32 * h));
    };
    auto bits = [](__m256i v, int down, int mask) {
      return _mm256_and_si256(_mm256_srli_epi16(v, down), _mm256_set1_epi8(static_cast<char>(mask)));
    };
    if constexpr (C < 5) return _mm256_and_si256(line(C), _mm256_set1_epi8(0x1f));
    else if constexpr (C == 5) return _mm256_or_si256(bits(line(0), 5, 0x07), bits(line(1), 2, 0x18));
    else if constexpr (C == 6) return _mm256_or_si256(bits(line(2), 5, 0x07), bits(line(3), 2, 0x18));
    else
      return _mm256_or_si256(_mm256_or_si256(bits(line(4), 5, 0x07), bits(line(1), 4, 0x08)), bits(line(3), 3, 0x10));
  } else {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sec + kQ4KNibbles + pair * 512 + C * 64 + 32 * h));
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    return Odd ? _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble) : _mm256_and_si256(v, nibble);
  }
}

// isum[h] += sc[j] * (rows 8h..8h+7's dots of sub-block j = 2 * pair + Odd's
// unsigned Q4_K/Q5_K quants with the activation block xb).
template <KType KT, bool Odd>
RP_INLINE void k_affine_block(const uint8_t* sec, int pair, const XBlock& xb, __m256i (&isum)[2]) {
  const int j = 2 * pair + (Odd ? 1 : 0);
  __m256i is[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  dot_u8_chunks<KT == KType::Q5K ? 5 : 4>(
      is, [&](auto c, int h) RP_INLINE_LAMBDA { return k_affine_chunk<KT, Odd, decltype(c)::value>(sec, pair, h); },
      [&](auto c) RP_INLINE_LAMBDA { return broadcast_chunk(xb, decltype(c)::value); });
  for (int h = 0; h < 2; ++h) {
    const __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + kQ4KScales + j * 16 + 8 * h)));
    isum[h] = _mm256_add_epi32(isum[h], _mm256_mullo_epi32(is[h], sc));
  }
}

// The same for block 2 * pair + Odd of Q6_K weights: each half's dot of u
// with the activations, less 32 * their sum, times its signed scale. Each
// chunk's dots are widened at once: AVX2's 16-bit partials of 2 chunks
// (dot_u8_chunks) decoded 0.88-0.94x (60M, paired), though fewer instructions.
template <KType KT, bool Odd>
RP_INLINE void q6k_block(const uint8_t* sec, int pair, const XBlock& xb, __m256i (&isum)[2]) {
  const int j = 2 * pair + (Odd ? 1 : 0);
  const __m256i lo0 = _mm256_set1_epi32(-32 * xb.sum_lo), hi0 = _mm256_set1_epi32(-32 * xb.sum_hi);
  __m256i lo[2] = {lo0, lo0}, hi[2] = {hi0, hi0};
  [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          int32_t q;
          std::memcpy(&q, xb.qs + 4 * C, 4);
          const __m256i xv = _mm256_set1_epi32(q);
          for (int h = 0; h < 2; ++h) {
            const __m256i w = k_affine_chunk<KT, Odd, C>(sec, pair, h);
            if constexpr (C < 4) lo[h] = dot_u8_acc(lo[h], w, xv);
            else hi[h] = dot_u8_acc(hi[h], w, xv);
          }
        }(),
        ...);
  }(std::make_integer_sequence<int, 8>{});
  for (int h = 0; h < 2; ++h) {
    const __m256i sc_lo =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + 64 + 2 * j * 16 + 8 * h)));
    const __m256i sc_hi =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + 64 + (2 * j + 1) * 16 + 8 * h)));
    isum[h] = _mm256_add_epi32(isum[h], _mm256_add_epi32(_mm256_mullo_epi32(lo[h], sc_lo), _mm256_mullo_epi32(hi[h], sc_hi)));
  }
}

// isum[h] += sc[j] (signed) * (rows 8h..8h+7's dots of IQ4_XS sub-block j's
// table values with the activation block xb).
RP_INLINE void iq4xs_block(const uint8_t* sec, int j, const XBlock& xb, __m256i (&isum)[2]) {
  __m256i is[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  iq4nl_dots(sec + kIq4XsNibbles + j * 256, xb, is);
  for (int h = 0; h < 2; ++h) {
    const __m256i sc =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + kIq4XsScales + j * 16 + 8 * h)));
    isum[h] = _mm256_add_epi32(isum[h], _mm256_mullo_epi32(is[h], sc));
  }
}

// Rows 8h8..8h8+7's quants (0..3) of chunk c of Q2_K quad `quad`, bits
// 2S..2S+1 of its bytes.
template <int S>
RP_INLINE __m256i q2k_chunk(const uint8_t* sec, int quad, int c, int h8) {
  const __m256i v =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sec + q2k_line_at(quad, c) + 32 * h8));
  return _mm256_and_si256(S > 0 ? _mm256_srli_epi16(v, 2 * S) : v, _mm256_set1_epi8(3));
}

// For T tokens (activation blocks xb[t], the block 4h + S of quad 2h + b):
// isum[t] += sc[k] * the dots of Q2_K sub-block k = 8h + 2S + b. The 16-bit
// pair sums of 4 chunks stay below 4 * 2 * 3 * 127.
template <int S, int T>
RP_INLINE void q2k_sub_block_tokens(const uint8_t* sec, int quad, const XBlock* xb, int32_t (*isum)[16]) {
  const int b = quad % 2, k = 8 * (quad / 2) + 2 * S + b;
  __m256i wq[4][2];
  for (int c = 0; c < 4; ++c)
    for (int h8 = 0; h8 < 2; ++h8) wq[c][h8] = q2k_chunk<S>(sec, quad, c, h8);
  __m256i sc[2];
  for (int h8 = 0; h8 < 2; ++h8)
    sc[h8] = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + q2k_scales_at(k) + 8 * h8)));
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    __m256i part[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      int32_t q;
      std::memcpy(&q, xb[t].qs + 16 * b + 4 * c, 4);
      const __m256i xv = _mm256_set1_epi32(q);
      for (int h8 = 0; h8 < 2; ++h8) part[h8] = partial_add(part[h8], wq[c][h8], xv);
    }
    auto* m = reinterpret_cast<__m256i*>(isum[t]);
    for (int h8 = 0; h8 < 2; ++h8) {
      const __m256i v = _mm256_mullo_epi32(partial_widen(part[h8]), sc[h8]);
      _mm256_store_si256(m + h8, _mm256_add_epi32(_mm256_load_si256(m + h8), v));
    }
  }
}

// Decode: isum[h8] += quad `quad`'s four scaled sub-block dots (activation
// blocks xq[S * xs], S = 0..3).
RP_INLINE void q2k_quad(const uint8_t* sec, int quad, const XBlock* xq, int64_t xs, __m256i (&isum)[2]) {
  const int b = quad % 2;
  [&]<int... S>(std::integer_sequence<int, S...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          const XBlock& xb = xq[S * xs];
          const int k = 8 * (quad / 2) + 2 * S + b;
          __m256i part[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
          for (int c = 0; c < 4; ++c) {
            int32_t q;
            std::memcpy(&q, xb.qs + 16 * b + 4 * c, 4);
            const __m256i xv = _mm256_set1_epi32(q);
            for (int h8 = 0; h8 < 2; ++h8)
              part[h8] = partial_add(part[h8], q2k_chunk<S>(sec, quad, c, h8), xv);
          }
          for (int h8 = 0; h8 < 2; ++h8) {
            const __m256i sc = _mm256_cvtepu8_epi32(
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + q2k_scales_at(k) + 8 * h8)));
            isum[h8] = _mm256_add_epi32(isum[h8],
                                        _mm256_mullo_epi32(partial_widen(part[h8]), sc));
          }
        }(),
        ...);
  }(std::make_integer_sequence<int, 4>{});
}

// Rows 8h8..8h8+7's values u (0..7, q + 4) of chunk C of Q3_K sub-block
// pair m (chunks 0-3: sub-block 2m's, 4-7: 2m + 1's), from the pair's three
// lines (kernels_impl.h): a field of one line, or chunk 3 of either gathered
// from two lines' bits 6-7 (16-bit shifts; what crosses a byte is masked off).
template <int C>
RP_INLINE __m256i q3k_chunk(const uint8_t* sec, int m, int h8) {
  auto line = [&](int l) RP_INLINE_LAMBDA {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sec + q3k_line_at(m, l) + 32 * h8));
  };
  const __m256i seven = _mm256_set1_epi8(7);
  if constexpr (C < 3) return _mm256_and_si256(line(C), seven);
  if constexpr (C >= 4 && C < 7) return _mm256_and_si256(_mm256_srli_epi16(line(C - 4), 3), seven);
  // Chunk 3: A bits 6-7 and B bit 6; chunk 7: B bit 7 and C bits 6-7.
  const __m256i lo = C == 3 ? _mm256_srli_epi16(line(0), 6) : _mm256_srli_epi16(line(1), 7);
  const __m256i hi = C == 3 ? _mm256_srli_epi16(line(1), 4) : _mm256_srli_epi16(line(2), 5);
  return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi8(C == 3 ? 3 : 1)),
                         _mm256_and_si256(hi, _mm256_set1_epi8(C == 3 ? 4 : 6)));
}

// Q3_K sub-block k's signed scales, rows 8h8..8h8+7.
RP_INLINE __m256i q3k_scales(const uint8_t* sec, int k, int h8) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + kQ3KScales + k * 16 + 8 * h8)));
}

// For T tokens (activation blocks xb[t], the block m): isum[t] += sc[k] * the
// dots of Q3_K sub-block k = 2m + Odd, as dot(q + 4, x) - 4 * (the half's
// activation sum). The 16-bit pair sums of 4 chunks stay below 4 * 2 * 7 *
// 128.
template <bool Odd, int T>
RP_INLINE void q3k_sub_block_tokens(const uint8_t* sec, int m, const XBlock* xb, int32_t (*isum)[16]) {
  const int k = 2 * m + Odd;
  __m256i wq[4][2];
  [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
    ((wq[C][0] = q3k_chunk<4 * Odd + C>(sec, m, 0), wq[C][1] = q3k_chunk<4 * Odd + C>(sec, m, 1)), ...);
  }(std::make_integer_sequence<int, 4>{});
  const __m256i sc[2] = {q3k_scales(sec, k, 0), q3k_scales(sec, k, 1)};
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    __m256i part[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      int32_t q;
      std::memcpy(&q, xb[t].qs + 16 * Odd + 4 * c, 4);
      const __m256i xv = _mm256_set1_epi32(q);
      for (int h8 = 0; h8 < 2; ++h8) part[h8] = partial_add(part[h8], wq[c][h8], xv);
    }
    const __m256i start = _mm256_set1_epi32(-4 * (Odd ? xb[t].sum_hi : xb[t].sum_lo));
    auto* acc = reinterpret_cast<__m256i*>(isum[t]);
    for (int h8 = 0; h8 < 2; ++h8) {
      const __m256i dot = _mm256_add_epi32(partial_widen(part[h8]), start);
      _mm256_store_si256(acc + h8, _mm256_add_epi32(_mm256_load_si256(acc + h8), _mm256_mullo_epi32(dot, sc[h8])));
    }
  }
}

// Decode: isum[h8] += sub-block k = 2m + Odd's scaled dots (activation block
// xb, the block m).
template <bool Odd>
RP_INLINE void q3k_sub_block(const uint8_t* sec, int m, const XBlock& xb, __m256i (&isum)[2]) {
  __m256i part[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
    (
        [&]() RP_INLINE_LAMBDA {
          int32_t q;
          std::memcpy(&q, xb.qs + 16 * Odd + 4 * C, 4);
          const __m256i xv = _mm256_set1_epi32(q);
          for (int h8 = 0; h8 < 2; ++h8) part[h8] = partial_add(part[h8], q3k_chunk<4 * Odd + C>(sec, m, h8), xv);
        }(),
        ...);
  }(std::make_integer_sequence<int, 4>{});
  const __m256i start = _mm256_set1_epi32(-4 * (Odd ? xb.sum_hi : xb.sum_lo));
  for (int h8 = 0; h8 < 2; ++h8) {
    const __m256i dot = _mm256_add_epi32(partial_widen(part[h8]), start);
    isum[h8] = _mm256_add_epi32(isum[h8], _mm256_mullo_epi32(dot, q3k_scales(sec, 2 * m + Odd, h8)));
  }
}

// Adds a super-block's float updates for one (group, token) to acc (rows
// 0-7, 8-15): y = fma(d * dx, float(isum), y), and for Q4_K/Q5_K the mins'
// y = fma(dmin * dx, float(-msum), y).
template <KType KT>
RP_INLINE void k_finish(const uint8_t* sec, const XBlock* xsec, int64_t xs, int t, const __m256i (&isum)[2],
                        __m256 (&acc)[2]) {
  const __m256 dx = _mm256_set1_ps(xsec[t].d);
  for (int h = 0; h < 2; ++h) {
    const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(sec) + 8 * h);
    acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum[h]), acc[h]);
  }
  if constexpr (KT == KType::Q4K || KT == KType::Q5K || KT == KType::Q2K) {
    // Q4_K/Q5_K: a min pair per two blocks; Q2_K: per block (its halves).
    constexpr bool kQ2 = KT == KType::Q2K;
    __m256i msum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int p = 0; p < (kQ2 ? 8 : 4); ++p) {
      const __m256i np = _mm256_set1_epi32(kQ2 ? neg_xsum_halves(xsec[p * xs + t])
                                               : neg_xsum_pair(xsec[2 * p * xs + t], xsec[(2 * p + 1) * xs + t]));
      for (int h = 0; h < 2; ++h) {
        const __m256i m = _mm256_cvtepu8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sec + (kQ2 ? kQ2KMins : kQ4KMins) + p * 32 + 16 * h)));
        msum[h] = _mm256_add_epi32(msum[h], _mm256_madd_epi16(m, np));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 dmin = _mm256_loadu_ps(reinterpret_cast<const float*>(sec) + 16 + 8 * h);
      acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(msum[h]), acc[h]);
    }
  }
}

// Requests Q6_K pair p's 12 lines in address order. The AVX2 tiles unpack a
// pair half by half (A lines, then B, then C, then all three: a 192-byte
// stride; reading the quads front to back as AVX-512 does needs four chains
// side by side, which spill AVX2's 16 registers), and memory serves that
// order slower than this one: end to end, paired, the 189 MB Q6_K model
// tg64 AVX2 1.09-1.31x, AVX-VNNI 1.05-1.07x, its Q4_K_M twin 1.11-1.16x
// (docs/performance.md, session 40). Small batches gained nothing from it
// (1.00x), so only decode requests.
RP_INLINE void request_q6k_pair(const uint8_t* sec, int p) {
  for (int i = 0; i < 12; ++i) _mm_prefetch(reinterpret_cast<const char*>(sec + q6k_line_at(p, 0, 0) + i * 64), _MM_HINT_T0);
}

// isum += the block 2 * pair + Odd's scaled dots (k_affine_block,
// iq4xs_block or q6k_block).
template <KType KT, bool Odd>
RP_INLINE void k_block(const uint8_t* sec, int pair, const XBlock& xb, __m256i (&isum)[2]) {
  if constexpr (KT == KType::Q4K || KT == KType::Q5K) k_affine_block<KT, Odd>(sec, pair, xb, isum);
  else if constexpr (KT == KType::IQ4XS) iq4xs_block(sec, 2 * pair + (Odd ? 1 : 0), xb, isum);
  else q6k_block<KT, Odd>(sec, pair, xb, isum);
}

// For T tokens (activation blocks xb[t]): isum[t] += block 2 * pair + Odd's
// scaled dots, as k_block does for one; the block's chunks are unpacked once
// for all the tokens. (Decode through this function, sums in memory,
// measured 0.86-0.97x the k_block path, so both stay.)
template <KType KT, bool Odd, int T>
RP_INLINE void k_block_tokens(const uint8_t* sec, int pair, const XBlock* xb, int32_t (*isum)[16]) {
  constexpr bool kAffine = KT == KType::Q4K || KT == KType::Q5K;
  // IQ4_XS: signed table values (the sign-trick dot), one scale per block.
  constexpr bool kTable = KT == KType::IQ4XS;
  const int j = 2 * pair + (Odd ? 1 : 0);
  __m256i wq[8][2];
  if constexpr (kTable) {
    for (int c = 0; c < 4; ++c)
      for (int h = 0; h < 2; ++h) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sec + kIq4XsNibbles + j * 256 + c * 64 + 32 * h));
        wq[c][h] = iq4nl_lookup<false>(v);
        wq[4 + c][h] = iq4nl_lookup<true>(v);
      }
  } else {
    [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
      ((wq[C][0] = k_affine_chunk<KT, Odd, C>(sec, pair, 0), wq[C][1] = k_affine_chunk<KT, Odd, C>(sec, pair, 1)), ...);
    }(std::make_integer_sequence<int, 8>{});
  }
  // Scales of the block's first and last 16 elements (the same for Q4_K/Q5_K
  // and IQ4_XS).
  __m256i sc[2][2];
  for (int h = 0; h < 2; ++h) {
    if constexpr (kAffine) {
      sc[0][h] = sc[1][h] =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + kQ4KScales + j * 16 + 8 * h)));
    } else if constexpr (kTable) {
      sc[0][h] = sc[1][h] =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + kIq4XsScales + j * 16 + 8 * h)));
    } else {
      for (int half = 0; half < 2; ++half)
        sc[half][h] = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + 64 + (2 * j + half) * 16 + 8 * h)));
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    const __m256i lo0 = _mm256_set1_epi32(kAffine || kTable ? 0 : -32 * xb[t].sum_lo);
    const __m256i hi0 = _mm256_set1_epi32(kAffine || kTable ? 0 : -32 * xb[t].sum_hi);
    __m256i lo[2] = {lo0, lo0}, hi[2] = {hi0, hi0};
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      int32_t q;
      std::memcpy(&q, xb[t].qs + 4 * c, 4);
      const __m256i xv = _mm256_set1_epi32(q);
      for (int h = 0; h < 2; ++h) {
        __m256i& sum = c < 4 ? lo[h] : hi[h];
        sum = kTable ? dot_s8_acc(sum, wq[c][h], xv) : dot_u8_acc(sum, wq[c][h], xv);
      }
    }
    auto* m = reinterpret_cast<__m256i*>(isum[t]);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = kAffine || kTable ? _mm256_mullo_epi32(_mm256_add_epi32(lo[h], hi[h]), sc[0][h])
                                : _mm256_add_epi32(_mm256_mullo_epi32(lo[h], sc[0][h]), _mm256_mullo_epi32(hi[h], sc[1][h]));
      _mm256_store_si256(m + h, _mm256_add_epi32(_mm256_load_si256(m + h), v));
    }
  }
}

// A K-type tile's first group's sections and its first token's activation
// blocks (Q8_K: 8 per section, x_tile apart).
struct KTileOperands {
  const uint8_t* w;
  const XBlock* x;
  size_t gb, us;  // group and section strides
  int64_t xs;     // activation block stride
  KTileOperands(const MatmulArgs& a, int64_t g0, int64_t t0)
      : w(a.w + g0 * a.group_stride),
        x(static_cast<const XBlock*>(a.x) + x_offset(a.t0 + t0, 0, a.x_tile, a.x_k)),
        gb(a.group_stride),
        us(a.unit_stride),
        xs(a.x_tile) {}
  const uint8_t* section(int g, int64_t s) const { return w + g * gb + s * us; }
};

// Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS weights against Q8_K activations (rule in
// kernels_impl.h); 16 registers shape the loops.
//   Decode (T = 1): one group at a time through a whole super-block, its
//   integer sums and float accumulators in registers.
//   Prompts: block by block over the groups (k_block_tokens), the float
//   accumulators in registers and the integer sums in memory (one load and
//   store per block per output). (Q4_K/Q5_K/IQ4_XS prompts and the small
//   batches of those and Q6_K take tile_k_small instead; see run_k_tiles.)
// kNext: requests the next tile's weights (requests_next_groups).
template <KType KT, int G, int T, bool kNext = false>
void tile_k(const MatmulArgs& a, int64_t g0, int64_t t0) {
  constexpr size_t kSec = kSection<KT>;
  const uint8_t* w = a.w + g0 * a.group_stride;
  const XBlock* x = static_cast<const XBlock*>(a.x) + x_offset(a.t0 + t0, 0, a.x_tile, a.x_k);
  const size_t gb = a.group_stride, us = a.unit_stride;
  const int64_t xs = a.x_tile;
  __m256 acc[G][T][2];
  init_acc<G, T>(a, g0, t0, acc);
  for (int64_t s = a.k_begin / kQK_K; s < a.k_end / kQK_K; ++s) {
    const XBlock* xsec = x + s * 8 * xs;
    if constexpr (T == 1) {
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) {
        const uint8_t* sec = w + g * gb + s * us;
        __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int p = 0; p < 4; ++p) {
          if (a.prefetch > 0) prefetch_share_at<1, kSec, 4>(sec, gb, us, g0 + g, p, a.prefetch);
          if constexpr (KT == KType::Q6K) request_q6k_pair(sec, p);
          if constexpr (KT == KType::Q2K) {
            q2k_quad(sec, p, xsec + 4 * (p / 2) * xs, xs, isum);
          } else if constexpr (KT == KType::Q3K) {
            for (int m = 2 * p; m < 2 * p + 2; ++m) {
              q3k_sub_block<false>(sec, m, xsec[m * xs], isum);
              q3k_sub_block<true>(sec, m, xsec[m * xs], isum);
            }
          } else {
            k_block<KT, false>(sec, p, xsec[2 * p * xs], isum);
            k_block<KT, true>(sec, p, xsec[(2 * p + 1) * xs], isum);
          }
        }
        k_finish<KT>(sec, xsec, xs, 0, isum, acc[g][0]);
      }
    } else {
      alignas(32) int32_t isum_mem[G][T][16] = {};
      for (int p = 0; p < 4; ++p) {
        if constexpr (kNext) prefetch_next_groups<G, kSec, 4>(a, g0, s * us, p);
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) {
          const uint8_t* sec = w + g * gb + s * us;
          if constexpr (KT == KType::Q2K) {
            const XBlock* xq = xsec + 4 * (p / 2) * xs;
            q2k_sub_block_tokens<0, T>(sec, p, xq, isum_mem[g]);
            q2k_sub_block_tokens<1, T>(sec, p, xq + xs, isum_mem[g]);
            q2k_sub_block_tokens<2, T>(sec, p, xq + 2 * xs, isum_mem[g]);
            q2k_sub_block_tokens<3, T>(sec, p, xq + 3 * xs, isum_mem[g]);
          } else if constexpr (KT == KType::Q3K) {
            for (int m = 2 * p; m < 2 * p + 2; ++m) {
              q3k_sub_block_tokens<false, T>(sec, m, xsec + m * xs, isum_mem[g]);
              q3k_sub_block_tokens<true, T>(sec, m, xsec + m * xs, isum_mem[g]);
            }
          } else {
            k_block_tokens<KT, false, T>(sec, p, xsec + 2 * p * xs, isum_mem[g]);
            k_block_tokens<KT, true, T>(sec, p, xsec + (2 * p + 1) * xs, isum_mem[g]);
          }
        }
      }
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          const auto* m = reinterpret_cast<const __m256i*>(isum_mem[g][t]);
          const __m256i isum[2] = {_mm256_load_si256(m), _mm256_load_si256(m + 1)};
          k_finish<KT>(w + g * gb + s * us, xsec, xs, t, isum, acc[g][t]);
        }
    }
  }
  store_acc<G, T>(a, g0, t0, acc);
}

// Small batches of Q4_K / Q5_K / Q6_K / IQ4_XS (several sequences decoding
// together) read each unpacked chunk once for all their tokens, where
// prompt tiles keep 16 chunks in registers (so AVX2 spills them) and decode
// tiles unpack per token. One half of a group's rows (8 rows, one register
// per token) at a time: 16 registers hold the T tokens' partials, block
// sums and section sums with the chunk and its activations.
// Passes of at most kSmallBatchTokens<KT> tokens: Q4_K's unpacking (a mask,
// a shift) saves little when shared, and its 4-token tile ran slower per
// token than its 2-token one: passes of 2 ran 1.06x passes of 4 (60M, 8
// sequences). Q5_K's passes of 4 ran 1.13x passes of 3 (4 sequences).
// AVX-VNNI's dots take one instruction a chunk, and for Q4_K its token by
// token decode tiles (1) stay ahead: the small tile ran 0.95-0.98x (2 and 4
// sequences), where Q5_K ran 1.13x and Q6_K 1.00-1.07x. IQ4_XS (passes of
// 4): 1.13-1.17x on AVX2, 1.15-1.29x on AVX-VNNI (2 and 4 sequences).
template <KType KT>
constexpr int kSmallBatchTokens = KT != KType::Q4K ? 4 : kPartials16 ? 2 : 1;
// The types tile_k_small serves; Q2_K and Q3_K take their prompt tiles in
// the same passes (see kDecodeGroupsQ).
template <KType KT>
constexpr bool kHasSmallTile = KT == KType::Q4K || KT == KType::Q5K || KT == KType::Q6K || KT == KType::IQ4XS;
// Prompts in passes of 4 tokens with the small tile ran faster than the
// prompt tile (k_block_tokens, whose 16 unpacked chunks AVX2 spills): pp512
// Q4_K 1.18x (passes of 2; 4 gained 1.03x more), Q5_K 1.22x; AVX-VNNI Q4_K
// 1.19x, Q5_K 1.26x; IQ4_XS 1.19x, AVX-VNNI 1.51x. Q6_K's stay with the
// prompt tile (1.00x, AVX-VNNI 0.98x), as do Q2_K's and Q3_K's.
template <KType KT>
constexpr bool kPromptsInSmallTiles = kHasSmallTile<KT> && KT != KType::Q6K;

// First dot of a partial (see partial_add).
RP_INLINE __m256i partial_first(__m256i w, __m256i xv) {
  return kPartials16 ? _mm256_maddubs_epi16(w, xv) : partial_add(_mm256_setzero_si256(), w, xv);
}

// part[t] = (First) or += the dots of chunks C0..C0 + N - 1 of rows
// 8h..8h+7 of sub-block 2 * pair + Odd with token t's activation block xb[t]
// (a partial: N within kChunksPerPartial).
// IQ4_XS's quants are signed table values: the sign trick of dot_s8_acc,
// |w| shared by the tokens, each token's activations given w's signs.
template <KType KT, bool Odd, int T, int C0, int N, bool First>
RP_INLINE void k_chunks_tokens(const uint8_t* sec, int pair, int h, const XBlock* xb, __m256i (&part)[T]) {
  // IQ4_XS on AVX2: signed table values through the sign trick; on AVX-VNNI
  // the values plus 128 (k_scaled_tokens subtracts 128 * the activations'
  // sum), as iq4nl_dots reads them.
  constexpr bool kTable = KT == KType::IQ4XS && kPartials16;
  __m256i w;
  if constexpr (KT == KType::IQ4XS) {
    const __m256i v = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(sec + kIq4XsNibbles + (2 * pair + Odd) * 256 + (C0 % 4) * 64 + 32 * h));
    w = iq4nl_lookup<(C0 >= 4), !kTable>(v);
  } else {
    w = k_affine_chunk<KT, Odd, C0>(sec, pair, h);
  }
  const __m256i wu = kTable ? _mm256_sign_epi8(w, w) : w;
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const __m256i x = broadcast_chunk(xb[t], C0);
    const __m256i xv = kTable ? _mm256_sign_epi8(x, w) : x;
    part[t] = First ? partial_first(wu, xv) : partial_add(part[t], wu, xv);
  }
  if constexpr (N > 1) k_chunks_tokens<KT, Odd, T, C0 + 1, N - 1, false>(sec, pair, h, xb, part);
}

// sum[t] = (First) or += the same dots of chunks C0..C0 + N - 1 in 32 bits,
// Per chunks to a partial.
template <KType KT, bool Odd, int T, int C0, int N, int Per, bool First>
RP_INLINE void k_span_tokens(const uint8_t* sec, int pair, int h, const XBlock* xb, __m256i (&sum)[T]) {
  __m256i part[T];
  k_chunks_tokens<KT, Odd, T, C0, Per, true>(sec, pair, h, xb, part);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) sum[t] = First ? partial_widen(part[t]) : _mm256_add_epi32(sum[t], partial_widen(part[t]));
  if constexpr (N > Per) k_span_tokens<KT, Odd, T, C0 + Per, N - Per, Per, false>(sec, pair, h, xb, sum);
}

// is[t] += rows 8h..8h+7's scaled dots of the elements of sub-block
// j = 2 * pair + Odd under scale S (Q4_K/Q5_K/IQ4_XS: one per block; Q6_K: 0 and
// 1 for its two 16-element halves) with token t's activation block xb[t].
template <KType KT, bool Odd, int T, int S>
RP_INLINE void k_scaled_tokens(const uint8_t* sec, int pair, int h, const XBlock* xb, __m256i (&is)[T]) {
  constexpr bool kQ6 = KT == KType::Q6K;
  // IQ4_XS: |w| up to 127 (one chunk per partial).
  constexpr int kBits = KT == KType::Q4K ? 4 : KT == KType::Q5K ? 5 : kQ6 ? 6 : 7;
  constexpr int kSpan = kQ6 ? 4 : 8;  // chunks under one scale
  constexpr int kPer = kPartials16 ? kChunksPerPartial<kBits> : kSpan;
  static_assert(kSpan % kPer == 0);
  const int j = 2 * pair + (Odd ? 1 : 0);
  __m256i sum[T];
  k_span_tokens<KT, Odd, T, S * kSpan, kSpan, kPer, true>(sec, pair, h, xb, sum);
  const size_t scales_at = kQ6                     ? 64 + (2 * j + S) * 16 + 8 * h
                           : KT == KType::IQ4XS ? kIq4XsScales + j * 16 + 8 * h
                                                  : kQ4KScales + j * 16 + 8 * h;
  const __m128i scale_bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sec + scales_at));
  // Q4_K/Q5_K's scales are unsigned, Q6_K's and IQ4_XS's signed.
  const __m256i sc = kQ6 || KT == KType::IQ4XS ? _mm256_cvtepi8_epi32(scale_bytes) : _mm256_cvtepu8_epi32(scale_bytes);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    // Q6_K's quants are u - 32: less 32 * the activations' sum.
    if constexpr (kQ6)
      sum[t] = _mm256_add_epi32(sum[t], _mm256_set1_epi32(-32 * (S == 0 ? xb[t].sum_lo : xb[t].sum_hi)));
    // IQ4_XS on AVX-VNNI: table values plus 128 (k_chunks_tokens).
    if constexpr (KT == KType::IQ4XS && !kPartials16)
      sum[t] = _mm256_add_epi32(sum[t], _mm256_set1_epi32(-128 * (xb[t].sum_lo + xb[t].sum_hi)));
    is[t] = _mm256_add_epi32(is[t], _mm256_mullo_epi32(sum[t], sc));
  }
}

// is[t] += rows 8h..8h+7's scaled dots of sub-block 2 * pair + Odd with
// token t's activation block xb[t]: the integers k_block adds for that half.
template <KType KT, bool Odd, int T>
RP_INLINE void k_block_half_tokens(const uint8_t* sec, int pair, int h, const XBlock* xb, __m256i (&is)[T]) {
  k_scaled_tokens<KT, Odd, T, 0>(sec, pair, h, xb, is);
  if constexpr (KT == KType::Q6K) k_scaled_tokens<KT, Odd, T, 1>(sec, pair, h, xb, is);
}

// G groups x T tokens of a small batch: group by group through each
// super-block, as the decode tile goes (so interleaved pairs are read in
// order), each half of the group's rows for all T tokens at once.
template <KType KT, int G, int T>
void tile_k_small(const MatmulArgs& a, int64_t g0, int64_t t0) {
  const KTileOperands op(a, g0, t0);
  __m256 acc[G][T][2];
  init_acc<G, T>(a, g0, t0, acc);
  for (int64_t s = a.k_begin / kQK_K; s < a.k_end / kQK_K; ++s) {
    const XBlock* xsec = op.x + s * 8 * op.xs;
    for (int g = 0; g < G; ++g) {
      const uint8_t* sec = op.section(g, s);
      alignas(32) int32_t isum_mem[T][16];
      for (int h = 0; h < 2; ++h) {
        __m256i is[T];
        for (int t = 0; t < T; ++t) is[t] = _mm256_setzero_si256();
        for (int p = 0; p < 4; ++p) {
          if (h == 0 && a.prefetch > 0)
            prefetch_share_at<1, kSection<KT>, 4>(sec, op.gb, op.us, g0 + g, p, a.prefetch);
          k_block_half_tokens<KT, false, T>(sec, p, h, xsec + 2 * p * op.xs, is);
          k_block_half_tokens<KT, true, T>(sec, p, h, xsec + (2 * p + 1) * op.xs, is);
        }
        for (int t = 0; t < T; ++t) _mm256_store_si256(reinterpret_cast<__m256i*>(isum_mem[t] + 8 * h), is[t]);
      }
      for (int t = 0; t < T; ++t) {
        const auto* m = reinterpret_cast<const __m256i*>(isum_mem[t]);
        const __m256i isum[2] = {_mm256_load_si256(m), _mm256_load_si256(m + 1)};
        k_finish<KT>(sec, xsec, op.xs, t, isum, acc[g][t]);
      }
    }
  }
  store_acc<G, T>(a, g0, t0, acc);
}

// Small: tile_k_small's tiles (kHasSmallTile types only) instead of tile_k's.
template <KType KT, bool Small = false>
struct KKernel {
  template <int G, int T>
  struct K {
    static void run(const MatmulArgs& a, int64_t g0, int64_t t0) {
      if constexpr (Small) {
        tile_k_small<KT, G, T>(a, g0, t0);
      } else {
        if constexpr (T > 1)
          if (requests_next_groups<G>(a, g0, t0)) return tile_k<KT, G, T, true>(a, g0, t0);
        tile_k<KT, G, T>(a, g0, t0);
      }
    }
  };
};

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
      if constexpr (T > 1)
        if (requests_next_groups<G>(a, g0, t0)) return tile_q<Q, G, T, true>(a, g0, t0);
      tile_q<Q, G, T>(a, g0, t0);
    }
  };
};

// Decode reads 4 weight streams per F-type tile (8 accumulators; 4 divide the
// driver's 8-group decode tasks): ~8% faster than 3 on the 2-vCPU VM.
constexpr int kDecodeGroupsF = 4;
constexpr int kDecodeGroupsQ = 2;  // the Q and K types
// Packed groups are interleaved in pairs for the Q and K types; the F types
// stay contiguous. Interleaved, F16 decode ran 1.10x, but four sequences
// decoding together 0.79x: a 1-group prefill tile reads a quarter of each
// row, and no tile of 4 groups x 2+ tokens fits 16 registers. The K types'
// 1-group prompt tiles on interleaved pairs ran small batches 0.52x (Q4_K,
// -s 4; 2 x 2 prompt tiles 0.55-0.69x), so their small batches ran token by
// token until Q4_K/Q5_K/Q6_K/IQ4_XS got tile_k_small (run_k_tiles). Q2_K
// and Q3_K, whose prompt tiles unpack a sub-block into 8 registers (no
// spill), now take those tiles 2 groups (a whole interleaved pair) at a
// time in passes of up to 4 tokens: paired 60M, 2 / 4 / 8 sequences, AVX2
// Q3_K 1.11x / 1.26x / 1.19x, Q2_K 1.03x / 1.19x / 1.16x; AVX-VNNI Q3_K
// 1.14x / 1.33x, Q2_K 1.09x / 1.27x.

// The tokens of each activation tile (x_tile tokens; a kernel reads one
// tile's) in passes of at most kMax tokens, as even as they divide (5 =
// 3 + 2; passes of 2: 2 + 2 + 1), with tile_k_small (Q2_K, Q3_K: the
// prompt tile) on whole interleaved pairs (a pass of one token with the
// decode tile). A pass after the first finds the weights its thread read
// in cache.
template <KType KT, int kMax>
void run_k_passes(const MatmulArgs& a) {
  for (int64_t t = 0; t < a.n_tokens;) {
    const int64_t tile_end = std::min(a.n_tokens, ((a.t0 + t) / a.x_tile + 1) * a.x_tile - a.t0);
    const int64_t passes = (tile_end - t + kMax - 1) / kMax;
    for (int64_t i = 0; i < passes; ++i) {
      const int64_t len = (tile_end - t) / (passes - i) + ((tile_end - t) % (passes - i) != 0 ? 1 : 0);
      if (len == 1) over_groups<KKernel<KT>::template K, 1, kDecodeGroupsQ, 1>(a, t);
      [&]<int... I>(std::integer_sequence<int, I...>) {
        ((len == I + 2 ? (over_groups<KKernel<KT, kHasSmallTile<KT>>::template K, I + 2, kDecodeGroupsQ, 1>(a, t), 0)
                       : 0),
         ...);
      }(std::make_integer_sequence<int, kMax - 1>{});
      t += len;
    }
  }
}

// The K types: decode with the decode tile; small batches (2 to
// kTokenTile - 1 tokens) in passes of kSmallBatchTokens (1: token by
// token); prompts in passes of 4 or with the prompt tile.
template <KType KT>
void run_k_tiles(const MatmulArgs& a) {
  constexpr int kSmall = kSmallBatchTokens<KT>;
  if (a.n_tokens <= 1 || (a.n_tokens >= kTokenTile && !kPromptsInSmallTiles<KT>))
    return run_tiles<KKernel<KT>::template K, 1, 4, kDecodeGroupsQ, 1>(a);
  if (a.n_tokens >= kTokenTile) return run_k_passes<KT, 4>(a);
  if constexpr (kSmall == 1) run_tiles_token_by_token<KKernel<KT>::template K, 1, 4, kDecodeGroupsQ, 1>(a);
  else run_k_passes<KT, kSmall>(a);
}

#ifndef REPRISE_AVX_VNNI  // no integer dots: the AVX2 build's serve both tables
void matmul_f32(const MatmulArgs& a) { run_tiles<FKernel<FType::F32>::K, 1, 6, kDecodeGroupsF, 1>(a); }
void matmul_f16(const MatmulArgs& a) { run_tiles<FKernel<FType::F16>::K, 1, 6, kDecodeGroupsF, 1>(a); }
void matmul_bf16(const MatmulArgs& a) { run_tiles<FKernel<FType::BF16>::K, 1, 6, kDecodeGroupsF, 1>(a); }
#endif
void matmul_q8_0(const MatmulArgs& a) { run_tiles<QKernel<QType::Q8_0>::K, 1, 4, kDecodeGroupsQ, 1>(a); }
void matmul_q4_0(const MatmulArgs& a) { run_tiles<QKernel<QType::Q4_0>::K, 1, 4, kDecodeGroupsQ, 1>(a); }
void matmul_q4_1(const MatmulArgs& a) { run_tiles<QKernel<QType::Q4_1>::K, 1, 4, kDecodeGroupsQ, 1>(a); }
void matmul_q5_0(const MatmulArgs& a) { run_tiles<QKernel<QType::Q5_0>::K, 1, 4, kDecodeGroupsQ, 1>(a); }
void matmul_q5_1(const MatmulArgs& a) { run_tiles<QKernel<QType::Q5_1>::K, 1, 4, kDecodeGroupsQ, 1>(a); }
void matmul_q2_k(const MatmulArgs& a) { run_k_tiles<KType::Q2K>(a); }
void matmul_q3_k(const MatmulArgs& a) { run_k_tiles<KType::Q3K>(a); }
void matmul_q4_k(const MatmulArgs& a) { run_k_tiles<KType::Q4K>(a); }
void matmul_q5_k(const MatmulArgs& a) { run_k_tiles<KType::Q5K>(a); }
void matmul_q6_k(const MatmulArgs& a) { run_k_tiles<KType::Q6K>(a); }
void matmul_q6_k_wide(const MatmulArgs& a) { run_tiles<KKernel<KType::Q6KWide>::K, 1, 4, kDecodeGroupsQ, 1>(a); }
void matmul_iq4_nl(const MatmulArgs& a) { run_tiles<QKernel<QType::IQ4NL>::K, 1, 4, kDecodeGroupsQ, 1>(a); }
void matmul_iq4_xs(const MatmulArgs& a) { run_k_tiles<KType::IQ4XS>(a); }

#ifndef REPRISE_AVX_VNNI  // the shared helpers: built once, in the AVX2 build
// The same access patterns as the AVX-512 version (8 streams or 1).
uint64_t read_sum(const uint8_t* p, size_t n, int streams) {
  constexpr int kAcc = 8;
  const int n_streams = streams == 1 ? 1 : kAcc;
  const size_t len = n / n_streams, stride = n_streams == 1 ? 64 : len, step = n_streams == 1 ? 64 * kAcc : 64;
  __m256i acc[kAcc];
  for (int s = 0; s < kAcc; ++s) acc[s] = _mm256_setzero_si256();
  for (size_t i = 0; i < len; i += step) {
    for (int s = 0; s < kAcc; ++s) {
      const uint8_t* q = p + s * stride + i;
      _mm_prefetch(reinterpret_cast<const char*>(q + 1024), _MM_HINT_T0);
      acc[s] = _mm256_add_epi64(acc[s], _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)),
                                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32))));
    }
  }
  __m256i t = acc[0];
  for (int s = 1; s < kAcc; ++s) t = _mm256_add_epi64(t, acc[s]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), t);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hmin(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// Blocks' half sums from their 4-quant partial sums (partial[j]: lanes 0-3
// block j's first half, 4-7 its second), by two rounds of vphaddd: lanes
// 0-3 of halves[k] are blocks 4k..4k+3's first-half sums, lanes 4-7 their
// second halves'.
RP_INLINE void half_block_sums8(const __m256i (&partial)[8], int32_t (&halves)[2][8]) {
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k)
    _mm256_store_si256(reinterpret_cast<__m256i*>(halves[k]),
                       _mm256_hadd_epi32(_mm256_hadd_epi32(partial[4 * k], partial[4 * k + 1]),
                                         _mm256_hadd_epi32(partial[4 * k + 2], partial[4 * k + 3])));
}

// One 32-element block's quants: round-half-even(x * scale) saturated to
// int8 (packs_epi32 then packs_epi16), stored in order at qs; returns their
// sums of 4 (lanes 0-3 the block's first half, 4-7 its second) for
// half_block_sums8.
RP_INLINE __m256i store_block_quants(const float* x, __m256 scale, int8_t* qs) {
  __m256i q[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    q[i] = _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  // The packs interleave 128-bit lanes; the permutation puts them back.
  const __m256i p = _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), p);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
}

// The largest |x| of one 32-element block.
RP_INLINE float block_amax(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  auto abs_at = [&](int i) RP_INLINE_LAMBDA { return _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)); };
  return hmax(_mm256_max_ps(_mm256_max_ps(abs_at(0), abs_at(1)), _mm256_max_ps(abs_at(2), abs_at(3))));
}

// Q8_0 quantization of n consecutive 32-element blocks into out[b * stride]
// as ggml's AVX2 path does it (the rule every ISA's quantize_q8 matches),
// per block: d = amax / 127 stored as f16, q = round-half-even(x * (127 /
// amax)), the sums of its halves' stored quants and the corrections. The
// scales' divisions and f16 conversions run 8 blocks at a time, and so do
// the sums: two rounds of vphaddd over the blocks' 4-quant partial sums
// instead of two horizontal reductions a block.
void quantize_q8(const float* x, int64_t n, XBlock* out, int64_t stride) {
  for (int64_t b0 = 0; b0 < n; b0 += 8) {
    const int nb = static_cast<int>(n - b0 < 8 ? n - b0 : 8);
    // The maxima gathered in registers: 8 scalar stores read back as one
    // vector stall store forwarding.
    float a[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) a[j] = j < nb ? block_amax(x + (b0 + j) * kQK8_0) : 0.0f;
    const __m256 m = _mm256_setr_ps(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    alignas(32) float d[8], id[8];
    _mm256_store_ps(d, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_div_ps(m, _mm256_set1_ps(127.0f)),
                                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    const __m256 nonzero = _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_NEQ_UQ);
    _mm256_store_ps(id, _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(127.0f), m)));
    __m256i partial[8];  // block j's sums of 4 quants: lanes 0-3 its first half, 4-7 its second
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      partial[j] = _mm256_setzero_si256();
      if (j >= nb) continue;
      XBlock& o = out[(b0 + j) * stride];
      partial[j] = store_block_quants(x + (b0 + j) * kQK8_0, _mm256_set1_ps(id[j]), o.qs);
      o.d = d[j];
    }
    alignas(32) int32_t halves[2][8];
    half_block_sums8(partial, halves);
    for (int j = 0; j < nb; ++j) {
      XBlock& o = out[(b0 + j) * stride];
      const int32_t sum_lo = halves[j / 4][j % 4], sum_hi = halves[j / 4][4 + j % 4], sum = sum_lo + sum_hi;
      o.sum_lo = static_cast<int16_t>(sum_lo);
      o.sum_hi = static_cast<int16_t>(sum_hi);
      o.corr_q8 = -128 * sum;
      o.corr_q4 = -8 * sum;
    }
  }
}

void attend_tiled_avx2(const TiledKv& kv, const TiledGroup* groups, int n_groups, float scale) {
  attend_tiled(kv, std::span(groups, static_cast<size_t>(n_groups)), scale);
}

void attend_tiled_rows_avx2(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t d,
                            int64_t key_group, const TiledGroup* groups, int n_groups, float scale) {
  attend_tiled_rows(key_rows, value_rows, d, key_group, std::span(groups, static_cast<size_t>(n_groups)), scale);
}

#endif  // REPRISE_AVX_VNNI
}  // namespace

#ifndef REPRISE_AVX_VNNI
float q8_0_block_amax(const float* x) { return block_amax(x); }

namespace {
// q8_k_lanes.h's primitives on 8 lanes.
struct Q8kLanes {
  using Vec = __m256;
  static constexpr int kWidth = 8;
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
  static float hmax(Vec v) { return kernels::hmax(v); }
  static float hmin(Vec v) { return kernels::hmin(v); }
};
}  // namespace

// The scales by q8_k_lanes.h; each block's quants by store_block_quants
// (as Q8_0's), their 16 half-block sums by half_block_sums8.
void quantize_q8_k(const float* x, int64_t n_sections, XBlock* out, int64_t out_stride) {
  for (int64_t s = 0; s < n_sections; ++s) {
    const float* xs = x + s * kQK_K;
    XBlock* o = out + s * 8 * out_stride;
    const auto [iscale, d] = q8_k_lanes::section_scale<Q8kLanes>(xs);
    const __m256 is = _mm256_set1_ps(iscale);
    __m256i partial[8];  // block b's sums of 4 quants: lanes 0-3 its first half, 4-7 its second
#pragma GCC unroll 8
    for (int b = 0; b < 8; ++b) {
      XBlock& xb = o[b * out_stride];
      partial[b] = store_block_quants(xs + 32 * b, is, xb.qs);
      xb.d = d;
      xb.corr_q8 = 0;
      xb.corr_q4 = 0;
    }
    alignas(32) int32_t halves[2][8];
    half_block_sums8(partial, halves);
    for (int b = 0; b < 8; ++b) {
      XBlock& xb = o[b * out_stride];
      xb.sum_lo = static_cast<int16_t>(halves[b / 4][b % 4]);
      xb.sum_hi = static_cast<int16_t>(halves[b / 4][4 + b % 4]);
    }
  }
}

void widen_q3_k_sections(const uint8_t* src, int64_t n_sections, uint8_t* dst) {
  const __m256i bias = _mm256_set1_epi8(28);  // u = q + 32 = (q + 4) + 28
  for (int64_t s = 0; s < n_sections; ++s) {
    const uint8_t* in = src + s * kSectionQ3K;
    uint8_t* out = dst + s * kSectionQ6KWide;
    std::memcpy(out, in, kQ6KQuants);  // d and scales, where Q6_K's are
    // Block m's chunk c: pair m's chunk c (sub-block 2m + c / 4's elements
    // 4(c % 4)..+3).
    for (int m = 0; m < 8; ++m)
      [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
        (
            [&]() RP_INLINE_LAMBDA {
              for (int h8 = 0; h8 < 2; ++h8)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + kQ6KQuants + m * 512 + C * 64 + 32 * h8),
                                    _mm256_add_epi8(q3k_chunk<C>(in, m, h8), bias));
            }(),
            ...);
      }(std::make_integer_sequence<int, 8>{});
  }
}

void widen_q6_k_sections(const uint8_t* src, int64_t n_sections, uint8_t* dst) {
  for (int64_t s = 0; s < n_sections; ++s) {
    const uint8_t* in = src + s * kSectionQ6K;
    uint8_t* out = dst + s * kSectionQ6KWide;
    std::memcpy(out, in, kQ6KQuants);  // d and scales
    for (int pair = 0; pair < 4; ++pair)
      [&]<int... C>(std::integer_sequence<int, C...>) RP_INLINE_LAMBDA {
        (
            [&]() RP_INLINE_LAMBDA {
              for (int h = 0; h < 2; ++h) {
                auto chunk = [&](int block) {
                  return reinterpret_cast<__m256i*>(out + kQ6KQuants + block * 512 + C * 64 + 32 * h);
                };
                _mm256_storeu_si256(chunk(2 * pair), k_affine_chunk<KType::Q6K, false, C>(in, pair, h));
                _mm256_storeu_si256(chunk(2 * pair + 1), k_affine_chunk<KType::Q6K, true, C>(in, pair, h));
              }
            }(),
            ...);
      }(std::make_integer_sequence<int, 8>{});
  }
}

const IsaKernels& avx2_kernels() {
  static const IsaKernels k{"avx2", &matmul_f32, &matmul_f16, &matmul_bf16, &matmul_q8_0, &matmul_q4_0, &matmul_q4_1, &matmul_q5_0, &matmul_q5_1, &matmul_q2_k, &matmul_q3_k, &matmul_q4_k, &matmul_q5_k, &matmul_q6_k, &matmul_q6_k_wide, &matmul_iq4_nl, &matmul_iq4_xs, &read_sum, nullptr, &quantize_q8, &quantize_q8_k, &attention_avx2, &attention_avx2_supports, nullptr, nullptr, &attend_tiled_avx2, &attend_tiled_rows_avx2,
                            /*interleave_f=*/1, kDecodeGroupsQ, kDecodeGroupsQ, /*interleave_q6_k=*/kDecodeGroupsQ,
                            /*regions_f=*/kDecodeGroupsF, /*regions_f_long=*/kDecodeGroupsF, /*regions_k=*/kDecodeGroupsQ, /*regions_q=*/kDecodeGroupsQ,
                            /*regions_q6_k=*/kDecodeGroupsQ, /*regions_q8_0=*/kDecodeGroupsQ, /*tiled_heads_together=*/1,
                            /*decode_prefetch_f=*/1024,
                            /*decode_prefetch_q=*/1024, /*decode_prefetch_k=*/1024, &mamba1_scan_avx2, &mamba2_scan_avx2,
                            /*silu_mul=*/nullptr, /*gelu_mul=*/nullptr};
  return k;
}

#else
// The integer products with vpdpbusd; everything else is the AVX2 table's.
const IsaKernels& avx2_vnni_kernels() {
  static const IsaKernels k = [] {
    IsaKernels t = avx2_kernels();
    t.name = "avx2vnni";
    t.matmul_q8_0 = &matmul_q8_0;
    t.matmul_q4_0 = &matmul_q4_0;
    t.matmul_q4_1 = &matmul_q4_1;
    t.matmul_q5_0 = &matmul_q5_0;
    t.matmul_q5_1 = &matmul_q5_1;
    t.matmul_q2_k = &matmul_q2_k;
    t.matmul_q3_k = &matmul_q3_k;
    t.matmul_q4_k = &matmul_q4_k;
    t.matmul_q5_k = &matmul_q5_k;
    t.matmul_q6_k = &matmul_q6_k;
    t.matmul_q6_k_wide = &matmul_q6_k_wide;
    t.matmul_iq4_nl = &matmul_iq4_nl;
    t.matmul_iq4_xs = &matmul_iq4_xs;
    return t;
  }();
  return k;
}
#endif  // REPRISE_AVX_VNNI

}  // namespace reprise::kernels
