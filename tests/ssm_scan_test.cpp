// The selective scan kernels (tensor/ssm_scan.h): every ISA gives the
// plain reference's bits, runs split anywhere give the same bits, and the
// reference is what the maths says (softplus, exp, the state recurrence)
// within float rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/ssm_scan.h"

using namespace reprise;

namespace {

std::vector<KernelIsa> supported_isas() {
  std::vector<KernelIsa> v{KernelIsa::Avx2};
  if (kernel_isa_supported(KernelIsa::Avx512)) v.push_back(KernelIsa::Avx512);
  return v;
}

struct RestoreIsa {
  KernelIsa saved = kernel_isa();
  ~RestoreIsa() { set_kernel_isa(saved); }
};

// One block's inputs: token-major rows of `stride` floats (the block's
// channels first), B and C per token, A and the state by state element.
struct ScanCase {
  int64_t n, nc, ds, stride;
  std::vector<float> dt, x, bc, a, state;

  ScanCase(int64_t n_tokens, int64_t channels, int64_t d_state, uint32_t seed)
      : n(n_tokens), nc(channels), ds(d_state), stride(channels + 3) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    dt.resize(n * stride);
    x.resize(n * stride);
    bc.resize(n * 2 * ds);
    a.resize(nc * ds);
    state.resize(nc * ds);
    // Time steps across softplus's regimes: its linear part (> 20), the
    // edge, ordinary values, and ones whose exp underflows; 21.8 and 21.83
    // times A = -4 put exp(sp * A) among the subnormals.
    const float special[] = {25.0f, 20.0f, 19.5f, -30.0f, -100.0f, 0.0f, 1e-3f, 21.8f, 21.83f};
    for (size_t i = 0; i < dt.size(); ++i) dt[i] = i % 13 < 9 ? special[i % 13] : 3.0f * normal(rng);
    for (float& v : x) v = normal(rng);
    for (float& v : bc) v = normal(rng);
    // A = -exp(.), a few large enough that exp(sp * A) underflows.
    for (size_t i = 0; i < a.size(); ++i)
      a[i] = i % 13 == 0 ? -200.0f : i % 5 == 0 ? -4.0f : -std::exp(normal(rng));
    for (float& v : state) v = normal(rng);
  }

