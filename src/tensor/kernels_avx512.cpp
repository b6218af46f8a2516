// AVX-512 (F, BW, VL, DQ, VNNI) kernels, chosen at run time (kernels.cpp).
// Everything below the target pragma is compiled for AVX-512 and must only run
// after the CPU check, so this file uses intrinsics and plain C only: no
// standard-library inline functions are instantiated with these options.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "tensor/kernels_impl.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2")

namespace reprise::kernels {
namespace {

#define RP_INLINE inline __attribute__((always_inline))

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

// G groups x T tokens; every output is one sequential FMA chain over k.
template <FType W, int G, int T>
void tile_f(const MatmulArgs& a, int64_t g0, int64_t t0) {
  constexpr size_t kStep = kGroupRows * kElemBytes<W>;
  const uint8_t* w = a.w + g0 * a.group_bytes;
  const float* x = static_cast<const float*>(a.x) + t0 * a.x_stride;
  const size_t gb = a.group_bytes;
  const int64_t xs = a.x_stride;
  __m512 acc[G][T];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
  const int64_t n = a.n_in;
  for (int64_t k = 0; k < n; ++k) {
    __m512 wv[G];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) wv[g] = load_row16<W>(w + g * gb + k * kStep);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(x[t * xs + k]);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) acc[g][t] = _mm512_fmadd_ps(wv[g], xb, acc[g][t]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
      store_rows(a.y + (t0 + t) * a.y_stride + (g0 + g) * kGroupRows, a.n_rows - (g0 + g) * kGroupRows,
                 acc[g][t]);
}

// Q8_0 (Q4 = false) or Q4_0 (Q4 = true) weights against Q8_0 activations.
template <bool Q4, int G, int T>
void tile_q(const MatmulArgs& a, int64_t g0, int64_t t0) {
  constexpr size_t kBlockBytes = Q4 ? 32 + 256 : 32 + 512;
  const uint8_t* w = a.w + g0 * a.group_bytes;
  const XBlock* x = static_cast<const XBlock*>(a.x) + t0 * a.x_stride;
  const size_t gb = a.group_bytes;
  const int64_t xs = a.x_stride;
  const int64_t nb = a.n_in / kQK8_0;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 acc[G][T];
#pragma GCC unroll 16
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w + b * kBlockBytes;
    __m512i ia[G][T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const XBlock& xb = x[t * xs + b];
      const __m512i c = _mm512_set1_epi32(Q4 ? xb.corr_q4 : xb.corr_q8);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g) ia[g][t] = c;
    }
    if constexpr (!Q4) {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        __m512i wv[G];
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_si512(wb + g * gb + 32 + c * 64);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          int32_t q;
          std::memcpy(&q, x[t * xs + b].qs + 4 * c, 4);
          const __m512i xv = _mm512_set1_epi32(q);
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], wv[g], xv);
        }
      }
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        __m512i wv[G];
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) wv[g] = _mm512_and_si512(_mm512_loadu_si512(wb + g * gb + 32 + c * 64), nibble);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          int32_t q;
          std::memcpy(&q, x[t * xs + b].qs + 4 * c, 4);
          const __m512i xv = _mm512_set1_epi32(q);
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], wv[g], xv);
        }
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g)
          wv[g] = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(wb + g * gb + 32 + c * 64), 4), nibble);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          int32_t q;
          std::memcpy(&q, x[t * xs + b].qs + 16 + 4 * c, 4);
          const __m512i xv = _mm512_set1_epi32(q);
#pragma GCC unroll 16
          for (int g = 0; g < G; ++g) ia[g][t] = _mm512_dpbusd_epi32(ia[g][t], wv[g], xv);
        }
      }
    }
    __m512 dw[G];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
      dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + g * gb)));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 dx = _mm512_set1_ps(x[t * xs + b].d);
#pragma GCC unroll 16
      for (int g = 0; g < G; ++g)
        acc[g][t] = _mm512_fmadd_ps(_mm512_mul_ps(dw[g], dx), _mm512_cvtepi32_ps(ia[g][t]), acc[g][t]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
      store_rows(a.y + (t0 + t) * a.y_stride + (g0 + g) * kGroupRows, a.n_rows - (g0 + g) * kGroupRows,
                 acc[g][t]);
}

// Runs one tile shape over all groups (G at a time, then singles).
template <typename Kernel>
RP_INLINE void over_groups(const MatmulArgs& a, int64_t t0, int G, Kernel wide, Kernel single) {
  int64_t g = 0;
  for (; g + G <= a.n_groups; g += G) wide(a, g, t0);
  for (; g < a.n_groups; ++g) single(a, g, t0);
}

using TileFn = void (*)(const MatmulArgs&, int64_t, int64_t);

// Token tiles of up to kMaxT; the remainder uses the matching narrower tile.
// One token uses wider group tiles: decode streams several groups at once.
template <int GWide, int TMax, template <int, int> class K>
void run_tiles(const MatmulArgs& a) {
  int64_t t = 0;
  for (; t + TMax <= a.n_tokens; t += TMax)
    over_groups<TileFn>(a, t, GWide, &K<GWide, TMax>::run, &K<1, TMax>::run);
  const int64_t rest = a.n_tokens - t;
  auto tail = [&](auto tag) {
    constexpr int R = decltype(tag)::value;
    if constexpr (R == 1)
      over_groups<TileFn>(a, t, 4, &K<4, 1>::run, &K<1, 1>::run);
    else
      over_groups<TileFn>(a, t, GWide, &K<GWide, R>::run, &K<1, R>::run);
  };
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rest == I + 1 ? (tail(std::integral_constant<int, I + 1>{}), 0) : 0), ...);
  }(std::make_integer_sequence<int, TMax - 1>{});
}

template <FType W>
struct FKernel {
  template <int G, int T>
  struct K {
    static void run(const MatmulArgs& a, int64_t g0, int64_t t0) { tile_f<W, G, T>(a, g0, t0); }
  };
};
template <bool Q4>
struct QKernel {
  template <int G, int T>
  struct K {
    static void run(const MatmulArgs& a, int64_t g0, int64_t t0) { tile_q<Q4, G, T>(a, g0, t0); }
  };
};

constexpr int kTileF = 12;  // 2 groups x 12 tokens = 24 accumulators
constexpr int kTileQ = 6;   // 2 groups x 6 tokens: 12 float + 12 integer accumulators

void matmul_f32(const MatmulArgs& a) { run_tiles<2, kTileF, FKernel<FType::F32>::K>(a); }
void matmul_f16(const MatmulArgs& a) { run_tiles<2, kTileF, FKernel<FType::F16>::K>(a); }
void matmul_bf16(const MatmulArgs& a) { run_tiles<2, kTileF, FKernel<FType::BF16>::K>(a); }
void matmul_q8_0(const MatmulArgs& a) { run_tiles<2, kTileQ, QKernel<false>::K>(a); }
void matmul_q4_0(const MatmulArgs& a) { run_tiles<2, kTileQ, QKernel<true>::K>(a); }

}  // namespace

const IsaKernels& avx512_kernels() {
  static const IsaKernels k{"avx512", &matmul_f32, &matmul_f16, &matmul_bf16, &matmul_q8_0, &matmul_q4_0, kTileF};
  return k;
}

}  // namespace reprise::kernels

#pragma GCC pop_options
