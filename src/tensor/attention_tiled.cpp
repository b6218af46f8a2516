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

#include "tensor/attention_tiled_state.h"
#include "tensor/avx2_math.h"
#include "tensor/fp16.h"
#include "tensor/kernels_impl.h"

namespace reprise::kernels {
namespace {

using avx2::exp8;
using avx2::exp_scalar;
using tiled::kNegInf;
using tiled::kTile;
using tiled::F16Tile;
using tiled::RowState;
using tiled::RowsContext;
using tiled::tree16;

#define RP_ALWAYS_INLINE __attribute__((always_inline))

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

// Positions [ts, ts + 64) of one tile for NQ queries sharing the K/V in kv.
// With F16V (decode), K and V are read as f16 in place (f16) instead.
template <int NQ, bool F16V = false>
void tile_step(const TiledKv& kv, const TiledQueries& qs, float scale, int64_t ts, RowState* st,
               const F16Tile* f16 = nullptr) {
  const int64_t d = kv.d;
  tiled::TileRows rows = tiled::tile_rows(qs, NQ, ts);
  const int64_t(&lo)[kMaxTiledQueries] = rows.lo;
  const int64_t(&hi)[kMaxTiledQueries] = rows.hi;
  bool(&active)[kMaxTiledQueries] = rows.active;
  const int64_t any_lo = rows.any_lo, any_hi = rows.any_hi;
  int64_t &all_lo = rows.all_lo, &all_hi = rows.all_hi;
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
  // NB 16-key blocks at a time, so few queries (decode) still keep 8
  // independent FMA chains in flight.
  auto score_blocks = [&]<int NB>(int64_t b0) RP_ALWAYS_INLINE {
    const float* kb = F16V ? nullptr : kv.kt + (ts + b0 - kv.base) / 16 * d * 16;
    const uint16_t* kb16[NB];
    if constexpr (F16V)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) kb16[j] = f16->k[b0 / 16 + j];
    __m256 acc[NQ][NB][2];
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
    // Dimensions [i0, i1); in place (F16V) the lines requested lie in this
    // tile's blocks (InTile) or the next tile's (F16Tile).
    auto dims = [&]<bool InTile>(int64_t i0, int64_t i1) RP_ALWAYS_INLINE {
      const uint16_t* ahead[NB];
      if constexpr (F16V)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j)
          ahead[j] = f16->template key_request_base<InTile>(b0 / 16 + j, d);
      for (int64_t i = i0; i < i1; ++i) {
        __m256 k[NB][2];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) {
          if constexpr (F16V) {
            if ((i & 1) == 0)  // a line holds two dimensions
              _mm_prefetch(reinterpret_cast<const char*>(ahead[j] + i * 16), _MM_HINT_T0);
            k[j][0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kb16[j] + i * 16)));
            k[j][1] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kb16[j] + i * 16 + 8)));
          } else {
            k[j][0] = _mm256_load_ps(kb + j * d * 16 + i * 16);
            k[j][1] = _mm256_load_ps(kb + j * d * 16 + i * 16 + 8);
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < NQ; ++r) {
          const __m256 q = _mm256_broadcast_ss(q_row[r] + i);
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) {
            acc[r][j][0] = _mm256_fmadd_ps(q, k[j][0], acc[r][j][0]);
            acc[r][j][1] = _mm256_fmadd_ps(q, k[j][1], acc[r][j][1]);
          }
        }
      }
    };
    if constexpr (F16V) {
      const int64_t split = F16Tile::key_split(d);
      dims.template operator()<true>(0, split);
      dims.template operator()<false>(split, d);
    } else {
      dims.template operator()<true>(0, d);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int64_t at = b0 + 16 * j + 8 * h;
        const __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(ts + at)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
        for (int r = 0; r < NQ; ++r) {
          const __m256i f = _mm256_set1_epi32(static_cast<int32_t>(qs.first[r] - 1));
          const __m256i e = _mm256_set1_epi32(static_cast<int32_t>(qs.end[r]));
          const __m256 ok =
              _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(pos, f), _mm256_cmpgt_epi32(e, pos)));
          const __m256 x = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(acc[r][j][h], vscale), ok);
          _mm256_store_ps(sc[r] + at, x);
          vmax[r] = _mm256_max_ps(x, vmax[r]);  // a NaN score never becomes the maximum
        }
      }
  };
  constexpr int kBlocksAtOnce = NQ == 1 ? 4 : NQ == 2 ? 2 : 1;
  int64_t b0 = b_lo;
  for (; b0 + 16 * kBlocksAtOnce <= b_hi + 15 && kBlocksAtOnce > 1 && b0 + 16 * kBlocksAtOnce <= kTile;
       b0 += 16 * kBlocksAtOnce)
    score_blocks.template operator()<kBlocksAtOnce>(b0);
  for (; b0 < b_hi; b0 += 16) score_blocks.template operator()<1>(b0);

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
    tiled::raise_max(st[r], m, d);
    const __m256 vm = _mm256_set1_ps(st[r].M), zero = _mm256_setzero_ps();
    double sum = 0.0;
    for (int64_t b0 = b_lo; b0 < b_hi; b0 += 16) {
      __m256 e[2];
      for (int h = 0; h < 2; ++h) {
        const __m256 x = _mm256_load_ps(sc[r] + b0 + 8 * h);
        const __m256 ok = _mm256_cmp_ps(x, neg_inf, _CMP_NEQ_UQ);  // NaN scores weigh NaN
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
  // C 8-lane vectors of dimensions at a time: 8 / NQ, so one query
  // (decode) runs 8 chains too.
  auto values = [&]<int C>(int64_t c) RP_ALWAYS_INLINE {
    __m256 a[NQ][C];
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < C; ++j) a[r][j] = _mm256_load_ps(st[r].acc + c + 8 * j);
    auto request_v = [&](int64_t p) RP_ALWAYS_INLINE {
      if (p + kTile < f16->v_next_hi) {
        const char* next = reinterpret_cast<const char*>(f16->v[p + kTile] + f16->v_off + c);
#pragma GCC unroll 8
        for (int j = 0; j < C; j += 4) _mm_prefetch(next + 64 * (j / 4), _MM_HINT_T0);  // 32 values a line
      }
    };
    auto step = [&](int64_t p, bool all) RP_ALWAYS_INLINE {
      if constexpr (NQ == 1 && F16V) {  // 8 accumulators: load each V vector where it is used
        request_v(p);
        if (!all && !(active[0] && p >= lo[0] && p < hi[0])) return;
        const uint16_t* vr = f16->v[p] + f16->v_off + c;
        const __m256 wv = _mm256_broadcast_ss(w[0] + (p - ts));
#pragma GCC unroll 8
        for (int j = 0; j < C; ++j)
          a[0][j] = _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + 8 * j))),
                                    a[0][j]);
        return;
      }
      __m256 v[C];
      if constexpr (F16V) {
        request_v(p);
        const uint16_t* vr = f16->v[p] + f16->v_off + c;
#pragma GCC unroll 8
        for (int j = 0; j < C; ++j) v[j] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + 8 * j)));
      } else {
        const float* vr = kv.v + ((p - kv.base) * d + c);
#pragma GCC unroll 8
        for (int j = 0; j < C; ++j) v[j] = _mm256_loadu_ps(vr + 8 * j);
      }
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r) {
        if (!all && !(active[r] && p >= lo[r] && p < hi[r])) continue;
        const __m256 wv = _mm256_broadcast_ss(w[r] + (p - ts));
#pragma GCC unroll 8
        for (int j = 0; j < C; ++j) a[r][j] = _mm256_fmadd_ps(wv, v[j], a[r][j]);
      }
    };
    for (int64_t p = any_lo; p < all_lo; ++p) step(p, false);
    for (int64_t p = all_lo; p < all_hi; ++p) step(p, true);
    for (int64_t p = all_hi; p < any_hi; ++p) step(p, false);
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < C; ++j) _mm256_store_ps(st[r].acc + c + 8 * j, a[r][j]);
  };
  constexpr int kChunk = NQ == 1 ? 8 : NQ == 2 ? 4 : 2;
  int64_t c = 0;
  if constexpr (kChunk > 2)
    for (; c + 8 * kChunk <= d; c += 8 * kChunk) values.template operator()<kChunk>(c);
  for (; c < d; c += 16) values.template operator()<2>(c);
}

