// The selective scans: the AVX2 kernels (8 channels a vector), the plain
// references, and the dispatch (ssm_scan.h states the operations).
#include "tensor/ssm_scan.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "tensor/kernels_impl.h"
#include "tensor/ssm_scan_lanes.h"

namespace reprise::kernels {
namespace {

namespace e = scan_exp;

// scan_lanes' primitives over 8 lanes.
struct Avx2 {
  using Vec = __m256;
  using Mask = __m256;
  static Vec set1(float v) { return _mm256_set1_ps(v); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
  static Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Mask less(Vec a, Vec b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static Mask greater(Vec a, Vec b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static Vec select(Mask m, Vec if_set, Vec if_clear) { return _mm256_blendv_ps(if_clear, if_set, m); }
  static Vec zero_where(Mask m, Vec v) { return _mm256_andnot_ps(m, v); }
  static Vec add_where(Mask m, Vec a, Vec b) { return _mm256_add_ps(a, _mm256_and_ps(m, b)); }
  static Vec sub_where(Mask m, Vec a, Vec b) { return _mm256_sub_ps(a, _mm256_and_ps(m, b)); }
  static Vec round_nearest(Vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p * 2^n in two steps, the first exact, so that n = 128 (x near the top
  // of exp's range) works.
  static Vec scale_pow2(Vec p, Vec n) {
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(ni, 1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  }
  // v = mantissa * 2^exponent, mantissa in [0.5, 1) (v positive, normal).
  static Vec exponent(Vec v) {
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 23), _mm256_set1_epi32(126)));
  }
  static Vec mantissa(Vec v) {
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x807FFFFF)),
                                               _mm256_set1_epi32(0x3F000000)));
  }
};

inline __m256 exp8(__m256 x) { return scan_lanes::exp<Avx2>(x); }
inline __m256 softplus8(__m256 x) { return scan_lanes::softplus<Avx2>(x); }

// The lanes of up to 8 channels: whole-vector loads and stores where all 8
// are the block's (vmaskmovps stores are slow on AMD's cores), masked ones
// for a shorter tail, which must not touch the next state element.
struct Lanes {
  __m256i m;
  bool full;
};

Lanes lanes_of(int64_t n) {
  alignas(32) static const int32_t kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t k = n < 8 ? n : 8;
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - k)), k == 8};
}

inline __m256 load_lanes(const float* p, const Lanes& l) {
  return l.full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, l.m);
}

inline void store_lanes(float* p, const Lanes& l, __m256 v) {
  if (l.full) _mm256_storeu_ps(p, v);
  else _mm256_maskstore_ps(p, l.m, v);
}

// The same, one value at a time.
float exp_reference(float x) {
  const bool underflow = x < e::kExpLo;
  x = std::fmin(std::fmax(x, e::kExpLo), e::kExpHi);
  const float n = std::nearbyint(x * e::kLog2e);
  float r = std::fma(-n, e::kLn2Hi, x);
  r = std::fma(-n, e::kLn2Lo, r);
  float p = e::kP0;
  p = std::fma(p, r, e::kP1);
  p = std::fma(p, r, e::kP2);
  p = std::fma(p, r, e::kP3);
  p = std::fma(p, r, e::kP4);
  p = std::fma(p, r, e::kP5);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t ni = static_cast<int32_t>(n), half = ni >> 1;
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(half + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(ni - half + 127) << 23);
  return underflow ? 0.0f : (p * s1) * s2;
}

float log_reference(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  float ex = static_cast<float>(static_cast<int32_t>(bits >> 23) - 126);
  float m = std::bit_cast<float>((bits & 0x807FFFFFu) | 0x3F000000u);
  if (m < e::kSqrtHalf) {
    ex = ex - 1.0f;
    m = (m + m) - 1.0f;
  } else {
    m = (m + 0.0f) - 1.0f;
  }
  const float z = m * m;
  float p = e::kL0;
  for (const float l : {e::kL1, e::kL2, e::kL3, e::kL4, e::kL5, e::kL6, e::kL7, e::kL8}) p = std::fma(p, m, l);
  float y = (p * m) * z;
  y = std::fma(ex, e::kLn2Lo, y);
  y = std::fma(-0.5f, z, y);
  return std::fma(ex, e::kLn2Hi, m + y);
}

