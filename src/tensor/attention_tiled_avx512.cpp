// The tiled attention kernels (attention_tiled.h) with 16-lane AVX-512
// vectors: a 16-position block is one vector, 4 queries keep 16 score chains
// (a whole 64-position tile) or 16 value chains in flight. Prompts read the
// layer's widened f32 K/V; decode and short prompt chunks read the f16 rows
// in place (keys stored in 16-position groups are already [d][16]). The arithmetic is
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
#include "tensor/avx512_math.h"
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
using tiled::F16Tile;
using tiled::RowState;
using tiled::RowsContext;

using avx512::exp16;

// A tile's online softmax for one query (the steps of attention_tiled.cpp):
// its scores sc[b_lo, b_hi) (masked -inf) with maximum vmax become weights
// w[b_lo, b_hi), and its state is rescaled and summed. False when no score
// is finite: the query skips the tile, as ggml's does.
RP_ALWAYS_INLINE inline bool softmax_tile(const float* sc, __m512 vmax, int64_t b_lo, int64_t b_hi, int64_t d,
                                          RowState& st, float* w) {
  const float m = _mm512_reduce_max_ps(vmax);
  if (m == kNegInf) return false;
  tiled::raise_max(st, m, d);
  const __m512 vm = _mm512_set1_ps(st.M), neg_inf = _mm512_set1_ps(kNegInf);
  double sum = 0.0;
  for (int64_t b = b_lo; b < b_hi; b += 16) {
    const __m512 x = _mm512_load_ps(sc + b);
    const __mmask16 ok = _mm512_cmp_ps_mask(x, neg_inf, _CMP_NEQ_UQ);  // NaN scores weigh NaN
    const __m512 e = _mm512_maskz_mov_ps(ok, exp16(_mm512_maskz_sub_ps(ok, x, vm)));
    _mm512_store_ps(w + b, e);
    sum += static_cast<double>(tiled::tree16(_mm512_castps512_ps256(e), _mm512_extractf32x8_ps(e, 1)));
  }
  st.S = static_cast<float>(static_cast<double>(st.S) + sum);
  return true;
}

// Scores of positions ts + at .. + 15 (acc, unscaled) for a query attending
// to [first, end): scaled, -inf outside, stored at sc + at; vmax raised (a
// NaN score never becomes the maximum).
RP_ALWAYS_INLINE inline void store_scores(__m512 acc, int64_t ts, int64_t at, int64_t first, int64_t end,
                                          __m512 vscale, float* sc, __m512& vmax) {
  const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(ts + at)),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __mmask16 ok = _mm512_cmpge_epi32_mask(pos, _mm512_set1_epi32(static_cast<int32_t>(first))) &
                       _mm512_cmplt_epi32_mask(pos, _mm512_set1_epi32(static_cast<int32_t>(end)));
  const __m512 x = _mm512_mask_mul_ps(_mm512_set1_ps(kNegInf), ok, acc, vscale);
  _mm512_store_ps(sc + at, x);
  vmax = _mm512_max_ps(x, vmax);
}

// Positions [ts, ts + 64) of one tile for NQ queries sharing a KV head.
// F16Rows (decode): K and V are f16 in place (f16); otherwise from kv's f32
// buffers.
template <int NQ, bool F16Rows = false>
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
  const __m512 vscale = _mm512_set1_ps(scale);
  auto score_blocks = [&]<int NB>(int64_t b0) RP_ALWAYS_INLINE {
    const float* kb = F16Rows ? nullptr : kv.kt + (ts + b0 - kv.base) / 16 * d * 16;
    const uint16_t* kb16[NB];
    if constexpr (F16Rows) {
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) kb16[j] = f16->k[b0 / 16 + j];
    }
    __m512 acc[NQ][NB];
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
    // Dimensions [i0, i1); in place (F16Rows) the lines requested lie in
    // this tile's blocks (InTile) or the next tile's (F16Tile).
    auto dims = [&]<bool InTile>(int64_t i0, int64_t i1) RP_ALWAYS_INLINE {
      const uint16_t* ahead[NB];
      if constexpr (F16Rows) {
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j)
          ahead[j] = f16->template key_request_base<InTile>(b0 / 16 + j, d);
      }
      for (int64_t i = i0; i < i1; ++i) {
        __m512 k[NB];
        if constexpr (F16Rows) {
          if ((i & 1) == 0)  // a line holds two dimensions of a block
#pragma GCC unroll 4
            for (int j = 0; j < NB; ++j) _mm_prefetch(reinterpret_cast<const char*>(ahead[j] + i * 16), _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j)
          k[j] = F16Rows ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb16[j] + i * 16)))
                         : _mm512_load_ps(kb + j * d * 16 + i * 16);