// One tile of one group of attend_tiled (walk_row_tiles' callback).
struct WidenedContext {
  const TiledKv* kv;
  float scale;
};

void widened_tile_any(void* ctx, const TiledGroup& g, int64_t ts, int64_t, int64_t, bool, RowState* st) {
  const WidenedContext& c = *static_cast<const WidenedContext*>(ctx);
  tiled::with_query_count(g.queries.n, [&]<int NQ>() { tile_step<NQ>(*c.kv, g.queries, c.scale, ts, st); });
}

// One tile of one group (queries sharing a KV head) read in place.
template <int NQ>
void rows_tile(const RowsContext& c, const TiledGroup& g, int64_t ts, int64_t lo, int64_t hi, bool fresh,
               RowState* st) {
  const F16Tile t = tiled::f16_tile(c, g, ts, lo, hi, fresh);
  tile_step<NQ, true>(TiledKv{nullptr, nullptr, ts, c.d}, g.queries, c.scale, ts, st, &t);
}

void rows_tile_any(void* ctx, const TiledGroup& g, int64_t ts, int64_t lo, int64_t hi, bool fresh, RowState* st) {
  const RowsContext& c = *static_cast<const RowsContext*>(ctx);
  tiled::with_query_count(g.queries.n, [&]<int NQ>() { rows_tile<NQ>(c, g, ts, lo, hi, fresh, st); });
}

}  // namespace

void attend_tiled_rows(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t d,
                       int64_t key_group, std::span<const TiledGroup> groups, float scale) {
  // K and V are read in place (kt: keys gathered from groups of fewer than
  // 16 positions, one tile's).
  alignas(64) static thread_local uint16_t kt[4 * 256 * 16];
  RowsContext c{key_rows, value_rows, d, key_group, scale, kt};
  tiled::walk_row_tiles(groups.data(), static_cast<int>(groups.size()), d, &rows_tile_any, &c);
}

void attend_tiled(const TiledKv& kv, std::span<const TiledGroup> groups, float scale) {
  WidenedContext c{&kv, scale};
  tiled::walk_row_tiles(groups.data(), static_cast<int>(groups.size()), kv.d, &widened_tile_any, &c);
}

void attend_tiled_reference(const float* q, const uint16_t* const* key_rows, const uint16_t* const* value_rows,
                            int64_t kv_off, int64_t key_group, int64_t first, int64_t end, int64_t d, float scale,
                            float* out) {
  const KeyView keys{key_rows, kv_off, key_group, d};
  float M = kNegInf, S = 0.0f;
  float acc[256] = {};
  for (int64_t ts = first / kTile * kTile; ts < end; ts += kTile) {
    const int64_t lo = std::max(first, ts), hi = std::min(end, ts + kTile);
    float s[kTile];
    std::fill(s, s + kTile, kNegInf);
    float m = kNegInf;
    for (int64_t p = lo; p < hi; ++p) {
      float x = 0.0f;
      for (int64_t i = 0; i < d; ++i) x = std::fma(q[i], f16_to_f32(keys.at(p, i)), x);
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