  // Tokens [t0, t1) through the scan, on `state`, into y.
  void run(int64_t t0, int64_t t1, std::vector<float>& st, std::vector<float>& y, bool reference) const {
    kernels::Mamba1Scan s;
    s.n_tokens = t1 - t0;
    s.channels = nc;
    s.d_state = ds;
    s.dt = dt.data() + t0 * stride;
    s.x = x.data() + t0 * stride;
    s.y = y.data() + t0 * stride;
    s.row_stride = stride;
    s.bc = bc.data() + t0 * 2 * ds;
    s.bc_stride = 2 * ds;
    s.A = a.data();
    s.state = st.data();
    if (reference) kernels::mamba1_scan_reference(s);
    else kernels::mamba1_scan(s);
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every ISA's kernel against the reference on case c (y_size output floats,
// filled beforehand so that a write outside the block shows): whole, and
// split into two calls at each of `cuts` (the state handed over).
template <class Case>
void expect_isas_give_the_reference_bits(const Case& c, size_t y_size, std::initializer_list<int64_t> cuts) {
  std::vector<float> want_state = c.state, want_y(y_size, -1.0f);
  c.run(0, c.n, want_state, want_y, true);
  for (KernelIsa isa : supported_isas()) {
    set_kernel_isa(isa);
    SCOPED_TRACE(kernel_isa_name(isa));
    std::vector<float> st = c.state, y(y_size, -1.0f);
    c.run(0, c.n, st, y, false);
    EXPECT_TRUE(same_bits(y, want_y)) << "outputs (and nothing outside the block written)";
    EXPECT_TRUE(same_bits(st, want_state)) << "state";
    for (int64_t cut : cuts) {
      if (cut <= 0 || cut >= c.n) continue;
      std::vector<float> st2 = c.state, y2(y_size, -1.0f);
      c.run(0, cut, st2, y2, false);
      c.run(cut, c.n, st2, y2, false);
      EXPECT_TRUE(same_bits(y2, want_y)) << "split at " << cut;
      EXPECT_TRUE(same_bits(st2, want_state)) << "split at " << cut;
    }
  }
}

const int64_t kShapes[][3] = {{1, 16, 16}, {17, 16, 16}, {40, 9, 16}, {33, 1, 5}, {20, 16, 1}, {18, 13, 33}};

TEST(Mamba1Scan, EveryIsaGivesTheReferenceBitsWholeOrSplit) {
  RestoreIsa restore;
  for (const auto& shape : kShapes) {
    const ScanCase c(shape[0], shape[1], shape[2], static_cast<uint32_t>(shape[0] * 100 + shape[1] + shape[2]));
    SCOPED_TRACE("tokens " + std::to_string(c.n) + " channels " + std::to_string(c.nc) + " d_state " +
                 std::to_string(c.ds));
    expect_isas_give_the_reference_bits(c, c.n * c.stride, {c.n / 2});
  }
  // Around the kernels' 16-token softplus chunks.
  const ScanCase c(37, 16, 16, 7);
  expect_isas_give_the_reference_bits(c, c.n * c.stride, {1, 15, 16, 17, 36});
}

// The reference against the recurrence in double precision, with libm's
// softplus and exp: the vector exp and log are within a few ulp, so the
// outputs agree to float rounding of the sums.
TEST(Mamba1Scan, ReferenceFollowsTheRecurrence) {
  const ScanCase c(24, 16, 16, 3);
  std::vector<float> st = c.state, y(c.n * c.stride);
  c.run(0, c.n, st, y, true);
  std::vector<double> s(c.state.begin(), c.state.end());
  double worst = 0;
  for (int64_t t = 0; t < c.n; ++t) {
    for (int64_t ch = 0; ch < c.nc; ++ch) {
      const double raw = c.dt[t * c.stride + ch];
      const double sp = raw > 20 ? raw : std::log(1 + std::exp(raw));
      double sum = 0, magnitude = 0;
      for (int64_t k = 0; k < c.ds; ++k) {
        double& v = s[k * c.nc + ch];
        v = v * std::exp(sp * c.a[k * c.nc + ch]) + c.bc[t * 2 * c.ds + k] * (c.x[t * c.stride + ch] * sp);
        sum += v * c.bc[t * 2 * c.ds + c.ds + k];
        magnitude += std::fabs(v * c.bc[t * 2 * c.ds + c.ds + k]);
      }
      const double err = std::fabs(y[t * c.stride + ch] - sum) / (magnitude + 1e-30);
      worst = std::max(worst, err);
    }
  }
  EXPECT_LT(worst, 1e-5) << "relative to the sum of |terms|";
  for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(st[i], s[i], 1e-4 * (1 + std::fabs(s[i]))) << "state " << i;
}

// Mamba-2: rows of one head (in blocks of 16) with per-token sp and dA, x
// and y with different row strides, B and C apart.
struct Scan2Case {
  int64_t n, nc, ds, x_stride, y_stride;
  std::vector<float> sp, dA, x, bc, state;

  Scan2Case(int64_t n_tokens, int64_t channels, int64_t d_state, uint32_t seed)
      : n(n_tokens), nc(channels), ds(d_state), x_stride(channels + 5), y_stride(channels + 1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    sp.resize(n);
    dA.resize(n);
    for (int64_t t = 0; t < n; ++t) {
      sp[t] = std::log1p(std::exp(2.0f * normal(rng)));
      dA[t] = std::exp(-sp[t] * std::exp(normal(rng)));
    }
    x.resize(n * x_stride);
    bc.resize(n * 3 * ds);
    state.resize(nc * ds);
    for (float& v : x) v = normal(rng);
    for (float& v : bc) v = normal(rng);
    for (float& v : state) v = normal(rng);
  }

  void run(int64_t t0, int64_t t1, std::vector<float>& st, std::vector<float>& y, bool reference) const {
    kernels::Mamba2Scan s;
    s.n_tokens = t1 - t0;
    s.channels = nc;
    s.d_state = ds;
    s.sp = sp.data() + t0;
    s.dA = dA.data() + t0;
    s.x = x.data() + t0 * x_stride;
    s.x_stride = x_stride;
    s.y = y.data() + t0 * y_stride;
    s.y_stride = y_stride;
    s.b = bc.data() + t0 * 3 * ds;
    s.c = bc.data() + t0 * 3 * ds + 2 * ds;  // a gap between B and C
    s.bc_stride = 3 * ds;
    s.state = st.data();
    if (reference) kernels::mamba2_scan_reference(s);
    else kernels::mamba2_scan(s);
  }
};

TEST(Mamba2Scan, EveryIsaGivesTheReferenceBitsWholeOrSplit) {
  RestoreIsa restore;
  for (const auto& shape : {std::array<int64_t, 3>{1, 16, 128}, {21, 16, 16}, {19, 11, 64}, {30, 1, 7}, {1, 64, 128},
                            {7, 40, 16}, {22, 72, 9}}) {
    const Scan2Case c(shape[0], shape[1], shape[2], static_cast<uint32_t>(shape[0] + 7 * shape[1] + shape[2]));
    SCOPED_TRACE("tokens " + std::to_string(c.n) + " rows " + std::to_string(c.nc) + " d_state " +
                 std::to_string(c.ds));
    expect_isas_give_the_reference_bits(c, c.n * c.y_stride, {c.n / 2, 4, 5});
  }
}

// The reference against the recurrence in double precision.
TEST(Mamba2Scan, ReferenceFollowsTheRecurrence) {
  const Scan2Case c(20, 16, 64, 5);
  std::vector<float> st = c.state, y(c.n * c.y_stride);
  c.run(0, c.n, st, y, true);
  std::vector<double> s(c.state.begin(), c.state.end());
  double worst = 0;
  for (int64_t t = 0; t < c.n; ++t) {
    for (int64_t ch = 0; ch < c.nc; ++ch) {
      double sum = 0, magnitude = 0;
      for (int64_t k = 0; k < c.ds; ++k) {
        double& v = s[k * c.nc + ch];
        v = v * c.dA[t] + c.bc[t * 3 * c.ds + k] * (double(c.x[t * c.x_stride + ch]) * c.sp[t]);
        const double term = v * c.bc[t * 3 * c.ds + 2 * c.ds + k];
        sum += term;
        magnitude += std::fabs(term);
      }
      worst = std::max(worst, std::fabs(y[t * c.y_stride + ch] - sum) / (magnitude + 1e-30));
    }
  }
  EXPECT_LT(worst, 1e-5) << "relative to the sum of |terms|";
  for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(st[i], s[i], 1e-4 * (1 + std::fabs(s[i]))) << "state " << i;
}

}  // namespace