#pragma GCC unroll 4
        for (int r = 0; r < NQ; ++r) {
          const __m512 q = _mm512_set1_ps(q_row[r][i]);
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_fmadd_ps(q, k[j], acc[r][j]);
        }
      }
    };
    if constexpr (F16Rows) {
      const int64_t split = F16Tile::key_split(d);
      dims.template operator()<true>(0, split);
      dims.template operator()<false>(split, d);
    } else {
      dims.template operator()<true>(0, d);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r)
        store_scores(acc[r][j], ts, b0 + 16 * j, qs.first[r], qs.end[r], vscale, sc[r], vmax[r]);
  };
  int64_t b0 = b_lo;
  if (NQ <= 4)
    for (; b0 + 48 < b_hi; b0 += 64) score_blocks.template operator()<4>(b0);
  for (; b0 < b_hi; b0 += 16) score_blocks.template operator()<1>(b0);

  // Online softmax.
  alignas(64) float w[NQ][kTile];
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r) {
    if (active[r] && !softmax_tile(sc[r], vmax[r], b_lo, b_hi, d, st[r], w[r])) {
      active[r] = false;
      all_lo = all_hi;
    }
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
        const uint16_t* vr = f16->v[p] + f16->v_off + c;
        if (p + kTile < f16->v_next_hi) {
          const char* next = reinterpret_cast<const char*>(f16->v[p + kTile] + f16->v_off + c);
#pragma GCC unroll 4
          for (int j = 0; j < C; j += 2) _mm_prefetch(next + 64 * (j / 2), _MM_HINT_T0);  // 32 values a line
        }
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

// Two heads of one decode query, each with its own K and V (multi-head
// attention), one tile: tile_step<1, true> for both, interleaved. One head
// keeps 4 FMA chains in flight (4 score blocks, then 4 value vectors), one
// FMA a cycle at a 4-cycle latency where the core has two units, and
// reads one K/V stream; the two heads' chains and streams are independent,
// so together they keep 8 chains and two streams. Decode's K/V come from
// memory (a token's weights evict them): there the pair measured
// 1.04-1.17x. With K/V in cache the f16 conversions bind it and it measured
// 0.73-0.91x of two single steps (docs/performance.md, Decode attention:
// two heads at a time). Every element's chain is tile_step's, in its
// order: the same bits.
void tile_step_pair(const TiledGroup* const (&g)[2], float scale, int64_t ts, RowState* const (&st)[2],
                    const F16Tile (&f16)[2], int64_t d) {
  constexpr int H = 2;
  // The pair shares its query's positions (pairs_up): one set of rows.
  const tiled::TileRows rows = tiled::tile_rows(g[0]->queries, 1, ts);
  const int64_t any_lo = rows.any_lo, any_hi = rows.any_hi;
  if (any_lo >= any_hi) return;
  const int64_t b_lo = (any_lo - ts) / 16 * 16, b_hi = any_hi - ts;

  alignas(64) float sc[H][kTile];
  __m512 vmax[H];
  const float* q_row[H];
#pragma GCC unroll 2
  for (int h = 0; h < H; ++h) {
    vmax[h] = _mm512_set1_ps(kNegInf);
    q_row[h] = g[h]->queries.q[0];
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  auto score_blocks = [&]<int NB>(int64_t b0) RP_ALWAYS_INLINE {
    const uint16_t* kb16[H][NB];
#pragma GCC unroll 2
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) kb16[h][j] = f16[h].k[b0 / 16 + j];
    __m512 acc[H][NB];
#pragma GCC unroll 2
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[h][j] = _mm512_setzero_ps();
    // Dimensions [i0, i1), two at a time (d is a multiple of 16): the lines
    // requested lie in this tile's blocks (InTile) or the next tile's.
    auto dims = [&]<bool InTile>(int64_t i0, int64_t i1) RP_ALWAYS_INLINE {
      // Dimension i's request is at ahead[h][j] + i * 16 (F16Tile).
      const uint16_t* ahead[H][NB];
#pragma GCC unroll 2
      for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j)
          ahead[h][j] = f16[h].template key_request_base<InTile>(b0 / 16 + j, d);
      for (int64_t i = i0; i < i1; i += 2) {
#pragma GCC unroll 2
        for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j)  // a line holds two dimensions of a block
            _mm_prefetch(reinterpret_cast<const char*>(ahead[h][j] + i * 16), _MM_HINT_T0);
#pragma GCC unroll 2
        for (int64_t ii = i; ii < i + 2; ++ii)
#pragma GCC unroll 2
          for (int h = 0; h < H; ++h) {
            const __m512 q = _mm512_set1_ps(q_row[h][ii]);
#pragma GCC unroll 4
            for (int j = 0; j < NB; ++j)
              acc[h][j] = _mm512_fmadd_ps(
                  q, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb16[h][j] + ii * 16))),
                  acc[h][j]);
          }
      }
    };
    const int64_t split = F16Tile::key_split(d);
    dims.template operator()<true>(0, split);
    dims.template operator()<false>(split, d);
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
#pragma GCC unroll 2
      for (int h = 0; h < H; ++h)
        store_scores(acc[h][j], ts, b0 + 16 * j, g[h]->queries.first[0], g[h]->queries.end[0], vscale, sc[h],
                     vmax[h]);
  };
  int64_t b0 = b_lo;
  for (; b0 + 48 < b_hi; b0 += 64) score_blocks.template operator()<4>(b0);
  for (; b0 < b_hi; b0 += 16) score_blocks.template operator()<1>(b0);

  // Online softmax, per head.
  alignas(64) float w[H][kTile];
  bool active[H];
