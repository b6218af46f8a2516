// ggml's tiled flash-attention numerics (see attention_tiled.h), with
// 8-lane AVX2 vectors: the same code runs on AVX2 and AVX-512 machines, so
// both give the same bits. Scores and value updates are per-element FMA
// chains, so the vector width only decides which elements are computed
// together, never the order.
#include "tensor/attention_tiled.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/avx2_math.h"
#include "tensor/fp16.h"
#include "tensor/kernels_impl.h"

namespace reprise::kernels {
namespace {

using avx2::exp8;
using avx2::exp_scalar;

#define RP_ALWAYS_INLINE __attribute__((always_inline))

constexpr int64_t kTile = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The 16 lanes lo (0-7) and hi (8-15) summed in the order of GCC's
// _mm512_reduce_add_ps, which ggml's AVX-512 softmax applies per block:
// lane j + lane j+8, then j + j+4, j + j+2, j + j+1.
inline float tree16(__m256 lo, __m256 hi) {
  const __m256 a = _mm256_add_ps(lo, hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

float tree16(const float* x) {
  float a[8], b[4], c[2];
  for (int j = 0; j < 8; ++j) a[j] = x[j] + x[j + 8];
  for (int j = 0; j < 4; ++j) b[j] = a[j] + a[j + 4];
  for (int j = 0; j < 2; ++j) c[j] = b[j] + b[j + 2];
  return c[0] + c[1];
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// A query's running maximum, sum and value accumulator.
struct RowState {
  float M;
  float S;
  alignas(32) float acc[256];
};

// Rescales a row's state for a new maximum (ggml: expf(M - m), applied to
// the accumulator and the sum).
inline void raise_max(RowState& st, float m, int64_t d) {
  if (m > st.M) {
    const float ms = std::exp(st.M - m);
    const __m256 f = _mm256_set1_ps(ms);
    for (int64_t i = 0; i < d; i += 8) _mm256_store_ps(st.acc + i, _mm256_mul_ps(_mm256_load_ps(st.acc + i), f));
    st.S = st.S * ms;
  }
  st.M = std::max(st.M, m);
}

// Positions [ts, ts + 64) of one tile for NQ queries sharing the K/V in kv.
template <int NQ>
void tile_step(const TiledKv& kv, const TiledQueries& qs, float scale, int64_t ts, RowState* st) {
  const int64_t d = kv.d;
  int64_t lo[NQ], hi[NQ];
  bool active[NQ];
  int64_t any_lo = ts + kTile, any_hi = ts, all_lo = ts, all_hi = ts + kTile;
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r) {
    lo[r] = std::max(qs.first[r], ts);
    hi[r] = std::min(qs.end[r], ts + kTile);
    active[r] = lo[r] < hi[r];
    if (active[r]) {
      any_lo = std::min(any_lo, lo[r]);
      any_hi = std::max(any_hi, hi[r]);
    }
    all_lo = std::max(all_lo, lo[r]);
    all_hi = std::min(all_hi, hi[r]);
  }
  if (any_lo >= any_hi) return;
  const int64_t b_lo = (any_lo - ts) / 16 * 16, b_hi = any_hi - ts;  // blocks [b_lo, b_hi) of the tile

  // Scores (masked lanes -inf) and each query's tile maximum.
  alignas(32) float sc[NQ][kTile];
  __m256 vmax[NQ];
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r) vmax[r] = _mm256_set1_ps(kNegInf);
  const __m256 vscale = _mm256_set1_ps(scale), neg_inf = _mm256_set1_ps(kNegInf);
  const float* q_row[NQ];
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r) q_row[r] = qs.q[r];
  for (int64_t b0 = b_lo; b0 < b_hi; b0 += 16) {
    const float* kb = kv.kt + (ts + b0 - kv.base) / 16 * d * 16;
    __m256 s_lo[NQ], s_hi[NQ];
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r) s_lo[r] = s_hi[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; ++i) {
      const __m256 k0 = _mm256_load_ps(kb + i * 16), k1 = _mm256_load_ps(kb + i * 16 + 8);
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r) {
        const __m256 q = _mm256_broadcast_ss(q_row[r] + i);
        s_lo[r] = _mm256_fmadd_ps(q, k0, s_lo[r]);
        s_hi[r] = _mm256_fmadd_ps(q, k1, s_hi[r]);
      }
    }
    const __m256i pos_lo = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(ts + b0)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i pos_hi = _mm256_add_epi32(pos_lo, _mm256_set1_epi32(8));
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r) {
      const __m256i f = _mm256_set1_epi32(static_cast<int32_t>(qs.first[r] - 1));
      const __m256i e = _mm256_set1_epi32(static_cast<int32_t>(qs.end[r]));
      const __m256 ok_lo = _mm256_castsi256_ps(
          _mm256_and_si256(_mm256_cmpgt_epi32(pos_lo, f), _mm256_cmpgt_epi32(e, pos_lo)));
      const __m256 ok_hi = _mm256_castsi256_ps(
          _mm256_and_si256(_mm256_cmpgt_epi32(pos_hi, f), _mm256_cmpgt_epi32(e, pos_hi)));
      const __m256 x_lo = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(s_lo[r], vscale), ok_lo);
      const __m256 x_hi = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(s_hi[r], vscale), ok_hi);
      _mm256_store_ps(sc[r] + b0, x_lo);
      _mm256_store_ps(sc[r] + b0 + 8, x_hi);
      vmax[r] = _mm256_max_ps(vmax[r], _mm256_max_ps(x_lo, x_hi));
    }
  }

  // Online softmax: weights w (0 where masked) and the sums.
  alignas(32) float w[NQ][kTile];
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r) {
    if (!active[r]) continue;
    const float m = hmax8(vmax[r]);
    if (m == kNegInf) {  // no finite score: the row skips the tile, as ggml's does
      active[r] = false;
      all_lo = all_hi;
      continue;
    }
    raise_max(st[r], m, d);
    const __m256 vm = _mm256_set1_ps(st[r].M), zero = _mm256_setzero_ps();
    double sum = 0.0;
    for (int64_t b0 = b_lo; b0 < b_hi; b0 += 16) {
      __m256 e[2];
      for (int h = 0; h < 2; ++h) {
        const __m256 x = _mm256_load_ps(sc[r] + b0 + 8 * h);
        const __m256 ok = _mm256_cmp_ps(x, neg_inf, _CMP_NEQ_OQ);
        e[h] = _mm256_and_ps(exp8(_mm256_blendv_ps(zero, _mm256_sub_ps(x, vm), ok)), ok);
        _mm256_store_ps(w[r] + b0 + 8 * h, e[h]);
      }
      sum += static_cast<double>(tree16(e[0], e[1]));
    }
    st[r].S = static_cast<float>(static_cast<double>(st[r].S) + sum);
  }

  // Values: per element, an FMA chain over the tile's keys in order. Keys
  // every query takes run without per-query checks.
  if (all_lo >= all_hi) all_lo = all_hi = any_hi;
  for (int64_t c = 0; c < d; c += 16) {
    __m256 a_lo[NQ], a_hi[NQ];
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r) {
      a_lo[r] = _mm256_load_ps(st[r].acc + c);
      a_hi[r] = _mm256_load_ps(st[r].acc + c + 8);
    }
    const float* vc = kv.v - kv.base * d + c;
    auto some = [&](int64_t p) RP_ALWAYS_INLINE {
      const __m256 v0 = _mm256_loadu_ps(vc + p * d), v1 = _mm256_loadu_ps(vc + p * d + 8);
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r) {
        if (!active[r] || p < lo[r] || p >= hi[r]) continue;
        const __m256 wv = _mm256_broadcast_ss(w[r] + (p - ts));
        a_lo[r] = _mm256_fmadd_ps(wv, v0, a_lo[r]);
        a_hi[r] = _mm256_fmadd_ps(wv, v1, a_hi[r]);
      }
    };
    for (int64_t p = any_lo; p < all_lo; ++p) some(p);
    for (int64_t p = all_lo; p < all_hi; ++p) {
      const __m256 v0 = _mm256_loadu_ps(vc + p * d), v1 = _mm256_loadu_ps(vc + p * d + 8);
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r) {
        const __m256 wv = _mm256_broadcast_ss(w[r] + (p - ts));
        a_lo[r] = _mm256_fmadd_ps(wv, v0, a_lo[r]);
        a_hi[r] = _mm256_fmadd_ps(wv, v1, a_hi[r]);
      }
    }
    for (int64_t p = all_hi; p < any_hi; ++p) some(p);
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r) {
      _mm256_store_ps(st[r].acc + c, a_lo[r]);
      _mm256_store_ps(st[r].acc + c + 8, a_hi[r]);
    }
  }
}

