// Batched (prompt) attention with AVX2 (see AttnArgs in kernels_impl.h): the
// AVX2 instruction set's kernel, and the AVX-512 one's fallback for head
// sizes it does not take. The arithmetic per (query, key) is that of
// attend_interleaved in kernels.cpp, so results are identical:
//   - scores with ggml's f16 dot tree (kernels.cpp, Attention), computed
//     for 8 keys at a time with the keys across lanes;
//   - the online softmax's sequential new-maximum rule, evaluated 8 keys at a
//     time with a prefix maximum, and glibc's expf;
//   - the f16 value accumulator, updated key by key, with the accumulators of
//     several queries in registers so their rounding chains overlap.
#include <cstdint>
#include <type_traits>

#include "tensor/avx2_math.h"
#include "tensor/kernels_impl.h"

namespace reprise::kernels {
namespace {

using avx2::expf_exact8;
using avx2::round_h8;

constexpr int kMaxQ = 16;  // queries per run
constexpr int kQG = 4;     // queries whose value updates interleave
constexpr int kMaxD = 256;

// The per-key score (kernels.cpp, Attention) of one query against the 8
// keys whose K values are at k + 16 i (dimension i): chain j of 32 (ggml's 4 x 8-lane accumulators) over the
// 32-element steps, further 8-element steps into chains 0..7, the lane tree of
// hsum8 over the chains, then the leftover elements one by one. Below 32
// elements ggml sums in double. S > 0: d is 32 S (unrolled); S = 0: any d.
template <int S>
inline __m256 score8(const float* q, const float* k, int64_t d) {
  if (S == 0 && d < 32) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (int64_t i = 0; i < d; ++i) {
      const __m256d qd = _mm256_set1_pd(q[i]);
      lo = _mm256_fmadd_pd(qd, _mm256_cvtps_pd(_mm_loadu_ps(k + 16 * i)), lo);
      hi = _mm256_fmadd_pd(qd, _mm256_cvtps_pd(_mm_loadu_ps(k + 16 * i + 4)), hi);
    }
    return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
  }
  const int64_t n32 = S > 0 ? 32 * S : d & ~int64_t(31), n8 = S > 0 ? n32 : d & ~int64_t(7);
  auto fma_at = [&](int64_t i, __m256 c) {
    return _mm256_fmadd_ps(_mm256_set1_ps(q[i]), _mm256_loadu_ps(k + 16 * i), c);
  };
  auto chain = [&](int j) {
    __m256 c = _mm256_setzero_ps();
    if constexpr (S > 0) {
#pragma GCC unroll 8
      for (int s = 0; s < S; ++s) c = fma_at(32 * s + j, c);
    } else {
      for (int64_t i = j; i < n32; i += 32) c = fma_at(i, c);
      if (j < 8)
        for (int64_t i = n32 + j; i < n8; i += 8) c = fma_at(i, c);
    }
    return c;
  };
  __m256 u[8];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l)
    u[l] = _mm256_add_ps(_mm256_add_ps(chain(l), chain(8 + l)), _mm256_add_ps(chain(16 + l), chain(24 + l)));
  __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(u[0], u[4]), _mm256_add_ps(u[1], u[5])),
                             _mm256_add_ps(_mm256_add_ps(u[2], u[6]), _mm256_add_ps(u[3], u[7])));
  for (int64_t i = n8; i < d; ++i) sum = fma_at(i, sum);
  return sum;
}

// Lanes shifted up by K (lane i gets lane i - K), the lowest K lanes filled.
template <int K>
inline __m256 shift_up(__m256 v, __m256 fill) {
  const __m256i idx = _mm256_setr_epi32((0 - K) & 7, (1 - K) & 7, (2 - K) & 7, (3 - K) & 7, (4 - K) & 7,
                                        (5 - K) & 7, (6 - K) & 7, (7 - K) & 7);
  return _mm256_blend_ps(_mm256_permutevar8x32_ps(v, idx), fill, (1 << K) - 1);
}

// Per query and 16-key step: which keys count, which set a new running
// maximum, and the exponential each needs (exp(M - s) for a new maximum,
// exp(s - M) otherwise). The sequential rule "s > m: new maximum" is
// evaluated with an exclusive prefix maximum, which selects the same values.
struct KeyPlan {
  alignas(32) float e[16];
  uint32_t valid;
  uint32_t is_new;
};