#pragma GCC unroll 2
  for (int h = 0; h < H; ++h)
    active[h] = rows.active[0] && softmax_tile(sc[h], vmax[h], b_lo, b_hi, d, st[h][0], w[h]);

  // Values: each active head's keys [lo, hi) in order (the same for both).
  const int64_t lo = rows.lo[0], hi = rows.hi[0];
  auto values = [&]<int C>(int64_t c) RP_ALWAYS_INLINE {
    __m512 a[H][C];
#pragma GCC unroll 2
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) a[h][j] = _mm512_load_ps(st[h][0].acc + c + 16 * j);
    // Key p into head h's accumulators (all heads when Both), requesting
    // position p + kTile's rows when Request. The heads share their rows
    // (one context: pairs_up), at their own offsets.
    const uint16_t* const* value_rows = f16[0].v;
    auto step = [&]<bool Both, bool Request>(int64_t p, int only) RP_ALWAYS_INLINE {
      const uint16_t* row = value_rows[p];
      const uint16_t* next = Request ? value_rows[p + kTile] : nullptr;
#pragma GCC unroll 2
      for (int h = 0; h < H; ++h) {
        if (!Both && h != only) continue;
        const uint16_t* vr = row + f16[h].v_off + c;
        if constexpr (Request) {
          const char* ahead = reinterpret_cast<const char*>(next + f16[h].v_off + c);
#pragma GCC unroll 4
          for (int j = 0; j < C; j += 2) _mm_prefetch(ahead + 64 * (j / 2), _MM_HINT_T0);  // 32 values a line
        }
        const __m512 wv = _mm512_set1_ps(w[h][p - ts]);
#pragma GCC unroll 4
        for (int j = 0; j < C; ++j)
          a[h][j] = _mm512_fmadd_ps(
              wv, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vr + 16 * j))), a[h][j]);
      }
    };
    // Positions below `requesting` request the next tile's rows.
    int64_t requesting = f16[0].v_next_hi - kTile;
    requesting = requesting < lo ? lo : requesting > hi ? hi : requesting;
    auto positions = [&]<bool Both>(int only) RP_ALWAYS_INLINE {
      for (int64_t p = lo; p < requesting; ++p) step.template operator()<Both, true>(p, only);
      for (int64_t p = requesting; p < hi; ++p) step.template operator()<Both, false>(p, only);
    };
    if (active[0] && active[1]) {
      positions.template operator()<true>(0);
    } else {
      for (int h = 0; h < H; ++h)
        if (active[h]) positions.template operator()<false>(h);
    }
