// How the ISA kernel files cover a product with their tile shapes, and the
// prefetch their decode tiles share. A kernel
// K<G, T>::run(args, g0, t0) computes G row groups x T tokens.
//
// Everything here is in an anonymous namespace, so each ISA file gets its own
// copies, calling its own kernels. Instantiated with a file's internal kernel
// types alone, GCC 12 still gave these templates weak external linkage (the
// kernel types are template template arguments) under the same names in
// every file, and the linker kept one copy for all: the AVX-VNNI table ran the
// AVX2 build's code for 19 of its entry points (with the other link order the
// AVX2 table would have run AVX-VNNI instructions on CPUs without them).
// tests/isa_symbols_test.sh checks that no ISA file shares such a symbol.
#pragma once
#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "tensor/kernels_impl.h"

namespace reprise::kernels {
namespace {

// Decode tiles stream each of their G groups' weights once: prefetch the
// lines `ahead` bytes past [p, p + bytes) in every group's stream (group_stride
// apart; the contiguous layout).
template <int G>
inline __attribute__((always_inline)) void prefetch_streams(const uint8_t* p, size_t group_stride, size_t bytes,
                                                            int64_t ahead) {
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (size_t off = 0; off < bytes; off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + g * group_stride + off + ahead), _MM_HINT_T0);
}

// Lines [l0, l1) of the run at p + ahead.
inline __attribute__((always_inline)) void prefetch_lines(const uint8_t* p, size_t l0, size_t l1, int64_t ahead) {
  for (size_t l = l0; l < l1; ++l) _mm_prefetch(reinterpret_cast<const char*>(p + l * 64 + ahead), _MM_HINT_T0);
}

// Share `part` of `Parts` of the lines of the tile's kBytes-long units (one
// k, block or section per group) at p, `ahead` bytes further along each
// group's own stream; the first parts take the extra lines. Decode tiles
// spread a unit's prefetches over its parts: a burst of a whole unit's lines
// times 8 streams waits for fill buffers.
// Interleaved groups (group_stride == kBytes) are one run per unit row
// (unit_stride bytes), read part by part in parallel, so the distance is
// in whole rows: as many units as `ahead` bytes of one stream hold, at
// least one. The first tile of the row (g0 == 0; p is the row's start)
// prefetches all of it, so the tiles after it (small batches take several
// per super-group) find their units in cache instead of each reading its
// part of every row from memory; they prefetch nothing.
template <size_t kBytes>
inline __attribute__((always_inline)) int64_t rows_ahead(size_t unit_stride, int64_t ahead) {
  const int64_t units = (ahead + static_cast<int64_t>(kBytes) / 2) / static_cast<int64_t>(kBytes);
  return (units > 1 ? units : 1) * static_cast<int64_t>(unit_stride);
}

// Part `part` of `Parts` of the lines of each of G groups' kBytes-long unit
// at p (group_stride apart), `ahead` bytes further along each group's stream.
template <int G, size_t kBytes, int Parts>
inline __attribute__((always_inline)) void prefetch_unit_part(const uint8_t* p, size_t group_stride, int part,
                                                              int64_t ahead) {
  constexpr size_t kLines = (kBytes + 63) / 64;
  const size_t l0 = (part * kLines + Parts - 1) / Parts, l1 = ((part + 1) * kLines + Parts - 1) / Parts;
  prefetch_streams<G>(p + l0 * 64, group_stride, (l1 - l0) * 64, ahead);
}

template <int G, size_t kBytes, int Parts>
inline __attribute__((always_inline)) void prefetch_share(const uint8_t* p, size_t group_stride, size_t unit_stride,
                                                          int64_t g0, int part, int64_t ahead) {
  if (group_stride == kBytes) {
    if (g0 != 0) return;
    const size_t lines = (unit_stride + 63) / 64;
    prefetch_lines(p, (part * lines + Parts - 1) / Parts, ((part + 1) * lines + Parts - 1) / Parts,
                   rows_ahead<kBytes>(unit_stride, ahead));
    return;
  }
  prefetch_unit_part<G, kBytes, Parts>(p, group_stride, part, ahead);
}

// Multi-token tiles whose weights come from memory or L3 (the first token
// tile of a call: later ones find them in cache) request the next tile's
// weights as they compute: the run's next G groups, the same unit's lines,
// spread over the tile's units, so the next tile's misses overlap this
// tile's compute (a burst of a whole tile's lines waits for fill buffers).
// A run's last tile requests nothing: where groups are dealt to regions, the
// next run's groups follow this run's in memory and the hardware prefetcher
// reads them already (requesting them too measured 0.95x on F16 pp16).
// Kernels compile their tiles with and without the requests (kNext) and
// choose per tile: a branch per unit cost the cached case 3-6 %.
// Measured (session 32, docs/performance.md): 60M Q8_0 pp16 1.18x, Q4_K
// 1.07x, Q6_K 1.09x; 8 sequences decoding together, Q4_K 1.10x.
template <int G>
inline __attribute__((always_inline)) bool requests_next_groups(const MatmulArgs& a, int64_t g0, int64_t t0) {
  return a.prefetch_next && t0 == 0 && g0 + 2 * G <= a.n_groups;
}

// The request: part `part` of `Parts` of the lines of the unit at
// unit_offset (bytes from each group's start) in the next G groups.
template <int G, size_t kBytes, int Parts>
inline __attribute__((always_inline)) void prefetch_next_groups(const MatmulArgs& a, int64_t g0, size_t unit_offset,
                                                                int part) {
  prefetch_unit_part<G, kBytes, Parts>(a.w + (g0 + G) * a.group_stride + unit_offset, a.group_stride, part, 0);
}

// prefetch_share for a part known only at run time (a loop over a unit's
// parts): dispatches to the compile-time part, so every case is unrolled. A
// loop over a run-time line count took more instructions than the prefetches
// it issued (and a register per stream).
template <int G, size_t kBytes, int Parts>
inline __attribute__((always_inline)) void prefetch_share_at(const uint8_t* p, size_t group_stride,
                                                             size_t unit_stride, int64_t g0, int part, int64_t ahead) {
  [&]<int... P>(std::integer_sequence<int, P...>) {
    ((part == P ? prefetch_share<G, kBytes, Parts>(p, group_stride, unit_stride, g0, P, ahead) : void()), ...);
  }(std::make_integer_sequence<int, Parts>{});
}

// The F types' prefetch at input k (p: the tile's unit k, kStep bytes per
// group): interleaved groups as prefetch_share (the row's first tile takes
// the row's lines); contiguous ones take a line per group every second k
// (two 16-bit k, half of an F32 pair).
template <int G, size_t kStep>
inline __attribute__((always_inline)) void prefetch_f_unit(const uint8_t* p, size_t group_stride, size_t unit_stride,
                                                           int64_t g0, int64_t k, int64_t ahead) {
  if (group_stride == kStep) {
    if (g0 != 0) return;
    prefetch_lines(p, 0, (unit_stride + 63) / 64, rows_ahead<kStep>(unit_stride, ahead));
  } else if (!(k & 1)) {
    prefetch_streams<G>(p, group_stride, 64, ahead);
  }
}

// All groups at tokens [t0, t0 + T), with tiles of the widths Gs..., widest
// first (the last should be 1 so every group is covered), super-group by
// super-group: a tile's groups share one stride.
template <template <int, int> class K, int T, int... Gs>
inline void over_groups(const MatmulArgs& a, int64_t t0) {
  for (int64_t g = 0; g < a.n_groups;) {
    MatmulArgs b = a;
    b.n_groups = a.layout.point(a.g_first + g, a.n_groups - g, b);
    b.y = a.y + g * kGroupRows;
    b.n_rows = a.n_rows - g * kGroupRows;
    int64_t h = 0;
    (
        [&] {
          for (; h + Gs <= b.n_groups; h += Gs) K<Gs, T>::run(b, h, t0);
        }(),
        ...);
    g += b.n_groups;
  }
}

// Token tiles of TMax tokens, and one tile of the remaining R < TMax tokens,
// with group widths GPrefill then 1. A single token (decode, which is bound
// by memory) uses the decode widths GDecode... instead: wider tiles read more
// weight streams at once.
// The remainder tiles of up to TSmall tokens (small batches: several
// sequences decoding together) take GSmall groups at a time first (0: none),
// so that, like decode tiles, they read whole interleaved rows.
template <template <int, int> class K, int GPrefill, int TMax, int GSmall, int TSmall, int... GDecode>
void run_tiles_small(const MatmulArgs& a) {
  int64_t t = 0;
  for (; t + TMax <= a.n_tokens; t += TMax) over_groups<K, TMax, GPrefill, 1>(a, t);
  const int64_t rest = a.n_tokens - t;
  auto tail = [&](auto tag) {
    constexpr int R = decltype(tag)::value;
    if constexpr (R == 1) over_groups<K, 1, GDecode...>(a, t);
    else if constexpr (GSmall > 0 && R <= TSmall) over_groups<K, R, GSmall, GPrefill, 1>(a, t);
    else over_groups<K, R, GPrefill, 1>(a, t);
  };
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rest == I + 1 ? (tail(std::integral_constant<int, I + 1>{}), 0) : 0), ...);
  }(std::make_integer_sequence<int, TMax - 1>{});
}