// 8 keys at p0 (lanes < nk counted); m is the running maximum before them.
inline void plan8(const float* sc, int nk, int64_t p0, int64_t first, int64_t end, float& m, float* e,
                  uint32_t& valid_out, uint32_t& new_out) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int lo = static_cast<int>(first - p0 < -1 ? -1 : (first - p0 > 8 ? 8 : first - p0));
  const int hi = static_cast<int>(end - p0 > 8 ? 8 : (end - p0 < 0 ? 0 : end - p0));
  const int top = hi < nk ? hi : nk;
  const __m256i valid_i = _mm256_and_si256(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)),
                                           _mm256_cmpgt_epi32(_mm256_set1_epi32(top), lane));
  const __m256 valid = _mm256_castsi256_ps(valid_i);
  valid_out = static_cast<uint32_t>(_mm256_movemask_ps(valid));
  new_out = 0;
  if (!valid_out) {
    _mm256_store_ps(e, _mm256_setzero_ps());
    return;
  }
  const __m256 s = _mm256_loadu_ps(sc);
  __m256 incl = _mm256_blendv_ps(ninf, s, valid);
  incl = _mm256_max_ps(incl, shift_up<1>(incl, ninf));
  incl = _mm256_max_ps(incl, shift_up<2>(incl, ninf));
  incl = _mm256_max_ps(incl, shift_up<4>(incl, ninf));
  const __m256 excl = _mm256_max_ps(shift_up<1>(incl, ninf), _mm256_set1_ps(m));
  const __m256 is_new = _mm256_and_ps(_mm256_cmp_ps(s, excl, _CMP_GT_OQ), valid);
  new_out = static_cast<uint32_t>(_mm256_movemask_ps(is_new));
  const __m256 arg = _mm256_and_ps(valid, _mm256_blendv_ps(_mm256_sub_ps(s, excl), _mm256_sub_ps(excl, s), is_new));
  _mm256_store_ps(e, expf_exact8(arg));
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, incl);
  m = tmp[7] > m ? tmp[7] : m;
}

