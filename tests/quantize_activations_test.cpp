// Activation quantizing (tensor/kernels_impl.h): every ISA's Q8_K and Q8_0
// quantizers write the bytes of the rules (ggml's quantize_row_q8_K and AVX2
// quantize_row_q8_0, written out element by element below), quants, scales,
// sums and corrections alike, including where the products could not tell
// them apart (which sign of a tied largest magnitude sets the scale) and
// for non-finite inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/kernels_impl.h"
#include "test_support.h"

using namespace reprise;
using namespace reprise::kernels;

namespace {

struct Table {
  std::string name;
  const IsaKernels* kernels;
};

std::vector<Table> tables() {
  std::vector<Table> v{{"avx2", &avx2_kernels()}};
  if (kernel_isa_supported(KernelIsa::Avx2Vnni)) v.push_back({"avx2vnni", &avx2_vnni_kernels()});
  if (kernel_isa_supported(KernelIsa::Avx512)) v.push_back({"avx512", &avx512_kernels()});
  return v;
}

// Sections of 256 floats whose quantizing takes every branch of the rule.
std::vector<float> edge_sections() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<std::vector<float>> s;
  auto random = [&] {
    std::vector<float> v(256);
    for (float& f : v) f = dist(rng);
    return v;
  };
  s.push_back(random());
  s.push_back(std::vector<float>(256, 0.0f));
  s.push_back(std::vector<float>(256, -0.0f));
  // Ties of the largest magnitude: the negative one first, then the positive.
  for (bool negative_first : {true, false}) {
    std::vector<float> v = random();
    v[40] = negative_first ? -9.0f : 9.0f;
    v[200] = negative_first ? 9.0f : -9.0f;
    s.push_back(v);
  }
  // The largest magnitude positive, or negative, held once or several times.
  for (float m : {11.0f, -11.0f}) {
    std::vector<float> v = random();
    v[3] = v[130] = v[255] = m;
    s.push_back(v);
  }
  // Halves after scaling (round half to even): max -127, elements k + 0.5.
  {
    std::vector<float> v(256);
    for (int i = 0; i < 256; ++i) v[i] = static_cast<float>(i % 127) + 0.5f - 63.0f;
    v[17] = -127.0f;
    s.push_back(v);
  }
  // NaNs are skipped for the scale and quantized as the rule's conversion does.
  {
    std::vector<float> v = random();
    v[0] = nan;
    v[77] = -nan;
    v[255] = nan;
    s.push_back(v);
  }
  std::vector<float> all_nan(256, nan);
  s.push_back(all_nan);
  // Infinities set the scale to zero.
  for (float a : {inf, -inf}) {
    std::vector<float> v = random();
    v[100] = a;
    s.push_back(v);
  }
  {
    std::vector<float> v = random();
    v[10] = -inf;
    v[20] = inf;
    s.push_back(v);
  }
  // Subnormals only.
  {
    std::vector<float> v(256);
    for (int i = 0; i < 256; ++i) v[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i - 128);
    s.push_back(v);
  }
  std::vector<float> out;
  for (const auto& v : s) out.insert(out.end(), v.begin(), v.end());
  return out;
}

// x86's conversion of a float to int32 (cvtps2dq): round half to even; NaN
// and values out of range give INT_MIN. Then the packs' saturation to int8.
int8_t convert_saturated(float v) {
  int32_t q = std::numeric_limits<int32_t>::min();
  if (!std::isnan(v) && v > -2147483904.0f && v < 2147483648.0f) q = static_cast<int32_t>(std::nearbyint(v));
  return static_cast<int8_t>(std::clamp(q, -128, 127));
}

// x86's maxps on one lane: the first operand when it is greater, else the
// second (so a NaN in either gives the second).
float maxps(float a, float b) { return a > b ? a : b; }

// Block b's stored quants, their halves' sums and the corrections.
void fill_quants(const float* x, float scale, XBlock& o, bool corrections) {
  int32_t sum_lo = 0, sum_hi = 0;
  for (int i = 0; i < 32; ++i) {
    o.qs[i] = convert_saturated(x[i] * scale);
    (i < 16 ? sum_lo : sum_hi) += o.qs[i];
  }
  o.sum_lo = static_cast<int16_t>(sum_lo);
  o.sum_hi = static_cast<int16_t>(sum_hi);
  o.corr_q8 = corrections ? -128 * (sum_lo + sum_hi) : 0;
  o.corr_q4 = corrections ? -8 * (sum_lo + sum_hi) : 0;
}