#pragma GCC unroll 2
    for (int h = 0; h < H; ++h)
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) _mm512_store_ps(st[h][0].acc + c + 16 * j, a[h][j]);
  };
  int64_t c = 0;
  for (; c + 64 <= d; c += 64) values.template operator()<4>(c);
  for (; c < d; c += 16) values.template operator()<1>(c);
}

// Whether a decode task's groups take tile_step_pair two by two: an even
// number of groups, one query each, all attending to the same positions,
// the two of a pair of different KV heads, with keys in whole 16-position
// groups (read in place: nothing gathered into the context's one scratch
// tile).
bool pairs_up(const RowsContext& c, const TiledGroup* groups, int n) {
  if (c.key_group != kKeyGroup || n % 2 != 0 || n > kMaxTiledGroups) return false;
  const TiledQueries& first = groups[0].queries;
  for (int i = 0; i < n; ++i) {
    const TiledQueries& q = groups[i].queries;
    if (q.n != 1 || q.first[0] != first.first[0] || q.end[0] != first.end[0]) return false;
    if (i % 2 == 1 && groups[i].kv_off == groups[i - 1].kv_off) return false;
  }
  return true;
}

// tiled::walk_row_tiles for groups that pair up (its order of tiles, its
// start and finish of the states).
void walk_pairs(const RowsContext& c, const TiledGroup* groups, int n) {
  RowState st[kMaxTiledGroups][kMaxTiledQueries];
  for (int i = 0; i < n; ++i) tiled::start(st[i], 1, c.d);
  const int64_t lo = groups[0].queries.first[0], hi = groups[0].queries.end[0];
  for (int64_t ts = lo / kTile * kTile; ts < hi; ts += kTile)
    for (int i = 0; i + 1 < n; i += 2) {
      const TiledGroup* const g[2] = {&groups[i], &groups[i + 1]};
      const F16Tile t[2] = {tiled::f16_tile(c, groups[i], ts, lo, hi, true),
                            tiled::f16_tile(c, groups[i + 1], ts, lo, hi, true)};
      RowState* const s[2] = {st[i], st[i + 1]};
      tile_step_pair(g, c.scale, ts, s, t, c.d);
    }
  for (int i = 0; i < n; ++i) tiled::finish(st[i], groups[i].queries, c.d);
}

}  // namespace

void attend_tiled_rows_avx512(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t d,
                              int64_t key_group, const TiledGroup* groups, int n_groups, float scale) {
  // (A pointer and a count, not a std::span: no library template is
  // instantiated here.)
  alignas(64) static thread_local uint16_t kt[4 * 256 * 16];
  RowsContext c{key_rows, value_rows, d, key_group, scale, kt};
  // Multi-head decode: the task's heads two at a time (tile_step_pair).
  if (pairs_up(c, groups, n_groups)) return walk_pairs(c, groups, n_groups);
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
