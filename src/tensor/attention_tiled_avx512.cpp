// The tiled attention kernels (attention_tiled.h) with 16-lane AVX-512
// vectors: a 16-position block is one vector, 4 queries keep 16 score chains
// (a whole 64-position tile) or 16 value chains in flight. Prompts read the
// layer's widened f32 K/V; decode and short prompt chunks read the f16 rows
// in place, transposing each tile's K as 16-bit values. The arithmetic is
// attention_tiled.cpp's, element for element (the shared steps live in
// attention_tiled_state.h), so both give the same bits.
//
// Everything below the target pragma is compiled for AVX-512 and runs only
// after the CPU check, so it uses intrinsics and the helpers included above
// the pragma only: no standard-library inline function is instantiated with
// these options.
#include <immintrin.h>

#include <cstdint>

#include "tensor/attention_tiled_state.h"
#include "tensor/avx2_math.h"
#include "tensor/kernels_impl.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif

namespace reprise::kernels {
namespace {

#define RP_ALWAYS_INLINE __attribute__((always_inline))

using tiled::kNegInf;
using tiled::kTile;
using tiled::RowState;

// ggml's vector expf on 16 lanes: the operations of avx2::exp8, lanes
// outside the fast range through avx2::exp_scalar.
RP_ALWAYS_INLINE inline __m512 exp16(__m512 x) {
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

// Positions [ts, ts + 64) of one tile for NQ queries sharing a KV head.
// F16Rows (decode): K comes from kt16, the tile's 16-position blocks
// transposed as f16 ([d][16] per block, block b0 / 16 at kt16 + b0 * d), and
// V from the f16 rows v16[p] + v_off; otherwise from kv's f32 buffers.
template <int NQ, bool F16Rows = false>
void tile_step(const TiledKv& kv, const TiledQueries& qs, float scale, int64_t ts, RowState* st,
               const uint16_t* kt16 = nullptr, const uint16_t* const* v16 = nullptr, int64_t v_off = 0) {
  const int64_t d = kv.d;
  tiled::TileRows rows = tiled::tile_rows(qs, NQ, ts);
  const int64_t(&lo)[kMaxTiledQueries] = rows.lo;
  const int64_t(&hi)[kMaxTiledQueries] = rows.hi;
  bool(&active)[kMaxTiledQueries] = rows.active;
  const int64_t any_lo = rows.any_lo, any_hi = rows.any_hi;
  int64_t &all_lo = rows.all_lo, &all_hi = rows.all_hi;
  if (any_lo >= any_hi) return;
  const int64_t b_lo = (any_lo - ts) / 16 * 16, b_hi = any_hi - ts;

  // Scores: NB 16-position blocks at a time (masked lanes -inf).
  alignas(64) float sc[NQ][kTile];
  __m512 vmax[NQ];
  const float* q_row[NQ];
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r) {
    vmax[r] = _mm512_set1_ps(kNegInf);
    q_row[r] = qs.q[r];
  }
  const __m512 vscale = _mm512_set1_ps(scale), neg_inf = _mm512_set1_ps(kNegInf);
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  auto score_blocks = [&]<int NB>(int64_t b0) RP_ALWAYS_INLINE {
    const int64_t block = (ts + b0 - kv.base) / 16 * d * 16;
    const float* kb = F16Rows ? nullptr : kv.kt + block;
    const uint16_t* kb16 = F16Rows ? kt16 + block : nullptr;
    __m512 acc[NQ][NB];
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; ++i) {
      __m512 k[NB];
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j)
        k[j] = F16Rows ? _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(kb16 + j * d * 16 + i * 16)))
                       : _mm512_load_ps(kb + j * d * 16 + i * 16);
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r) {
        const __m512 q = _mm512_set1_ps(q_row[r][i]);
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_fmadd_ps(q, k[j], acc[r][j]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const int64_t at = b0 + 16 * j;
      const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(ts + at)), lanes);
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r) {
        const __mmask16 ok =
            _mm512_cmpge_epi32_mask(pos, _mm512_set1_epi32(static_cast<int32_t>(qs.first[r]))) &
            _mm512_cmplt_epi32_mask(pos, _mm512_set1_epi32(static_cast<int32_t>(qs.end[r])));
        const __m512 x = _mm512_mask_mul_ps(neg_inf, ok, acc[r][j], vscale);
        _mm512_store_ps(sc[r] + at, x);
        vmax[r] = _mm512_max_ps(x, vmax[r]);  // a NaN score never becomes the maximum
      }
    }
  };
  int64_t b0 = b_lo;
  if (NQ <= 4)
    for (; b0 + 48 < b_hi; b0 += 64) score_blocks.template operator()<4>(b0);
  for (; b0 < b_hi; b0 += 16) score_blocks.template operator()<1>(b0);

  // Online softmax (the steps of attention_tiled.cpp).
  alignas(64) float w[NQ][kTile];
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r) {
    if (!active[r]) continue;
    const float m = _mm512_reduce_max_ps(vmax[r]);
    if (m == kNegInf) {
      active[r] = false;
      all_lo = all_hi;
      continue;
    }
    tiled::raise_max(st[r], m, d);
    const __m512 vm = _mm512_set1_ps(st[r].M);
    double sum = 0.0;
    for (int64_t b = b_lo; b < b_hi; b += 16) {
      const __m512 x = _mm512_load_ps(sc[r] + b);
      const __mmask16 ok = _mm512_cmp_ps_mask(x, neg_inf, _CMP_NEQ_UQ);  // NaN scores weigh NaN
      const __m512 e = _mm512_maskz_mov_ps(ok, exp16(_mm512_maskz_sub_ps(ok, x, vm)));
      _mm512_store_ps(w[r] + b, e);
      sum += static_cast<double>(tiled::tree16(_mm512_castps512_ps256(e), _mm512_extractf32x8_ps(e, 1)));
    }
    st[r].S = static_cast<float>(static_cast<double>(st[r].S) + sum);
  }

  // Values: C vectors of 16 dimensions at a time.
  if (all_lo >= all_hi) all_lo = all_hi = any_hi;
  auto values = [&]<int C>(int64_t c) RP_ALWAYS_INLINE {
    __m512 a[NQ][C];
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) a[r][j] = _mm512_load_ps(st[r].acc + c + 16 * j);
    auto step = [&](int64_t p, bool all) RP_ALWAYS_INLINE {
      __m512 v[C];
      if constexpr (F16Rows) {
        const uint16_t* vr = v16[p] + v_off + c;
#pragma GCC unroll 4
        for (int j = 0; j < C; ++j) v[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + 16 * j)));
      } else {
        const float* vr = kv.v + ((p - kv.base) * d + c);
#pragma GCC unroll 4
        for (int j = 0; j < C; ++j) v[j] = _mm512_loadu_ps(vr + 16 * j);
      }
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r) {
        if (!all && !(active[r] && p >= lo[r] && p < hi[r])) continue;
        const __m512 wv = _mm512_set1_ps(w[r][p - ts]);
#pragma GCC unroll 4
        for (int j = 0; j < C; ++j) a[r][j] = _mm512_fmadd_ps(wv, v[j], a[r][j]);
      }
    };
    for (int64_t p = any_lo; p < all_lo; ++p) step(p, false);
    for (int64_t p = all_lo; p < all_hi; ++p) step(p, true);
    for (int64_t p = all_hi; p < any_hi; ++p) step(p, false);
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) _mm512_store_ps(st[r].acc + c + 16 * j, a[r][j]);
  };
  int64_t c = 0;
  for (; c + 64 <= d; c += 64) values.template operator()<4>(c);
  for (; c < d; c += 16) values.template operator()<1>(c);
}

