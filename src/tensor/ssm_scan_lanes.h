// The selective scans (ssm_scan.h states their operations: the
// recurrences, and the exp, log and softplus they use) written once over an
// ISA's lanes. V supplies the vector type, V::kWidth lanes and the
// primitives; each ISA file instantiates these with a V of its own, under
// its own target options (the AVX-512 file includes this header after its
// target pragma), so every ISA computes the same operations lane by lane by
// construction. V's primitives may differ in how they compute a result,
// never in the result (AVX-512 scales by 2^n with one vscalefps where AVX2
// takes two multiplies, the first exact; AVX2 loads and stores whole
// vectors where all lanes are valid, vmaskmovps being slow on AMD's cores).
//
// Intrinsics and V only: no standard-library inline function may be
// instantiated under the AVX-512 options.
#pragma once
#include "tensor/ssm_scan.h"

namespace reprise::kernels::scan_lanes {

template <class V>
__attribute__((always_inline)) inline typename V::Vec exp(typename V::Vec x) {
  namespace e = scan_exp;
  using Vec = typename V::Vec;
  const auto underflow = V::less(x, V::set1(e::kExpLo));
  x = V::min(V::max(x, V::set1(e::kExpLo)), V::set1(e::kExpHi));
  const Vec n = V::round_nearest(V::mul(x, V::set1(e::kLog2e)));
  Vec r = V::fnmadd(n, V::set1(e::kLn2Hi), x);
  r = V::fnmadd(n, V::set1(e::kLn2Lo), r);
  Vec p = V::set1(e::kP0);
  p = V::fmadd(p, r, V::set1(e::kP1));
  p = V::fmadd(p, r, V::set1(e::kP2));
  p = V::fmadd(p, r, V::set1(e::kP3));
  p = V::fmadd(p, r, V::set1(e::kP4));
  p = V::fmadd(p, r, V::set1(e::kP5));
  p = V::fmadd(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
  return V::zero_where(underflow, V::scale_pow2(p, n));
}

// Positive normal inputs.
template <class V>
__attribute__((always_inline)) inline typename V::Vec log(typename V::Vec v) {
  namespace e = scan_exp;
  using Vec = typename V::Vec;
  const Vec m0 = V::mantissa(v);  // in [0.5, 1)
  const auto small = V::less(m0, V::set1(e::kSqrtHalf));
  const Vec ex = V::sub_where(small, V::exponent(v), V::set1(1.0f));
  const Vec m = V::sub(V::add_where(small, m0, m0), V::set1(1.0f));
  const Vec z = V::mul(m, m);
  Vec p = V::set1(e::kL0);
  p = V::fmadd(p, m, V::set1(e::kL1));
  p = V::fmadd(p, m, V::set1(e::kL2));
  p = V::fmadd(p, m, V::set1(e::kL3));
  p = V::fmadd(p, m, V::set1(e::kL4));
  p = V::fmadd(p, m, V::set1(e::kL5));
  p = V::fmadd(p, m, V::set1(e::kL6));
  p = V::fmadd(p, m, V::set1(e::kL7));
  p = V::fmadd(p, m, V::set1(e::kL8));
  Vec y = V::mul(V::mul(p, m), z);
  y = V::fmadd(ex, V::set1(e::kLn2Lo), y);
  y = V::fnmadd(V::set1(0.5f), z, y);
  return V::fmadd(ex, V::set1(e::kLn2Hi), V::add(m, y));
}

template <class V>
__attribute__((always_inline)) inline typename V::Vec softplus(typename V::Vec x) {
  const typename V::Vec sp = log<V>(V::add(V::set1(1.0f), exp<V>(x)));
  return V::select(V::greater(x, V::set1(scan_exp::kSoftplusLinear)), x, sp);
}

// Up to V::kWidth channels of one scan block: the first of them (r0), the
// block's channel count (nc: its A's and state's stride), their lanes and
// their state (the block's state + r0 - the block's first channel).
template <class V>
struct LaneGroup {
  int64_t r0, nc;
  typename V::Lanes lanes;
  float* state;
};

// Mamba-1, tokens t0 .. t0 + T - 1 of group g (a: its A; sp: the tokens'
// softplus'd time steps): each state element and its A are loaded once for
// the T tokens, whose sums are independent chains. Each token's operations
// are the one-token ones.
template <class V, int T>
__attribute__((always_inline)) inline void mamba1_tokens(const Mamba1Scan& s, const LaneGroup<V>& g, const float* a,
                                                         int64_t t0, const float (*sp)[V::kWidth]) {
  using Vec = typename V::Vec;
  Vec dt[T], x_dt[T], y[T];
  const float *b[T], *c[T];
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) {
    const int64_t t = t0 + j;
    dt[j] = V::load_all(sp[j]);
    x_dt[j] = V::mul(V::load(s.x + t * s.row_stride + g.r0, g.lanes), dt[j]);
    b[j] = s.bc + t * s.bc_stride;
    c[j] = b[j] + s.d_state;
    y[j] = V::set1(0.0f);
  }
  for (int64_t k = 0; k < s.d_state; ++k) {
    const Vec ak = V::load(a + k * g.nc, g.lanes);
    float* st = g.state + k * g.nc;
    Vec v = V::load(st, g.lanes);
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      v = V::fmadd(v, exp<V>(V::mul(dt[j], ak)), V::mul(V::set1(b[j][k]), x_dt[j]));
      y[j] = V::fmadd(v, V::set1(c[j][k]), y[j]);
    }
    V::store(st, g.lanes, v);
  }
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) V::store(s.y + (t0 + j) * s.row_stride + g.r0, g.lanes, y[j]);
}

