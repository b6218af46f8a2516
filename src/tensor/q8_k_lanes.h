// The Q8_K rule's scale element (kernels_impl.h, quantize_q8_k: the first
// element of a section's largest magnitude, NaNs skipped) and the scales it
// gives, written once over
// an ISA's lanes, as ssm_scan_lanes.h writes the scans: each ISA file
// instantiates it with a V of its own, under its own target options.
//
// The element is the section's largest value when that exceeds the
// smallest's magnitude, the smallest when that is the larger magnitude; only
// a tie (both signs hold the largest magnitude) needs the first of them,
// which a scalar search finds (ties are rare). One max and one min chain in
// 4 accumulators each, where a single 32-deep chain was the quantizer's
// bound.
//
// V supplies Vec, kWidth lanes and zero(), load(p), max(a, b), min(a, b),
// hmax(v), hmin(v). max and min must return their second operand when either
// is NaN (x86's maxps / minps): the running values, which start at 0, never
// take a NaN, so NaNs are skipped as the rule skips them, and the lanes'
// order in hmax / hmin is free.
//
// Intrinsics, builtins and V only: no standard-library inline function may be
// instantiated under the AVX-512 options.
#pragma once
#include "tensor/kernels_impl.h"

namespace reprise::kernels::q8_k_lanes {

template <class V>
__attribute__((always_inline)) inline float scale_element(const float* xs) {
  typename V::Vec up[4], down[4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) up[c] = down[c] = V::zero();
#pragma GCC unroll 32
  for (int i = 0; i < kQK_K / V::kWidth; ++i) {
    const typename V::Vec v = V::load(xs + V::kWidth * i);
    up[i % 4] = V::max(v, up[i % 4]);
    down[i % 4] = V::min(v, down[i % 4]);
  }
  const float largest = V::hmax(V::max(V::max(up[0], up[1]), V::max(up[2], up[3])));
  const float smallest = V::hmin(V::min(V::min(down[0], down[1]), V::min(down[2], down[3])));
  if (largest != -smallest || !(largest > 0)) return largest > -smallest ? largest : smallest;
  for (int i = 0; i < kQK_K; ++i)
    if (__builtin_fabsf(xs[i]) == largest) return xs[i];
  return largest;  // not reached: some element holds the largest magnitude
}

// The section's scales by the rule: iscale = -127 / max multiplies the
// elements into quants, d = 1 / iscale is stored; both 0 for a section
// without a nonzero magnitude.
struct SectionScale {
  float iscale;
  float d;
};
template <class V>
__attribute__((always_inline)) inline SectionScale section_scale(const float* xs) {
  const float max = scale_element<V>(xs);
  const float iscale = max != 0 ? -127.0f / max : 0.0f;
  return {iscale, max != 0 ? 1.0f / iscale : 0.0f};
}

}  // namespace reprise::kernels::q8_k_lanes