// One tile of one group of attend_tiled_avx512 (walk_row_tiles' callback).
struct WidenedContext {
  const TiledKv* kv;
  float scale;
};

void widened_tile_any(void* ctx, const TiledGroup& g, int64_t ts, int64_t, int64_t, bool, RowState* st) {
  const WidenedContext& c = *static_cast<const WidenedContext*>(ctx);
  tiled::with_query_count(g.queries.n, [&]<int NQ>() { tile_step<NQ>(*c.kv, g.queries, c.scale, ts, st); });
}

// K of 16 positions (rows[i] + c for dimensions c of [0, d), d a multiple of
// 16) transposed to f16 [d][16] at kt: a 16-bit transpose of 8 rows at a
// time within each 128-bit lane (3 unpack stages), then one two-source
// permute pairs the halves, so 32 dimensions of 16 keys take 64 shuffles
// (converting to f32 first would take twice as many). As each row loads,
// the lines of next_k[i] and next_v[i] (d halves each) are requested.
RP_ALWAYS_INLINE inline void transpose_k16(const uint16_t* const* rows, int64_t d, uint16_t* kt,
                                           const uint16_t* const* next_k, const uint16_t* const* next_v) {
  const __m512i first_lanes = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i last_lanes = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t c = 0; c < d; c += 32) {
    const bool full = c + 32 <= d;
    const __mmask32 m = full ? 0xFFFFFFFFu : 0xFFFFu;
    // half[h][i], 128-bit lane L: keys 8h .. 8h + 7 of dimension c + 8L + i.
    __m512i half[2][8];
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m512i r[8], s[8], t[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        if (c == 0)
          for (int64_t off = 0; off < d; off += 32) {
            _mm_prefetch(reinterpret_cast<const char*>(next_k[8 * h + i] + off), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(next_v[8 * h + i] + off), _MM_HINT_T0);
          }
        r[i] = _mm512_maskz_loadu_epi16(m, rows[8 * h + i] + c);
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        s[2 * i] = _mm512_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        s[2 * i + 1] = _mm512_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
      }
#pragma GCC unroll 2
      for (int i = 0; i < 2; ++i) {
        t[4 * i + 0] = _mm512_unpacklo_epi32(s[4 * i + 0], s[4 * i + 2]);
        t[4 * i + 1] = _mm512_unpackhi_epi32(s[4 * i + 0], s[4 * i + 2]);
        t[4 * i + 2] = _mm512_unpacklo_epi32(s[4 * i + 1], s[4 * i + 3]);
        t[4 * i + 3] = _mm512_unpackhi_epi32(s[4 * i + 1], s[4 * i + 3]);
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        half[h][2 * i] = _mm512_unpacklo_epi64(t[i], t[4 + i]);
        half[h][2 * i + 1] = _mm512_unpackhi_epi64(t[i], t[4 + i]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512i a = _mm512_permutex2var_epi64(half[0][i], first_lanes, half[1][i]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(kt + (c + i) * 16), _mm512_castsi512_si256(a));
      _mm256_store_si256(reinterpret_cast<__m256i*>(kt + (c + 8 + i) * 16), _mm512_extracti64x4_epi64(a, 1));
      if (full) {
        const __m512i b = _mm512_permutex2var_epi64(half[0][i], last_lanes, half[1][i]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(kt + (c + 16 + i) * 16), _mm512_castsi512_si256(b));
        _mm256_store_si256(reinterpret_cast<__m256i*>(kt + (c + 24 + i) * 16), _mm512_extracti64x4_epi64(b, 1));
      }
    }
  }
}