// Value updates of queries [r0, r0 + nr) (nr <= kQG) over the step's nk keys
// for elements [c0, c0 + 8 W): accumulators in registers across the keys.
// Keys every query takes without a new maximum run without checks.
template <int W>
inline void update_values(const AttnArgs& a, int64_t p0, int nk, int r0, int nr, int64_t c0, const KeyPlan* plan,
                          float (*acc)[kMaxD]) {
  const int64_t d = a.d;
  // The head's last 8 elements may be partial: mask the value loads (lanes
  // past d stay zero in the accumulators).
  const int rest = static_cast<int>(d - (c0 + 8 * (W - 1)));
  const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(rest), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  auto load_v = [&](const float* p, int w) {
    return w == W - 1 && rest < 8 ? _mm256_maskload_ps(p + 8 * w, tail) : _mm256_loadu_ps(p + 8 * w);
  };
  __m256 A[kQG][W];
#pragma GCC unroll 4
  for (int r = 0; r < kQG; ++r)
#pragma GCC unroll 3
    for (int w = 0; w < W; ++w) A[r][w] = r < nr ? _mm256_load_ps(acc[r0 + r] + c0 + 8 * w) : _mm256_setzero_ps();
  uint32_t common = nr == kQG ? (1u << nk) - 1 : 0;
#pragma GCC unroll 4
  for (int r = 0; r < kQG; ++r)
    if (r < nr) common &= plan[r0 + r].valid & ~plan[r0 + r].is_new;
  for (int j = 0; j < nk; ++j) {
    const float* vr = a.v + (p0 + j - a.base) * d + c0;
    __m256 V[W];
#pragma GCC unroll 3
    for (int w = 0; w < W; ++w) V[w] = load_v(vr, w);
    if (common >> j & 1) {
#pragma GCC unroll 4
      for (int r = 0; r < kQG; ++r) {
        const __m256 vs = _mm256_set1_ps(plan[r0 + r].e[j]);
#pragma GCC unroll 3
        for (int w = 0; w < W; ++w) A[r][w] = round_h8(_mm256_fmadd_ps(V[w], vs, A[r][w]));
      }
      continue;
    }
#pragma GCC unroll 4
    for (int r = 0; r < kQG; ++r) {
      if (r >= nr || !(plan[r0 + r].valid >> j & 1)) continue;
      __m256 vs = _mm256_set1_ps(1.0f);
      if (plan[r0 + r].is_new >> j & 1) {
        const __m256 ms = _mm256_set1_ps(plan[r0 + r].e[j]);
#pragma GCC unroll 3
        for (int w = 0; w < W; ++w) A[r][w] = round_h8(_mm256_mul_ps(A[r][w], ms));
      } else {
        vs = _mm256_set1_ps(plan[r0 + r].e[j]);
      }
#pragma GCC unroll 3
      for (int w = 0; w < W; ++w) A[r][w] = round_h8(_mm256_fmadd_ps(V[w], vs, A[r][w]));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kQG; ++r)
#pragma GCC unroll 3
    for (int w = 0; w < W; ++w)
      if (r < nr) _mm256_store_ps(acc[r0 + r] + c0 + 8 * w, A[r][w]);
}

template <int S>
void attention_runs(const AttnArgs& a) {
  const int64_t d = a.d;
  alignas(32) float acc[kMaxQ][kMaxD];
  alignas(32) float sc[kMaxQ][16];
  KeyPlan plan[kMaxQ];
  float m[kMaxQ], s[kMaxQ];
  for (int64_t i0 = 0; i0 < a.n_q; i0 += kMaxQ) {
    const int nq = static_cast<int>(a.n_q - i0 < kMaxQ ? a.n_q - i0 : kMaxQ);
    const int64_t* first = a.first + i0;
    const int64_t* end = a.end + i0;
    int64_t lo = first[0], hi = end[0];
    for (int r = 0; r < nq; ++r) {
      m[r] = -INFINITY;
      s[r] = 0.0f;
      for (int64_t c = 0; c < d; c += 8) _mm256_store_ps(acc[r] + c, _mm256_setzero_ps());
      lo = lo < first[r] ? lo : first[r];
      hi = hi > end[r] ? hi : end[r];
    }
    for (int64_t p0 = a.base + ((lo - a.base) & ~int64_t(15)); p0 < hi; p0 += 16) {
      const int nk = static_cast<int>(hi - p0 < 16 ? hi - p0 : 16);
      const float* kt = a.kt + ((p0 - a.base) / 16) * d * 16;
      // Keys of the step each query scores (0: its range misses the step).
      int kn[kMaxQ];
      for (int r = 0; r < nq; ++r) {
        kn[r] = end[r] <= p0 || first[r] >= p0 + nk ? 0 : static_cast<int>(end[r] - p0 < nk ? end[r] - p0 : nk);
        if (kn[r] == 0) continue;
        const float* q = a.q + (i0 + r) * a.q_stride;
        const __m256 scale = _mm256_set1_ps(a.scale);
        _mm256_store_ps(sc[r], _mm256_mul_ps(score8<S>(q, kt, d), scale));
        if (kn[r] > 8) _mm256_store_ps(sc[r] + 8, _mm256_mul_ps(score8<S>(q, kt + 8, d), scale));
      }
      for (int r = 0; r < nq; ++r) {
        KeyPlan& kp = plan[r];
        kp.valid = kp.is_new = 0;
        if (kn[r] == 0) continue;
        uint32_t v0, n0, v1 = 0, n1 = 0;
        plan8(sc[r], kn[r], p0, first[r], end[r], m[r], kp.e, v0, n0);
        if (kn[r] > 8) {
          plan8(sc[r] + 8, kn[r] - 8, p0 + 8, first[r], end[r], m[r], kp.e + 8, v1, n1);
        } else {
          _mm256_store_ps(kp.e + 8, _mm256_setzero_ps());
        }
        kp.valid = v0 | (v1 << 8);
        kp.is_new = n0 | (n1 << 8);
        // The running sum, key by key: S = fma(S, ms, vs).
        for (int j = 0; j < kn[r]; ++j) {
          if (!(kp.valid >> j & 1)) continue;
          const bool nw = kp.is_new >> j & 1;
          s[r] = __builtin_fmaf(s[r], nw ? kp.e[j] : 1.0f, nw ? 1.0f : kp.e[j]);
        }
      }
      for (int r0 = 0; r0 < nq; r0 += kQG) {
        const int nr = nq - r0 < kQG ? nq - r0 : kQG;
        int64_t c0 = 0;
        for (; d - c0 > 16; c0 += 24) update_values<3>(a, p0, nk, r0, nr, c0, plan, acc);
        if (d - c0 > 8) update_values<2>(a, p0, nk, r0, nr, c0, plan, acc), c0 += 16;
        if (c0 < d) update_values<1>(a, p0, nk, r0, nr, c0, plan, acc);
      }
    }
    for (int r = 0; r < nq; ++r) {
      const float inv = s[r] == 0.0f ? 0.0f : 1.0f / s[r];
      float* o = a.out + (i0 + r) * a.out_stride;
      for (int64_t i = 0; i < d; ++i) o[i] = acc[r][i] * inv;
    }
  }
}

}  // namespace

bool attention_avx2_supports(int64_t head_dim) { return head_dim >= 1 && head_dim <= kMaxD; }

void score16_avx2(const float* q, const float* kt, int64_t d, float* out) {
  auto both = [&](auto s) {
    constexpr int S = decltype(s)::value;
    _mm256_storeu_ps(out, score8<S>(q, kt, d));
    _mm256_storeu_ps(out + 8, score8<S>(q, kt + 8, d));
  };
  switch (d) {
    case 32: return both(std::integral_constant<int, 1>{});
    case 64: return both(std::integral_constant<int, 2>{});
    case 96: return both(std::integral_constant<int, 3>{});
    case 128: return both(std::integral_constant<int, 4>{});
    case 256: return both(std::integral_constant<int, 8>{});
    default: return both(std::integral_constant<int, 0>{});
  }
}

void attention_avx2(const AttnArgs& a) {
  switch (a.d) {
    case 32: attention_runs<1>(a); return;
    case 64: attention_runs<2>(a); return;
    case 96: attention_runs<3>(a); return;
    case 128: attention_runs<4>(a); return;
    case 256: attention_runs<8>(a); return;
    default: attention_runs<0>(a); return;
  }
}

}  // namespace reprise::kernels
