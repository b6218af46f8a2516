// Per-query state of the tiled attention kernels (attention_tiled.cpp and
// attention_tiled_avx512.cpp) and the steps both share, so both give the
// same bits. Compiled with the base (x86-64-v3) options in both files: the
// AVX-512 file includes it before its target pragma.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/attention_tiled.h"
#include "tensor/key_layout.h"

namespace reprise::kernels::tiled {

constexpr int64_t kTile = 64;
// How far ahead decode requests a key block's lines: 24 dimensions, 12
// lines, 768 bytes of the block's stream. Requesting the next tile's line in
// step with this tile's (8 KB ahead) read decode's K/V from memory ~0.87x as
// fast; 16 dimensions measured 0.97-0.99x of 24 end to end, 32 about the
// same (docs/performance.md, Decode attention: keys requested a fixed
// distance ahead).
constexpr int64_t kKeyLeadDims = 24;
// The lead for head size d: at most the block itself, so the requests of a
// small head's block fall in the next tile's block, not past it.
inline int64_t key_lead_dims(int64_t d) { return d < kKeyLeadDims ? d : kKeyLeadDims; }
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

// Where decode's f16 K and V of one tile are, and what to request from
// memory while the tile computes: each K block's lines kKeyLeadDims
// dimensions ahead (block b's keys continue in the next tile's block b, so a
// block's last lines request the next tile's first ones) and the next tile's
// V rows, a line per line loaded (issued all at once per tile they filled
// the line-fill buffers and stalled the core: decode at depth 1024 ~7 %
// slower, 3000 ~15 %; without requests decode at depth ran 2.4x slower).
struct F16Tile {
  const uint16_t* k[4];       // block b (positions ts + 16 b ..) as [d][16] f16
  const uint16_t* next_k[4];  // block b of the next tile (this block's when there is none)
  const uint16_t* const* v;   // value rows: position p at v[p] + v_off
  int64_t v_off;
  int64_t v_next_hi;  // request V rows p + 64 below this (0: none)

