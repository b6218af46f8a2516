// The scans' exp, log and softplus (ssm_scan.h states their operations)
// written once over an ISA's lanes. V supplies the vector type and the
// primitives; each ISA file instantiates these with a V of its own, under
// its own target options (the AVX-512 file includes this header after its
// target pragma), so every ISA computes the same operations lane by lane by
// construction. V's primitives may differ in how they compute a result,
// never in the result (AVX-512 scales by 2^n with one vscalefps where AVX2
// takes two multiplies, the first exact).
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

}  // namespace reprise::kernels::scan_lanes