void start(RowState* st, int n, int64_t d) {
  for (int r = 0; r < n; ++r) {
    st[r].M = kNegInf;
    st[r].S = 0.0f;
    std::fill(st[r].acc, st[r].acc + d, 0.0f);
  }
}

void finish(const RowState* st, const TiledQueries& qs, int64_t d) {
  for (int r = 0; r < qs.n; ++r) {
    const float inv = st[r].S == 0.0f ? 0.0f : 1.0f / st[r].S;
    const __m256 f = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(qs.out[r] + i, _mm256_mul_ps(_mm256_load_ps(st[r].acc + i), f));
  }
}

// Runs fn(ts) for each tile that holds some query's keys.
template <class Fn>
void for_each_tile(const TiledQueries& qs, Fn&& fn) {
  int64_t lo = qs.first[0], hi = qs.end[0];
  for (int r = 1; r < qs.n; ++r) {
    lo = std::min(lo, qs.first[r]);
    hi = std::max(hi, qs.end[r]);
  }
  for (int64_t ts = lo / kTile * kTile; ts < hi; ts += kTile) fn(ts, lo, hi);
}

template <int NQ>
void attend_n(const TiledKv& kv, const TiledQueries& qs, float scale) {
  RowState st[NQ];
  start(st, NQ, kv.d);
  for_each_tile(qs, [&](int64_t ts, int64_t, int64_t) { tile_step<NQ>(kv, qs, scale, ts, st); });
  finish(st, qs, kv.d);
}