// The Q8_K rule (ggml's quantize_row_q8_K), element by element: the first
// element of largest magnitude (NaNs never compare larger) sets
// iscale = -127 / max, q = convert_saturated(x * iscale), d = 1 / iscale;
// a section without a nonzero magnitude has iscale = d = 0.
void reference_q8_k(const float* x, int64_t n_sections, XBlock* out, int64_t stride) {
  for (int64_t s = 0; s < n_sections; ++s) {
    const float* xs = x + s * 256;
    const float max = test::q8_k_max_element(xs);
    const float iscale = max != 0 ? -127.0f / max : 0.0f;
    for (int b = 0; b < 8; ++b) {
      XBlock& o = out[(s * 8 + b) * stride];
      fill_quants(xs + 32 * b, iscale, o, false);
      o.d = max != 0 ? 1.0f / iscale : 0.0f;
    }
  }
}

// The Q8_0 rule (ggml's AVX2 quantize_row_q8_0): the block's largest |x| by
// its max tree, lane by lane (maxps keeps or drops a NaN by its position),
// d = amax / 127 rounded through f16, q = convert_saturated(x * 127 / amax)
// (127 / amax taken as 0 only when amax compares equal to 0).
void reference_q8_0(const float* x, int64_t n_blocks, XBlock* out) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * 32;
    float lane[8];
    for (int j = 0; j < 8; ++j)
      lane[j] = maxps(maxps(std::fabs(xb[j]), std::fabs(xb[8 + j])), maxps(std::fabs(xb[16 + j]), std::fabs(xb[24 + j])));
    float half[4];
    for (int j = 0; j < 4; ++j) half[j] = maxps(lane[j], lane[4 + j]);
    const float amax = maxps(maxps(half[0], half[2]), maxps(half[1], half[3]));
    XBlock& o = out[b];
    fill_quants(xb, amax != 0 ? 127.0f / amax : 0.0f, o, true);
    o.d = f16_to_f32(f32_to_f16(amax / 127.0f));
  }
}

TEST(QuantizeActivations, EveryIsaWritesTheRulesQ8KBlocks) {
  static_assert(sizeof(XBlock) == 48, "XBlock has no padding bytes to compare");
  const std::vector<float> x = edge_sections();
  const int64_t n_sections = static_cast<int64_t>(x.size()) / 256;
  for (int64_t stride : {1, 6}) {
    // Blocks [b * stride] are written; the others keep the fill.
    std::vector<XBlock> want(n_sections * 8 * stride);
    std::memset(want.data(), 0xA5, want.size() * sizeof(XBlock));
    reference_q8_k(x.data(), n_sections, want.data(), stride);
    for (const Table& t : tables()) {
      std::vector<XBlock> got(want.size());
      std::memset(got.data(), 0xA5, got.size() * sizeof(XBlock));
      t.kernels->quantize_q8_k(x.data(), n_sections, got.data(), stride);
      for (int64_t s = 0; s < n_sections; ++s)
        EXPECT_EQ(std::memcmp(got.data() + s * 8 * stride, want.data() + s * 8 * stride, 8 * stride * sizeof(XBlock)),
                  0)
            << t.name << ", stride " << stride << ", section " << s;
    }
  }
}

TEST(QuantizeActivations, EveryIsaWritesTheRulesQ8_0Blocks) {
  const std::vector<float> x = edge_sections();
  const int64_t n_blocks = static_cast<int64_t>(x.size()) / 32;
  std::vector<XBlock> want(n_blocks);
  reference_q8_0(x.data(), n_blocks, want.data());
  // Runs that end inside a 16-block step (AVX-512 takes 16 at a time), and
  // blocks written a token tile apart, as prompts' activations are.
  for (int64_t n : {n_blocks, n_blocks - 1, int64_t{5}, int64_t{17}, int64_t{24}})
    for (int64_t stride : {1, 12}) {
      for (const Table& t : tables()) {
        std::vector<XBlock> got(n * stride);
        std::memset(got.data(), 0xA5, got.size() * sizeof(XBlock));
        t.kernels->quantize_q8(x.data(), n, got.data(), stride);
        for (int64_t b = 0; b < n; ++b)
          EXPECT_EQ(std::memcmp(&got[b * stride], &want[b], sizeof(XBlock)), 0)
              << t.name << ", " << n << " blocks, stride " << stride << ", block " << b;
      }
    }
}

}  // namespace