template <template <int, int> class K, int GPrefill, int TMax, int... GDecode>
void run_tiles(const MatmulArgs& a) {
  run_tiles_small<K, GPrefill, TMax, 0, 0, GDecode...>(a);
}

// Small batches (2 to kTokenTile - 1 tokens) on a layout of GRow regions
// in one pass of GRow-group tiles, one region row each (then single
// groups); other batches and layouts as run_tiles.
template <template <int, int> class K, int GPrefill, int TMax, int GRow, int... GDecode>
void run_tiles_rows(const MatmulArgs& a) {
  if (a.n_tokens <= 1 || a.n_tokens >= kTokenTile || a.layout.regions != GRow)
    return run_tiles<K, GPrefill, TMax, GDecode...>(a);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((a.n_tokens == I + 2 ? (over_groups<K, I + 2, GRow, 1>(a, 0), 0) : 0), ...);
  }(std::make_integer_sequence<int, kTokenTile - 2>{});
}

// Small batches (2 to kTokenTile - 1 tokens: sequences decoding together)
// token by token with the decode tiles, which read whole interleaved rows
// where the prefill tiles would read a part of each; other batches as
// run_tiles.
template <template <int, int> class K, int GPrefill, int TMax, int... GDecode>
void run_tiles_token_by_token(const MatmulArgs& a) {
  if (a.n_tokens <= 1 || a.n_tokens >= kTokenTile) return run_tiles<K, GPrefill, TMax, GDecode...>(a);
  for (int64_t t = 0; t < a.n_tokens; ++t) over_groups<K, 1, GDecode...>(a, t);
}

}  // namespace
}  // namespace reprise::kernels