template <int NQ>
void attend_rows_n(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t kv_off, int64_t d,
                   const TiledQueries& qs, float scale) {
  // One tile widened at a time: K blocks [4][d][16] and V rows [64][d].
  alignas(64) static thread_local float kt[4 * 256 * 16];
  alignas(64) static thread_local float v[kTile * 256];
  RowState st[NQ];
  start(st, NQ, d);
  for_each_tile(qs, [&](int64_t ts, int64_t lo, int64_t hi) {
    const int64_t b_lo = std::max<int64_t>(0, lo - ts) / 16 * 16, b_hi = std::min(hi - ts, kTile);
    for (int64_t b0 = b_lo; b0 < b_hi; b0 += 16)
      widen_kv_block(key_rows, value_rows, kv_off, ts + b0, lo, hi, d, kt + b0 * d, v + b0 * d);
    tile_step<NQ>(TiledKv{kt, v, ts, d}, qs, scale, ts, st);
  });
  finish(st, qs, d);
}

}  // namespace

void attend_tiled(const TiledKv& kv, const TiledQueries& qs, float scale) {
  switch (qs.n) {
    case 1: return attend_n<1>(kv, qs, scale);
    case 2: return attend_n<2>(kv, qs, scale);
    case 3: return attend_n<3>(kv, qs, scale);
    case 4: return attend_n<4>(kv, qs, scale);
    default: return;
  }
}

void attend_tiled_rows(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t kv_off, int64_t d,
                       const TiledQueries& qs, float scale) {
  switch (qs.n) {
    case 1: return attend_rows_n<1>(key_rows, value_rows, kv_off, d, qs, scale);
    case 2: return attend_rows_n<2>(key_rows, value_rows, kv_off, d, qs, scale);
    case 3: return attend_rows_n<3>(key_rows, value_rows, kv_off, d, qs, scale);
    case 4: return attend_rows_n<4>(key_rows, value_rows, kv_off, d, qs, scale);
    default: return;
  }
}

void attend_tiled_reference(const float* q, const uint16_t* const* key_rows, const uint16_t* const* value_rows,
                            int64_t kv_off, int64_t first, int64_t end, int64_t d, float scale, float* out) {
  float M = kNegInf, S = 0.0f;
  float acc[256] = {};
  for (int64_t ts = first / kTile * kTile; ts < end; ts += kTile) {
    const int64_t lo = std::max(first, ts), hi = std::min(end, ts + kTile);
    float s[kTile];
    std::fill(s, s + kTile, kNegInf);
    float m = kNegInf;
    for (int64_t p = lo; p < hi; ++p) {
      const uint16_t* k = key_rows[p] + kv_off;
      float x = 0.0f;
      for (int64_t i = 0; i < d; ++i) x = std::fma(q[i], f16_to_f32(k[i]), x);
      s[p - ts] = x * scale;
      m = std::max(m, s[p - ts]);
    }
    if (m == kNegInf) continue;
    if (m > M) {
      const float ms = std::exp(M - m);
      for (int64_t i = 0; i < d; ++i) acc[i] *= ms;
      S = S * ms;
      M = m;
    }
    float w[kTile];
    for (int i = 0; i < kTile; ++i) w[i] = s[i] == kNegInf ? 0.0f : exp_scalar(s[i] - M);
    double sum = 0.0;
    for (int b = 0; b < kTile; b += 16) sum += static_cast<double>(tree16(w + b));
    S = static_cast<float>(static_cast<double>(S) + sum);
    for (int64_t p = lo; p < hi; ++p) {
      const uint16_t* v = value_rows[p] + kv_off;
      for (int64_t i = 0; i < d; ++i) acc[i] = std::fma(w[p - ts], f16_to_f32(v[i]), acc[i]);
    }
  }
  const float inv = S == 0.0f ? 0.0f : 1.0f / S;
  for (int64_t i = 0; i < d; ++i) out[i] = acc[i] * inv;
}

}  // namespace reprise::kernels
