// The selective scans of the recurrent models (ggml_ssm_scan). Mamba-1's,
// with a per-element A, takes one exp per state element per token (a third
// of a small jamba's prompt time) and the time step's softplus (libm's
// logf and expf made another quarter); Mamba-2's, with one A per head, is
// at the end. Vectors run across channels (16 on AVX-512, 8 on AVX2), so no
// lane ever needs another's value. Mamba-1, per token t and channel c:
//
//   sp = dt[t][c] > 20 ? dt[t][c] : log(1 + exp(dt[t][c]))   (ggml's softplus)
//
// then per state element k in order k = 0, 1, ...:
//
//   dA = exp(sp * A[c][k])
//   s  = fma(s[c][k], dA, B[t][k] * (x[t][c] * sp))
//   y  = fma(s, C[t][k], y)                       (y starts at +0)
//
// That is ggml's per-row order (its sum over k runs in order too); only exp
// and log differ from its libm expf and logf (a few ulp). Every ISA's kernel
// computes these operations lane by lane, so all give the same bits, and a
// token's results depend only on its own inputs and the state before it:
// prompts, decode and any split of a run agree exactly.
//
// exp: Cephes' range reduction and degree-5 polynomial (within ~2 ulp of
// expf); inputs below the float range give 0, above it +inf:
//   x = clamp(x, kExpLo, kExpHi); n = round-to-nearest(x * log2(e));
//   r = fma(-n, kLn2Hi, x); r = fma(-n, kLn2Lo, r);
//   p = ((((kP0 r + kP1) r + kP2) r + kP3) r + kP4) r + kP5   (fmas)
//   p = fma(p, r * r, r + 1); y = (p * 2^(n >> 1)) * 2^(n - (n >> 1)).
// log, of a positive normal v (here 1 + exp(.) >= 1): Cephes' logf,
//   e = v's exponent + 1 (a float), m = v's mantissa in [0.5, 1);
//   if m < kSqrtHalf: e = e - 1, m = (m + m) - 1; else m = (m + 0) - 1;
//   z = m * m; p = kL0; p = fma(p, m, kLi) for i = 1..8;
//   y = (p * m) * z; y = fma(e, kLn2Lo, y); y = fma(-0.5, z, y);
//   log = fma(e, kLn2Hi, m + y).
#pragma once
#include <cstdint>

namespace reprise::kernels {

namespace scan_exp {
constexpr float kExpHi = 88.3762626647949f;
constexpr float kExpLo = -87.3365447504f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500E-4f;
constexpr float kP1 = 1.3981999507E-3f;
constexpr float kP2 = 8.3334519073E-3f;
constexpr float kP3 = 4.1665795894E-2f;
constexpr float kP4 = 1.6666665459E-1f;
constexpr float kP5 = 5.0000001201E-1f;
constexpr float kSqrtHalf = 0.707106781186547524f;
constexpr float kL0 = 7.0376836292E-2f;
constexpr float kL1 = -1.1514610310E-1f;
constexpr float kL2 = 1.1676998740E-1f;
constexpr float kL3 = -1.2420140846E-1f;
constexpr float kL4 = 1.4249322787E-1f;
constexpr float kL5 = -1.6668057665E-1f;
constexpr float kL6 = 2.0000714765E-1f;
constexpr float kL7 = -2.4999993993E-1f;
constexpr float kL8 = 3.3333331174E-1f;
constexpr float kSoftplusLinear = 20.0f;  // softplus(x) = x above it
}  // namespace scan_exp

// Channels one call takes at most.
constexpr int64_t kScanBlock = 16;

// One sequence's n_tokens tokens through `channels` (1..kScanBlock)
// consecutive channels. Rows are token-major: channel c of token t at
// [t * row_stride + c] for dt, x and y.
struct Mamba1Scan {
  int64_t n_tokens = 0;
  int64_t channels = 0;
  int64_t d_state = 0;
  const float* dt = nullptr;  // the time step before its softplus
  const float* x = nullptr;   // the conv output
  float* y = nullptr;
  int64_t row_stride = 0;
  // Token t's B (d_state floats) at bc + t * bc_stride, its C right after.
  const float* bc = nullptr;
  int64_t bc_stride = 0;
  // By state element, so that a vector holds one element of the block's
  // channels: element k of channel c at [k * channels + c].
  const float* A = nullptr;
  float* state = nullptr;  // advanced over the tokens
};

// Runs the scan with the selected ISA's kernel.
void mamba1_scan(const Mamba1Scan& s);
// The same operations written plainly, one element at a time, for tests.
void mamba1_scan_reference(const Mamba1Scan& s);

// Mamba-2's scan (ggml_ssm_scan with one A per head): `channels` rows of
// one head, which share each token's time step sp (softplus'd) and decay
// dA = exp(sp * A). Per token t, row c and state element k in order:
//
//   s = fma(s[c][k], dA[t], B[t][k] * (x[t][c] * sp[t]))
//   y = fma(s, C[t][k], y)                          (y starts at +0)
//
// A row's sum is a chain of d_state fmas (128 in the usual shapes): the
// kernels keep several chains in flight, of 4 tokens in prompts and of a
// head's row blocks in decode, never by reordering a sum.
struct Mamba2Scan {
  int64_t n_tokens = 0;
  int64_t channels = 0;
  int64_t d_state = 0;
  const float* sp = nullptr;  // sp[t]
  const float* dA = nullptr;  // dA[t]
  const float* x = nullptr;   // x[t * x_stride + c]
  int64_t x_stride = 0;
  float* y = nullptr;         // y[t * y_stride + c]
  int64_t y_stride = 0;
  // Token t's B at b + t * bc_stride, its C at c + t * bc_stride.
  const float* b = nullptr;
  const float* c = nullptr;
  int64_t bc_stride = 0;
  // In blocks of kScanBlock rows (the last may be shorter): the block from
  // row r0 (nc rows) at r0 * d_state, element k of row r at + k * nc + r - r0.
  float* state = nullptr;
};
void mamba2_scan(const Mamba2Scan& s);
void mamba2_scan_reference(const Mamba2Scan& s);

// The ISAs' kernels (ssm_scan.cpp, ssm_scan_avx512.cpp).
void mamba1_scan_avx2(const Mamba1Scan& s);
void mamba1_scan_avx512(const Mamba1Scan& s);
void mamba2_scan_avx2(const Mamba2Scan& s);
void mamba2_scan_avx512(const Mamba2Scan& s);

}  // namespace reprise::kernels
