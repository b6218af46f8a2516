// How the ISA kernel files cover a product with their tile shapes, and the
// prefetch their decode tiles share. A kernel
// K<G, T>::run(args, g0, t0) computes G row groups x T tokens. Templates
// only, instantiated with each ISA file's own (internal) kernel types, so no
// code compiled for one instruction set is shared with another.
#pragma once
#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "tensor/kernels_impl.h"

namespace reprise::kernels {

// Decode tiles stream each of their G groups' weights once: prefetch the
// lines `ahead` bytes past [p, p + bytes) in every group's stream (group_bytes
// apart).
template <int G>
inline __attribute__((always_inline)) void prefetch_streams(const uint8_t* p, size_t group_bytes, size_t bytes,
                                                            int64_t ahead) {
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (size_t off = 0; off < bytes; off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + g * group_bytes + off + ahead), _MM_HINT_T0);
}

// Share `part` of `Parts` of the lines of a kBytes-long unit (a block or a
// section) at p, prefetched in every stream as prefetch_streams does; the
// first parts take the extra lines. Decode tiles spread a unit's prefetches
// over its parts: a burst of a whole unit's lines times 8 streams waits for
// fill buffers.
template <int G, size_t kBytes, int Parts>
inline __attribute__((always_inline)) void prefetch_share(const uint8_t* p, size_t group_bytes, int part,
                                                          int64_t ahead) {
  constexpr size_t kLines = (kBytes + 63) / 64;
  const size_t l0 = (part * kLines + Parts - 1) / Parts, l1 = ((part + 1) * kLines + Parts - 1) / Parts;
  prefetch_streams<G>(p + l0 * 64, group_bytes, (l1 - l0) * 64, ahead);
}

// prefetch_share for a part known only at run time (a loop over a unit's
// parts): dispatches to the compile-time part, so every case is unrolled. A
// loop over a run-time line count took more instructions than the prefetches
// it issued (and a register per stream).
template <int G, size_t kBytes, int Parts>
inline __attribute__((always_inline)) void prefetch_share_at(const uint8_t* p, size_t group_bytes, int part,
                                                             int64_t ahead) {
  [&]<int... P>(std::integer_sequence<int, P...>) {
    ((part == P ? prefetch_share<G, kBytes, Parts>(p, group_bytes, P, ahead) : void()), ...);
  }(std::make_integer_sequence<int, Parts>{});
}

// All groups at tokens [t0, t0 + T), with tiles of the widths Gs..., widest
// first (the last should be 1 so every group is covered).
template <template <int, int> class K, int T, int... Gs>
inline void over_groups(const MatmulArgs& a, int64_t t0) {
  int64_t g = 0;
  (
      [&] {
        for (; g + Gs <= a.n_groups; g += Gs) K<Gs, T>::run(a, g, t0);
      }(),
      ...);
}

// Token tiles of TMax tokens, and one tile of the remaining R < TMax tokens,
// with group widths GPrefill then 1. A single token (decode, which is bound
// by memory) uses the decode widths GDecode... instead: wider tiles read more
// weight streams at once.
template <template <int, int> class K, int GPrefill, int TMax, int... GDecode>
void run_tiles(const MatmulArgs& a) {
  int64_t t = 0;
  for (; t + TMax <= a.n_tokens; t += TMax) over_groups<K, TMax, GPrefill, 1>(a, t);
  const int64_t rest = a.n_tokens - t;
  auto tail = [&](auto tag) {
    constexpr int R = decltype(tag)::value;
    if constexpr (R == 1) over_groups<K, 1, GDecode...>(a, t);
    else over_groups<K, R, GPrefill, 1>(a, t);
  };
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rest == I + 1 ? (tail(std::integral_constant<int, I + 1>{}), 0) : 0), ...);
  }(std::make_integer_sequence<int, TMax - 1>{});
}

}  // namespace reprise::kernels