float softplus_reference(float x) {
  return x > e::kSoftplusLinear ? x : log_reference(1.0f + exp_reference(x));
}

}  // namespace

void mamba1_scan_avx2(const Mamba1Scan& s) {
  const int64_t ds = s.d_state, nc = s.channels;
  // Softplus for kChunk tokens ahead of their scan: its exp-log chain is
  // long, and independent from token to token where the scan is not.
  constexpr int64_t kChunk = 16;
  alignas(32) float sp[kChunk][8];
  // Each 8-channel half of the block through all the tokens.
  for (int64_t c0 = 0; c0 < nc; c0 += 8) {
    const Lanes m = lanes_of(nc - c0);
    for (int64_t t0 = 0; t0 < s.n_tokens; t0 += kChunk) {
      const int64_t t1 = std::min(t0 + kChunk, s.n_tokens);
      for (int64_t t = t0; t < t1; ++t)
        _mm256_store_ps(sp[t - t0], softplus8(load_lanes(s.dt + t * s.row_stride + c0, m)));
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t row = t * s.row_stride + c0;
        const __m256 dt = _mm256_load_ps(sp[t - t0]);
        const __m256 x_dt = _mm256_mul_ps(load_lanes(s.x + row, m), dt);
        const float* b = s.bc + t * s.bc_stride;
        const float* c = b + ds;
        __m256 y = _mm256_setzero_ps();
        for (int64_t k = 0; k < ds; ++k) {
          const __m256 dA = exp8(_mm256_mul_ps(dt, load_lanes(s.A + k * nc + c0, m)));
          float* st = s.state + k * nc + c0;
          const __m256 v = _mm256_fmadd_ps(load_lanes(st, m), dA, _mm256_mul_ps(_mm256_set1_ps(b[k]), x_dt));
          store_lanes(st, m, v);
          y = _mm256_fmadd_ps(v, _mm256_set1_ps(c[k]), y);
        }
        store_lanes(s.y + row, m, y);
      }
    }
  }
}

void mamba1_scan_reference(const Mamba1Scan& s) {
  const int64_t ds = s.d_state, nc = s.channels;
  for (int64_t c = 0; c < nc; ++c) {
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      const int64_t row = t * s.row_stride + c;
      const float dt = softplus_reference(s.dt[row]), x_dt = s.x[row] * dt;
      const float* b = s.bc + t * s.bc_stride;
      const float* cv = b + ds;
      float y = 0.0f;
      for (int64_t k = 0; k < ds; ++k) {
        float& st = s.state[k * nc + c];
        st = std::fma(st, exp_reference(dt * s.A[k * nc + c]), b[k] * x_dt);
        y = std::fma(st, cv[k], y);
      }
      s.y[row] = y;
    }
  }
}

namespace {

// Up to 8 rows of a Mamba-2 block (half of it): the first row, lane mask,
// the block's row count (its state's stride) and the rows' state.
struct Half2 {
  int64_t r0, nc;
  Lanes m;
  float* state;
};

// Tokens t0 .. t0 + T - 1 of one half (see the AVX-512 kernel's
// mamba2_tokens).
template <int T>
inline void mamba2_tokens(const Mamba2Scan& s, const Half2& h, int64_t t0) {
  __m256 x_dt[T], dA[T], y[T];
  const float *b[T], *c[T];
  #pragma GCC unroll 4
  for (int j = 0; j < T; ++j) {
    const int64_t t = t0 + j;
    x_dt[j] = _mm256_mul_ps(load_lanes(s.x + t * s.x_stride + h.r0, h.m), _mm256_set1_ps(s.sp[t]));
    dA[j] = _mm256_set1_ps(s.dA[t]);
    b[j] = s.b + t * s.bc_stride;
    c[j] = s.c + t * s.bc_stride;
    y[j] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < s.d_state; ++k) {
    float* st = h.state + k * h.nc;
    __m256 v = load_lanes(st, h.m);
    #pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      v = _mm256_fmadd_ps(v, dA[j], _mm256_mul_ps(_mm256_set1_ps(b[j][k]), x_dt[j]));
      y[j] = _mm256_fmadd_ps(v, _mm256_set1_ps(c[j][k]), y[j]);
    }
    store_lanes(st, h.m, v);
  }
  #pragma GCC unroll 4
  for (int j = 0; j < T; ++j) store_lanes(s.y + (t0 + j) * s.y_stride + h.r0, h.m, y[j]);
}