alignas(64) const uint16_t kZeroRow[256] = {};  // stands in for positions outside [lo, hi)

// The tile's K of KV head kv_off, blocks [b_lo, b_hi), transposed into kt;
// the next tile's rows requested meanwhile (the rows are latency-bound
// otherwise: +7-20 % decode tokens/s at depth 3000). The requests are spread
// over the transpose, a row of the next tile per row loaded: issued all at
// once they filled the line-fill buffers and stalled the core (decode at
// depth 1024 ~7 % slower, 3000 ~10 %, measured token by token in one
// process).
void transpose_tile(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t kv_off, int64_t d,
                    int64_t ts, int64_t lo, int64_t hi, int64_t b_lo, int64_t b_hi, uint16_t* kt) {
  const int64_t next_hi = hi < ts + 2 * kTile ? hi : ts + 2 * kTile;
  for (int64_t b0 = b_lo; b0 < b_hi; b0 += 16) {
    const uint16_t* rows[16];
    const uint16_t* next_k[16];
    const uint16_t* next_v[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      const int64_t p = ts + b0 + i, next = p + kTile;
      rows[i] = p >= lo && p < hi ? key_rows[p] + kv_off : kZeroRow;
      next_k[i] = next < next_hi ? key_rows[next] + kv_off : kZeroRow;
      next_v[i] = next < next_hi ? value_rows[next] + kv_off : kZeroRow;
    }
    transpose_k16(rows, d, kt + b0 * d, next_k, next_v);
  }
}

// One tile of one group (queries sharing a KV head) read in place; kt
// already holds the tile's K when the previous group had the same KV head
// (fresh = false).
template <int NQ>
void rows_tile(const uint16_t* const* key_rows, const uint16_t* const* value_rows, const TiledGroup& g, int64_t d,
               float scale, int64_t ts, int64_t lo, int64_t hi, bool fresh, uint16_t* kt, RowState* st) {
  const int64_t b_lo = (lo > ts ? lo - ts : 0) / 16 * 16, b_hi = hi - ts < kTile ? hi - ts : kTile;
  if (fresh) transpose_tile(key_rows, value_rows, g.kv_off, d, ts, lo, hi, b_lo, b_hi, kt);
  tile_step<NQ, true>(TiledKv{nullptr, nullptr, ts, d}, g.queries, scale, ts, st, kt, value_rows, g.kv_off);
}

struct RowsContext {
  const uint16_t* const* key_rows;
  const uint16_t* const* value_rows;
  int64_t d;
  float scale;
  uint16_t* kt;
};

void rows_tile_any(void* ctx, const TiledGroup& g, int64_t ts, int64_t lo, int64_t hi, bool fresh, RowState* st) {
  const RowsContext& c = *static_cast<const RowsContext*>(ctx);
  tiled::with_query_count(g.queries.n, [&]<int NQ>() {
    rows_tile<NQ>(c.key_rows, c.value_rows, g, c.d, c.scale, ts, lo, hi, fresh, c.kt, st);
  });
}

}  // namespace

void attend_tiled_rows_avx512(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t d,
                              const TiledGroup* groups, int n_groups, float scale) {
  // (A pointer and a count, not a std::span: no library template is
  // instantiated here.)
  alignas(64) static thread_local uint16_t kt[4 * 256 * 16];
  RowsContext c{key_rows, value_rows, d, scale, kt};
  tiled::walk_row_tiles(groups, n_groups, d, &rows_tile_any, &c);
}

void attend_tiled_avx512(const TiledKv& kv, const TiledGroup* groups, int n_groups, float scale) {
  WidenedContext c{&kv, scale};
  tiled::walk_row_tiles(groups, n_groups, kv.d, &widened_tile_any, &c);
}

}  // namespace reprise::kernels

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