// Mamba-1's scan of one block, T tokens at a time (as many as V's
// registers hold with the exp's temporaries).
template <class V, int T>
inline void mamba1(const Mamba1Scan& s) {
  // Softplus for kChunk tokens ahead of their scan: its exp-log chain is
  // long, and independent from token to token where the scan is not.
  constexpr int64_t kChunk = 16;
  alignas(64) float sp[kChunk][V::kWidth];
  for (int64_t c0 = 0; c0 < s.channels; c0 += V::kWidth) {
    const LaneGroup<V> g{c0, s.channels, V::lanes(s.channels - c0), s.state + c0};
    for (int64_t t0 = 0; t0 < s.n_tokens; t0 += kChunk) {
      const int64_t t1 = t0 + kChunk < s.n_tokens ? t0 + kChunk : s.n_tokens;
      for (int64_t t = t0; t < t1; ++t)
        V::store_all(sp[t - t0], softplus<V>(V::load(s.dt + t * s.row_stride + c0, g.lanes)));
      int64_t t = t0;
      for (; t + T <= t1; t += T) mamba1_tokens<V, T>(s, g, s.A + c0, t, sp + (t - t0));
      for (; t < t1; ++t) mamba1_tokens<V, 1>(s, g, s.A + c0, t, sp + (t - t0));
    }
  }
}

// Mamba-2, tokens t0 .. t0 + T - 1 of group g: each state element is loaded
// once for the T tokens, whose sums are independent chains.
template <class V, int T>
__attribute__((always_inline)) inline void mamba2_tokens(const Mamba2Scan& s, const LaneGroup<V>& g, int64_t t0) {
  using Vec = typename V::Vec;
  Vec x_dt[T], dA[T], y[T];
  const float *b[T], *c[T];
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) {
    const int64_t t = t0 + j;
    x_dt[j] = V::mul(V::load(s.x + t * s.x_stride + g.r0, g.lanes), V::set1(s.sp[t]));
    dA[j] = V::set1(s.dA[t]);
    b[j] = s.b + t * s.bc_stride;
    c[j] = s.c + t * s.bc_stride;
    y[j] = V::set1(0.0f);
  }
  for (int64_t k = 0; k < s.d_state; ++k) {
    float* st = g.state + k * g.nc;
    Vec v = V::load(st, g.lanes);
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      v = V::fmadd(v, dA[j], V::mul(V::set1(b[j][k]), x_dt[j]));
      y[j] = V::fmadd(v, V::set1(c[j][k]), y[j]);
    }
    V::store(st, g.lanes, v);
  }
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) V::store(s.y + (t0 + j) * s.y_stride + g.r0, g.lanes, y[j]);
}

// Mamba-2, token t of NG groups, whose sums are independent chains.
template <class V, int NG>
__attribute__((always_inline)) inline void mamba2_groups(const Mamba2Scan& s, const LaneGroup<V>* groups, int64_t t) {
  using Vec = typename V::Vec;
  const Vec dA = V::set1(s.dA[t]), sp = V::set1(s.sp[t]);
  const float* b = s.b + t * s.bc_stride;
  const float* c = s.c + t * s.bc_stride;
  Vec x_dt[NG], y[NG];
#pragma GCC unroll 4
  for (int j = 0; j < NG; ++j) {
    x_dt[j] = V::mul(V::load(s.x + t * s.x_stride + groups[j].r0, groups[j].lanes), sp);
    y[j] = V::set1(0.0f);
  }
  for (int64_t k = 0; k < s.d_state; ++k) {
    const Vec bk = V::set1(b[k]), ck = V::set1(c[k]);
#pragma GCC unroll 4
    for (int j = 0; j < NG; ++j) {
      float* st = groups[j].state + k * groups[j].nc;
      const Vec v = V::fmadd(V::load(st, groups[j].lanes), dA, V::mul(bk, x_dt[j]));
      V::store(st, groups[j].lanes, v);
      y[j] = V::fmadd(v, ck, y[j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NG; ++j) V::store(s.y + t * s.y_stride + groups[j].r0, groups[j].lanes, y[j]);
}

// Mamba-2's scan of one head's rows. A row's sum is a chain of d_state
// fmas (128 in the usual shapes): groups of up to 4 lane groups take 4
// tokens at a time each, then the tokens left over (all of them in decode)
// with the groups interleaved.
template <class V>
inline void mamba2(const Mamba2Scan& s) {
  static_assert(kScanBlock % V::kWidth == 0, "a lane group never straddles two blocks");
  const int64_t tokens4 = s.n_tokens / 4 * 4;
  int64_t r = 0;
  while (r < s.channels) {
    LaneGroup<V> groups[4];
    int ng = 0;
    for (; r < s.channels && ng < 4; r += V::kWidth) {
      const int64_t block0 = r / kScanBlock * kScanBlock;
      const int64_t nc = s.channels - block0 < kScanBlock ? s.channels - block0 : kScanBlock;
      groups[ng++] = {r, nc, V::lanes(s.channels - r), s.state + block0 * s.d_state + (r - block0)};
    }
    for (int j = 0; j < ng; ++j)
      for (int64_t t = 0; t < tokens4; t += 4) mamba2_tokens<V, 4>(s, groups[j], t);
    for (int64_t t = tokens4; t < s.n_tokens; ++t) {
      switch (ng) {
        case 4: mamba2_groups<V, 4>(s, groups, t); break;
        case 3: mamba2_groups<V, 3>(s, groups, t); break;
        case 2: mamba2_groups<V, 2>(s, groups, t); break;
        default: mamba2_groups<V, 1>(s, groups, t); break;
      }
    }
  }
}

}  // namespace reprise::kernels::scan_lanes
