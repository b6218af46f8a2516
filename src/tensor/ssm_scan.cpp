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
  static constexpr int kWidth = 8;
  // The first n of the 8 lanes: whole-vector loads and stores where all 8
  // are valid (vmaskmovps stores are slow on AMD's cores), masked ones for
  // a shorter tail, which must not touch the next state element.
  struct Lanes {
    __m256i m;
    bool full;
  };
  static Lanes lanes(int64_t n) {
    alignas(32) static const int32_t kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t k = n < 8 ? n : 8;
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - k)), k == 8};
  }
  static Vec load(const float* p, const Lanes& l) { return l.full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, l.m); }
  static void store(float* p, const Lanes& l, Vec v) {
    if (l.full) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, l.m, v);
  }
  static Vec load_all(const float* p) { return _mm256_load_ps(p); }
  static void store_all(float* p, Vec v) { _mm256_store_ps(p, v); }
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

// One token at a time: AVX2's 16 registers hold no more with the exp's
// temporaries (2 and 4 measured within BM_Mamba1Scan's noise).
void mamba1_scan_avx2(const Mamba1Scan& s) { scan_lanes::mamba1<Avx2, 1>(s); }

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

void mamba2_scan_avx2(const Mamba2Scan& s) { scan_lanes::mamba2<Avx2>(s); }

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