  // Key dimensions below key_split(d) request lines in this tile's blocks,
  // the others in the next tile's.
  static int64_t key_split(int64_t d) { return d - key_lead_dims(d); }
  // For dimensions on one side of key_split(d) (InTile: below it), the
  // request that goes with block b's dimension i is at base + i * 16.
  template <bool InTile>
  const uint16_t* key_request_base(int b, int64_t d) const {
    const int64_t lead = key_lead_dims(d);
    return InTile ? k[b] + lead * 16 : next_k[b] + (lead - d) * 16;
  }
};

// What both ISAs' attend_tiled_rows read: f16 K and V in place.
struct RowsContext {
  const uint16_t* const* key_rows;
  const uint16_t* const* value_rows;
  int64_t d;
  int64_t key_group;
  float scale;
  uint16_t* kt;  // room for a tile's keys gathered from groups of fewer than 16
};

// Group g's part of tile [ts, ts + 64) (the groups together reading [lo,
// hi)) as an F16Tile. The first group of a KV head (fresh) requests the next
// tile; the groups after it find the tile in L1.
inline F16Tile f16_tile(const RowsContext& c, const TiledGroup& g, int64_t ts, int64_t lo, int64_t hi, bool fresh) {
  const int64_t b_lo = std::max<int64_t>(0, lo - ts) / 16 * 16, b_hi = std::min(hi - ts, kTile);
  const KeyView keys{c.key_rows, g.kv_off, c.key_group, c.d};
  const bool request = fresh && c.key_group == kKeyGroup;
  const int64_t next_hi = std::min(hi, ts + 2 * kTile);
  F16Tile t;
  for (int64_t b0 = b_lo; b0 < b_hi; b0 += 16) {
    const int b = static_cast<int>(b0 / 16);
    t.k[b] = key_tile16(keys, ts + b0, lo, hi, c.kt + b0 * c.d);
    t.next_k[b] = request && ts + kTile + b0 < next_hi ? keys.group_start(ts + kTile + b0) : t.k[b];
  }
  t.v = c.value_rows;
  t.v_off = g.kv_off;
  t.v_next_hi = request ? next_hi : 0;
  return t;
}

// A query's running maximum, sum and value accumulator.
struct RowState {
  float M;
  float S;
  alignas(64) float acc[256];
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

inline void start(RowState* st, int n, int64_t d) {
  for (int r = 0; r < n; ++r) {
    st[r].M = kNegInf;
    st[r].S = 0.0f;
    std::fill(st[r].acc, st[r].acc + d, 0.0f);
  }
}

inline void finish(const RowState* st, const TiledQueries& qs, int64_t d) {
  for (int r = 0; r < qs.n; ++r) {
    const float inv = st[r].S == 0.0f ? 0.0f : 1.0f / st[r].S;
    const __m256 f = _mm256_set1_ps(inv);
    for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(qs.out[r] + i, _mm256_mul_ps(_mm256_load_ps(st[r].acc + i), f));
  }
}

// The positions [lo, hi) some query of `qs` attends to.
struct Span {
  int64_t lo, hi;
};
inline Span query_span(const TiledQueries& qs) {
  Span s{qs.first[0], qs.end[0]};
  for (int r = 1; r < qs.n; ++r) {
    s.lo = std::min(s.lo, qs.first[r]);
    s.hi = std::max(s.hi, qs.end[r]);
  }
  return s;
}

// What the first n queries take of tile [ts, ts + 64): query r its keys
// [lo[r], hi[r]) (active when not empty); any query, [any_lo, any_hi); every
// query, [all_lo, all_hi) (empty when some query takes none).
struct TileRows {
  int64_t lo[kMaxTiledQueries], hi[kMaxTiledQueries];
  bool active[kMaxTiledQueries];
  int64_t any_lo, any_hi, all_lo, all_hi;
};
inline TileRows tile_rows(const TiledQueries& qs, int n, int64_t ts) {
  TileRows t;
  t.any_lo = ts + kTile;
  t.any_hi = ts;
  t.all_lo = ts;
  t.all_hi = ts + kTile;
  for (int r = 0; r < n; ++r) {
    t.lo[r] = std::max(qs.first[r], ts);
    t.hi[r] = std::min(qs.end[r], ts + kTile);
    t.active[r] = t.lo[r] < t.hi[r];
    if (t.active[r]) {
      t.any_lo = std::min(t.any_lo, t.lo[r]);
      t.any_hi = std::max(t.any_hi, t.hi[r]);
    }
    t.all_lo = std::max(t.all_lo, t.lo[r]);
    t.all_hi = std::min(t.all_hi, t.hi[r]);
  }
  return t;
}

// f.template operator()<n>() for a group's query count n in
// [1, kMaxTiledQueries]: the kernels are instantiated per count.
template <class F>
inline void with_query_count(int n, F&& f) {
  static_assert(kMaxTiledQueries == 4);
  switch (n) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    case 4: return f.template operator()<4>();
    default: return;
  }
}

// One tile of one group, for walk_row_tiles: group g's part of tile
// [ts, ts + 64), the groups together reading [lo, hi); fresh when g's KV head
// differs from the previous group's (for rows read in place: the tile's K is
// not yet transposed).
using RowTileFn = void (*)(void* ctx, const TiledGroup& g, int64_t ts, int64_t lo, int64_t hi, bool fresh,
                           RowState* st);

// The driver of both ISAs' attend_tiled_rows and attend_tiled: tiles
// outside and groups inside, so each group reads its KV head's rows (a
// stream of their own in the cache's head-major blocks) one tile at a time,
// and groups of one head take a tile while it is in L1 or L2; the groups'
// states are started and finished here. Groups that all share one KV head
// (a prompt task: one head's run of up to 128 queries) walk together, up to
// kMaxWalkGroups, so each tile comes from L3 or memory once per run rather
// than once per 16 queries; groups of several KV heads (decode tasks) share
// nothing and walk kMaxTiledGroups at a time.
inline bool one_kv_head(const TiledGroup* groups, int n) {
  for (int i = 1; i < n; ++i)
    if (groups[i].kv_off != groups[0].kv_off) return false;
  return true;
}
inline void walk_row_tiles(const TiledGroup* groups, int n, int64_t d, RowTileFn tile, void* ctx) {
  const int limit = one_kv_head(groups, n) ? kMaxWalkGroups : kMaxTiledGroups;
  if (n > limit) {
    walk_row_tiles(groups, limit, d, tile, ctx);
    walk_row_tiles(groups + limit, n - limit, d, tile, ctx);
    return;
  }
  // 140 KB: per thread rather than on the stack (walks do not nest).
  alignas(64) static thread_local RowState st[kMaxWalkGroups][kMaxTiledQueries];
  int64_t lo = INT64_MAX, hi = 0;
  for (int i = 0; i < n; ++i) {
    start(st[i], groups[i].queries.n, d);
    const Span keys = query_span(groups[i].queries);
    lo = std::min(lo, keys.lo);
    hi = std::max(hi, keys.hi);
  }
  for (int64_t ts = lo / kTile * kTile; ts < hi; ts += kTile)
    for (int i = 0; i < n; ++i) tile(ctx, groups[i], ts, lo, hi, i == 0 || groups[i - 1].kv_off != groups[i].kv_off, st[i]);
  for (int i = 0; i < n; ++i) finish(st[i], groups[i].queries, d);
}

}  // namespace reprise::kernels::tiled