// Token t of NH halves, whose sums are independent chains.
template <int NH>
inline void mamba2_halves(const Mamba2Scan& s, const Half2* halves, int64_t t) {
  const __m256 dA = _mm256_set1_ps(s.dA[t]), sp = _mm256_set1_ps(s.sp[t]);
  const float* b = s.b + t * s.bc_stride;
  const float* c = s.c + t * s.bc_stride;
  __m256 x_dt[NH], y[NH];
  #pragma GCC unroll 4
  for (int j = 0; j < NH; ++j) {
    x_dt[j] = _mm256_mul_ps(load_lanes(s.x + t * s.x_stride + halves[j].r0, halves[j].m), sp);
    y[j] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < s.d_state; ++k) {
    const __m256 bk = _mm256_set1_ps(b[k]), ck = _mm256_set1_ps(c[k]);
    #pragma GCC unroll 4
    for (int j = 0; j < NH; ++j) {
      float* st = halves[j].state + k * halves[j].nc;
      const __m256 v = _mm256_fmadd_ps(load_lanes(st, halves[j].m), dA, _mm256_mul_ps(bk, x_dt[j]));
      store_lanes(st, halves[j].m, v);
      y[j] = _mm256_fmadd_ps(v, ck, y[j]);
    }
  }
  #pragma GCC unroll 4
  for (int j = 0; j < NH; ++j) store_lanes(s.y + t * s.y_stride + halves[j].r0, halves[j].m, y[j]);
}

}  // namespace

void mamba2_scan_avx2(const Mamba2Scan& s) {
  const int64_t tokens4 = s.n_tokens / 4 * 4;
  // Groups of up to 4 halves: 4 tokens at a time in each, then the tokens
  // left over (all of them in decode) with the halves interleaved.
  int64_t r = 0;
  while (r < s.channels) {
    Half2 halves[4];
    int nh = 0;
    for (; r < s.channels && nh < 4; r += 8) {
      const int64_t block0 = r / kScanBlock * kScanBlock;
      const int64_t nc = std::min(kScanBlock, s.channels - block0);
      halves[nh++] = {r, nc, lanes_of(s.channels - r), s.state + block0 * s.d_state + (r - block0)};
    }
    for (int j = 0; j < nh; ++j)
      for (int64_t t = 0; t < tokens4; t += 4) mamba2_tokens<4>(s, halves[j], t);
    for (int64_t t = tokens4; t < s.n_tokens; ++t) {
      switch (nh) {
        case 4: mamba2_halves<4>(s, halves, t); break;
        case 3: mamba2_halves<3>(s, halves, t); break;
        case 2: mamba2_halves<2>(s, halves, t); break;
        default: mamba2_halves<1>(s, halves, t); break;
      }
    }
  }
}

void mamba2_scan_reference(const Mamba2Scan& s) {
  const int64_t ds = s.d_state;
  for (int64_t c = 0; c < s.channels; ++c) {
    const int64_t r0 = c / kScanBlock * kScanBlock, nc = std::min(kScanBlock, s.channels - r0);
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      const float x_dt = s.x[t * s.x_stride + c] * s.sp[t];
      const float* b = s.b + t * s.bc_stride;
      const float* cv = s.c + t * s.bc_stride;
      float y = 0.0f;
      for (int64_t k = 0; k < ds; ++k) {
        float& st = s.state[r0 * ds + k * nc + (c - r0)];
        st = std::fma(st, s.dA[t], b[k] * x_dt);
        y = std::fma(st, cv[k], y);
      }
      s.y[t * s.y_stride + c] = y;
    }
  }
}

void mamba1_scan(const Mamba1Scan& s) { isa_kernels().mamba1_scan(s); }
void mamba2_scan(const Mamba2Scan& s) { isa_kernels().mamba2_scan(s); }

}  // namespace reprise::kernels
