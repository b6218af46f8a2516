// Kernel tests: the determinism contract of kernels.h (matmul and attention
// results do not depend on batch size, tiling, thread count, packing or the
// instruction set), bit-exactness against a scalar statement of the canonical
// accumulation, and accuracy against double-precision references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <numeric>
#include <vector>

#include "tensor/attention_tiled.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/key_layout.h"
#include "tensor/prefetch_tuner.h"
#include "tensor/quantize.h"
#include "test_support.h"

using namespace reprise;

namespace {

const DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16,   DType::Q8_0, DType::Q4_0,
                        DType::Q4_1, DType::Q5_0, DType::Q5_1,   DType::IQ4_NL, DType::IQ4_XS,
                        DType::Q2_K, DType::Q3_K, DType::Q4_K,   DType::Q5_K, DType::Q6_K};

int64_t block_elems(DType t) { return dtype_info(static_cast<uint32_t>(t))->block_elems; }

struct Weights {
  DType type;
  int64_t n_in, n_out;
  std::vector<uint8_t> bytes;
  MatrixView view() const {
    MatrixView m;
    m.type = type;
    m.data = bytes.data();
    m.n_in = n_in;
    m.n_out = n_out;
    m.row_bytes = dtype_row_bytes(type, n_in);
    return m;
  }
};

Weights make_weights(DType t, int64_t n_in, int64_t n_out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Weights w{t, n_in, n_out, {}};
  const size_t rb = dtype_row_bytes(t, n_in);
  w.bytes.resize(rb * n_out);
  std::vector<float> row(n_in);
  for (int64_t r = 0; r < n_out; ++r) {
    for (auto& v : row) v = dist(rng) * (1.0f + (r % 7));
    quantize_row(t, row.data(), w.bytes.data() + r * rb, n_in);
  }
  return w;
}

std::vector<float> make_x(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = dist(rng) * (i % 13 == 0 ? 8.0f : 1.0f);
  return x;
}

// ---- The canonical accumulation, stated in scalar code.

float round_f16(float v) { return f16_to_f32(f32_to_f16(v)); }
float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

struct QuantX {
  std::vector<int8_t> q;
  std::vector<float> d;
};
// ggml's AVX2 quantize_row_q8_0: d = amax/127 (as f16), q = rne(x * 127/amax).
QuantX quantize_x(const float* x, int64_t n) {
  QuantX out;
  out.q.resize(n);
  out.d.resize(n / 32);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    out.d[b] = f16_to_f32(f32_to_f16(amax / 127.0f));
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; ++i) out.q[b * 32 + i] = static_cast<int8_t>(std::nearbyint(x[b * 32 + i] * id));
  }
  return out;
}

// ggml's quantize_row_q8_K, per 256 elements: max = the first element of
// largest magnitude, q = min(127, rne(x * (-127 / max))), d = 1 / (-127 / max).
QuantX quantize_x_k(const float* x, int64_t n) {
  QuantX out;
  out.q.assign(n, 0);
  out.d.assign(n / 256, 0.0f);
  for (int64_t s = 0; s < n / 256; ++s) {
    const float* xs = x + s * 256;
    const float max = test::q8_k_max_element(xs);
    if (max == 0) continue;
    const float iscale = -127.0f / max;
    for (int i = 0; i < 256; ++i)
      out.q[s * 256 + i] = static_cast<int8_t>(std::min(127.0f, std::nearbyint(iscale * xs[i])));
    out.d[s] = 1.0f / iscale;
  }
  return out;
}

float canonical(const Weights& w, int64_t r, const float* x) {
  const uint8_t* row = w.bytes.data() + r * dtype_row_bytes(w.type, w.n_in);
  float y = 0.0f;
  switch (w.type) {
    case DType::F32: {
      auto* p = reinterpret_cast<const float*>(row);
      for (int64_t k = 0; k < w.n_in; ++k) y = std::fma(p[k], x[k], y);
      return y;
    }
    case DType::F16: {
      auto* p = reinterpret_cast<const uint16_t*>(row);
      for (int64_t k = 0; k < w.n_in; ++k) y = std::fma(f16_to_f32(p[k]), round_f16(x[k]), y);
      return y;
    }
    case DType::BF16: {
      auto* p = reinterpret_cast<const uint16_t*>(row);
      for (int64_t k = 0; k < w.n_in; ++k) y = std::fma(bf16_to_f32(p[k]), round_bf16(x[k]), y);
      return y;
    }
    case DType::Q8_0:
    case DType::Q4_0: {
      QuantX qx = quantize_x(x, w.n_in);
      for (int64_t b = 0; b < w.n_in / 32; ++b) {
        int32_t isum = 0;
        float dw;
        if (w.type == DType::Q8_0) {
          auto& blk = reinterpret_cast<const BlockQ8_0*>(row)[b];
          dw = f16_to_f32(blk.d);
          for (int i = 0; i < 32; ++i) isum += blk.qs[i] * qx.q[b * 32 + i];
        } else {
          auto& blk = reinterpret_cast<const BlockQ4_0*>(row)[b];
          dw = f16_to_f32(blk.d);
          for (int i = 0; i < 16; ++i) {
            isum += ((blk.qs[i] & 0x0f) - 8) * qx.q[b * 32 + i];
            isum += ((blk.qs[i] >> 4) - 8) * qx.q[b * 32 + 16 + i];
          }
        }
        const float d = dw * qx.d[b];
        y = std::fma(d, static_cast<float>(isum), y);
      }
      return y;
    }
    case DType::IQ4_NL: {
      // ggml's vec_dot_iq4_nl_q8_0: the table values of the nibbles (low
      // nibbles elements 0..15) against Q8_0 activations, Q8_0's float step.
      // (The table itself is pinned by Quantize.KTypeLayoutsMatchGgml.)
      QuantX qx = quantize_x(x, w.n_in);
      for (int64_t b = 0; b < w.n_in / 32; ++b) {
        const uint8_t* blk = row + b * 18;
        uint16_t d16;
        std::memcpy(&d16, blk, 2);
        int32_t isum = 0;
        for (int i = 0; i < 16; ++i) {
          isum += kIq4nlValues[blk[2 + i] & 15] * qx.q[b * 32 + i];
          isum += kIq4nlValues[blk[2 + i] >> 4] * qx.q[b * 32 + 16 + i];
        }
        y = std::fma(f16_to_f32(d16) * qx.d[b], static_cast<float>(isum), y);
      }
      return y;
    }
    case DType::IQ4_XS: {
      // ggml's block_iq4_xs {d, scales_h, scales_l[4], qs[128]} against Q8_K:
      // sub-block j's nibbles are qs[16j..16j+15] (low nibbles its elements
      // 0..15), its scale (minus 32) has the low nibble j % 2 of scales_l[j / 2]
      // and the top bits 2j..2j+1 of scales_h. Per super-block: isum = sum_j
      // scale_j * dot_j, then one float update (ggml's x86 form).
      QuantX qx = quantize_x_k(x, w.n_in);
      for (int64_t s = 0; s < w.n_in / 256; ++s) {
        const uint8_t* blk = row + s * 136;
        uint16_t d16, scales_h;
        std::memcpy(&d16, blk, 2);
        std::memcpy(&scales_h, blk + 2, 2);
        const uint8_t *scales_l = blk + 4, *qs = blk + 8;
        const int8_t* xq = qx.q.data() + s * 256;
        int32_t isum = 0;
        for (int j = 0; j < 8; ++j) {
          const int sc = (((scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
          int32_t dot = 0;
          for (int l = 0; l < 16; ++l) {
            dot += kIq4nlValues[qs[16 * j + l] & 15] * xq[32 * j + l];
            dot += kIq4nlValues[qs[16 * j + l] >> 4] * xq[32 * j + 16 + l];
          }
          isum += sc * dot;
        }
        y = std::fma(f16_to_f32(d16) * qx.d[s], static_cast<float>(isum), y);
      }
      return y;
    }
    case DType::Q2_K: {
      // ggml's block_q2_K {scales[16], qs[64], d, dmin} against Q8_K:
      // element 128h + 32s + l has q = (qs[32h + l] >> 2s) & 3 and is in
      // sub-block k = 8h + 2s + l / 16, whose scale is the low nibble of
      // scales[k] and whose min the high nibble. Per super-block: isum =
      // sum_k scale_k * dot_k and msum = sum_k min_k * (sum of sub-block k's
      // activation quants), then two float updates (as Q4_K's).
      QuantX qx = quantize_x_k(x, w.n_in);
      for (int64_t s = 0; s < w.n_in / 256; ++s) {
        const uint8_t* blk = row + s * 84;
        const uint8_t *scales = blk, *qs = blk + 16;
        uint16_t d16, dmin16;
        std::memcpy(&d16, blk + 80, 2);
        std::memcpy(&dmin16, blk + 82, 2);
        const int8_t* xq = qx.q.data() + s * 256;
        int32_t isum = 0, msum = 0;
        int32_t dot[16] = {}, xsum[16] = {};
        for (int i = 0; i < 256; ++i) {
          const int h = i / 128, quarter = (i % 128) / 32, l = i % 32, k = 8 * h + 2 * quarter + l / 16;
          dot[k] += ((qs[32 * h + l] >> (2 * quarter)) & 3) * xq[i];
          xsum[k] += xq[i];
        }
        for (int k = 0; k < 16; ++k) {
          isum += (scales[k] & 15) * dot[k];
          msum += (scales[k] >> 4) * xsum[k];
        }
        y = std::fma(f16_to_f32(d16) * qx.d[s], static_cast<float>(isum), y);
        y = std::fma(f16_to_f32(dmin16) * qx.d[s], static_cast<float>(-msum), y);
      }
      return y;
    }
    case DType::Q3_K: {
      // ggml's block_q3_K {hmask[32], qs[64], scales[12], d} against Q8_K:
      // element 128h + 32s + l has q = ((qs[32h + l] >> 2s) & 3) - 4, the -4
      // dropped when bit 4h + s of hmask[l] is set; sub-block k's 6-bit scale
      // (minus 32) has its low nibble in scales[k % 8] (high nibble for k >= 8)
      // and its top bits at bit 2(k / 4) of scales[8 + k % 4]. Per
      // super-block: isum = sum_k scale_k * dot_k, then one float update.
      QuantX qx = quantize_x_k(x, w.n_in);
      for (int64_t s = 0; s < w.n_in / 256; ++s) {
        const uint8_t* blk = row + s * 110;
        const uint8_t *hmask = blk, *qs = blk + 32, *scales = blk + 96;
        uint16_t d16;
        std::memcpy(&d16, blk + 108, 2);
        const int8_t* xq = qx.q.data() + s * 256;
        int32_t isum = 0;
        for (int k = 0; k < 16; ++k) {
          const int low = k < 8 ? scales[k] & 15 : scales[k - 8] >> 4;
          const int sc = (low | (((scales[8 + k % 4] >> (2 * (k / 4))) & 3) << 4)) - 32;
          int32_t dot = 0;
          for (int e = 0; e < 16; ++e) {
            const int i = 16 * k + e, h = i / 128, quarter = (i % 128) / 32, l = i % 32;
            const int q = ((qs[32 * h + l] >> (2 * quarter)) & 3) - (((hmask[l] >> (4 * h + quarter)) & 1) ? 0 : 4);
            dot += q * xq[i];
          }
          isum += sc * dot;
        }
        y = std::fma(f16_to_f32(d16) * qx.d[s], static_cast<float>(isum), y);
      }
      return y;
    }
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1: {
      // ggml's block_q4_1 {d, m, qs}, block_q5_0 {d, qh, qs}, block_q5_1
      // {d, m, qh, qs}: element i's quant is the low (i < 16) or high nibble
      // of qs[i % 16], plus 16 * bit i of qh.
      QuantX qx = quantize_x(x, w.n_in);
      const size_t bytes = dtype_row_bytes(w.type, 32);
      const bool has_min = w.type != DType::Q5_0, has_qh = w.type != DType::Q4_1;
      for (int64_t b = 0; b < w.n_in / 32; ++b) {
        const uint8_t* blk = row + b * bytes;
        uint16_t d16, m16 = 0;
        std::memcpy(&d16, blk, 2);
        if (has_min) std::memcpy(&m16, blk + 2, 2);
        const uint8_t* qs = blk + bytes - 16;
        uint32_t qh = 0;
        if (has_qh) std::memcpy(&qh, qs - 4, 4);
        int32_t isum = 0, xsum = 0;
        for (int i = 0; i < 32; ++i) {
          const int u = (i < 16 ? qs[i] & 15 : qs[i - 16] >> 4) | static_cast<int>(((qh >> i) & 1) << 4);
          isum += (u - (w.type == DType::Q5_0 ? 16 : 0)) * qx.q[b * 32 + i];
          xsum += qx.q[b * 32 + i];
        }
        y = std::fma(f16_to_f32(d16) * qx.d[b], static_cast<float>(isum), y);
        if (has_min) y = std::fma(f16_to_f32(m16) * qx.d[b], static_cast<float>(xsum), y);
      }
      return y;
    }
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: {
      // Per super-block, against Q8_K activations: the sub-blocks add up in
      // integers, then one (Q6_K) or two float updates.
      QuantX qx = quantize_x_k(x, w.n_in);
      for (int64_t s = 0; s < w.n_in / 256; ++s) {
        const float dx = qx.d[s];
        const int8_t* xq = qx.q.data() + s * 256;
        if (w.type == DType::Q6_K) {
          // ggml's block_q6_K: element i of the super-block is
          // d * scales[i / 16] * (u - 32), u from ql nibbles and qh bit pairs.
          auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[s];
          int32_t isum = 0;
          for (int half = 0; half < 16; ++half) {
            int32_t dot = 0;
            for (int l = 0; l < 16; ++l) {
              const int i = 16 * half + l, h = i / 128, quarter = (i % 128) / 32, e = i % 32;
              const uint8_t lo = blk.ql[64 * h + e + 32 * (quarter % 2)];
              const int u = (quarter < 2 ? lo & 15 : lo >> 4) | (((blk.qh[32 * h + e] >> (2 * quarter)) & 3) << 4);
              dot += (u - 32) * xq[i];
            }
            isum += blk.scales[half] * dot;
          }
          y = std::fma(f16_to_f32(blk.d) * dx, static_cast<float>(isum), y);
        } else {
          // ggml's block_q4_K / block_q5_K: sub-block j's quants are the low
          // (even j) or high (odd j) nibbles of qs[32 * (j / 2) + l], plus
          // 16 * bit j of qh[l] for Q5_K; scale and min from get_scale_min_k4.
          const uint8_t* blk = row + s * dtype_row_bytes(w.type, 256);
          uint16_t d16, dmin16;
          std::memcpy(&d16, blk, 2);
          std::memcpy(&dmin16, blk + 2, 2);
          const uint8_t* scales = blk + 4;
          const uint8_t* qh = w.type == DType::Q5_K ? blk + 16 : nullptr;
          const uint8_t* qs = blk + (w.type == DType::Q5_K ? 48 : 16);
          int32_t isum = 0, msum = 0;
          for (int j = 0; j < 8; ++j) {
            int sc, m;
            if (j < 4) {
              sc = scales[j] & 63;
              m = scales[j + 4] & 63;
            } else {
              sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
              m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
            }
            int32_t dot = 0, xsum = 0;
            for (int l = 0; l < 32; ++l) {
              const uint8_t byte = qs[32 * (j / 2) + l];
              int u = j % 2 ? byte >> 4 : byte & 15;
              if (qh) u += ((qh[l] >> j) & 1) * 16;
              dot += u * xq[32 * j + l];
              xsum += xq[32 * j + l];
            }
            isum += sc * dot;
            msum += m * xsum;
          }
          y = std::fma(f16_to_f32(d16) * dx, static_cast<float>(isum), y);
          y = std::fma(f16_to_f32(dmin16) * dx, static_cast<float>(-msum), y);
        }
      }
      return y;
    }
    default:
      return 0;
  }
}

// canonical() for every output of n_tokens tokens (x: n_tokens rows of n_in).
std::vector<float> canonical_outputs(const Weights& w, const std::vector<float>& x, int64_t n_tokens) {
  std::vector<float> want(n_tokens * w.n_out);
  for (int64_t tok = 0; tok < n_tokens; ++tok)
    for (int64_t r = 0; r < w.n_out; ++r) want[tok * w.n_out + r] = canonical(w, r, x.data() + tok * w.n_in);
  return want;
}

// interleave: PackedMatrix's super-group size (0: the current ISA's).
std::vector<float> run(const Weights& w, const std::vector<float>& x, int64_t n_tokens, int threads,
                       bool packed = true, int interleave = 0) {
  ThreadPool pool(threads);
  std::vector<float> y(n_tokens * w.n_out, -1.0f);
  if (packed) matmul(PackedMatrix(w.view(), interleave), x.data(), n_tokens, y.data(), pool);
  else matmul(w.view(), x.data(), n_tokens, y.data(), pool);
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<KernelIsa> isas() {
  std::vector<KernelIsa> v{KernelIsa::Avx2};
  if (kernel_isa_supported(KernelIsa::Avx2Vnni)) v.push_back(KernelIsa::Avx2Vnni);
  if (kernel_isa_supported(KernelIsa::Avx512)) v.push_back(KernelIsa::Avx512);
  return v;
}

// Every ISA, as one batch on 2 threads and token by token (decode), gives
// the bits of the canonical rule for these weights and activations.
void expect_every_isa_follows_the_rule(const Weights& w, const std::vector<float>& x, int64_t n_tokens,
                                       int interleave = 0) {
  const std::vector<float> want = canonical_outputs(w, x, n_tokens);
  for (KernelIsa isa : isas()) {
    set_kernel_isa(isa);
    SCOPED_TRACE(std::string(kernel_isa_name(isa)) + " " + dtype_name(static_cast<uint32_t>(w.type)));
    EXPECT_TRUE(same_bits(run(w, x, n_tokens, 2, true, interleave), want)) << "batch";
    std::vector<float> one(n_tokens * w.n_out);
    ThreadPool pool(1);
    PackedMatrix pm(w.view(), interleave);
    for (int64_t tok = 0; tok < n_tokens; ++tok)
      matmul(pm, x.data() + tok * w.n_in, 1, one.data() + tok * w.n_out, pool);
    EXPECT_TRUE(same_bits(one, want)) << "decode";
  }
}

struct IsaRestore {
  KernelIsa saved = kernel_isa();
  ~IsaRestore() { set_kernel_isa(saved); }
};

class MatmulTest : public ::testing::TestWithParam<DType> {};

// Shapes with partial row groups and token counts around the tile sizes.
TEST_P(MatmulTest, BitIdenticalAcrossBatchThreadsTilingAndIsa) {
  const DType t = GetParam();
  IsaRestore restore;
  // 1056 inputs: 33 Q8_0 activation blocks, more than the 16 quantized at once.
  // 512 and 768 inputs: two and three super-blocks of the K types.
  // 600 outputs: a small batch's task then has more groups than one kernel
  // call takes (run_job_task's chunks).
  for (auto [n_in, n_out] :
       {std::pair<int64_t, int64_t>{96, 77}, {256, 33}, {64, 200}, {72, 50}, {1056, 21}, {64, 600}, {512, 77},
        {768, 600}}) {
    if (n_in % block_elems(t) != 0) continue;
    SCOPED_TRACE("n_in " + std::to_string(n_in) + " n_out " + std::to_string(n_out));
    const Weights w = make_weights(t, n_in, n_out, 11 + static_cast<uint32_t>(n_out));
    const int64_t n_tokens = 53;
    const std::vector<float> x = make_x(n_tokens * n_in, 5);

    const std::vector<float> want = canonical_outputs(w, x, n_tokens);

    for (KernelIsa isa : isas()) {
      set_kernel_isa(isa);
      SCOPED_TRACE(kernel_isa_name(isa));
      EXPECT_TRUE(same_bits(run(w, x, n_tokens, 1), want)) << "batch, 1 thread";
      EXPECT_TRUE(same_bits(run(w, x, n_tokens, 2), want)) << "batch, 2 threads";
      EXPECT_TRUE(same_bits(run(w, x, n_tokens, 3), want)) << "batch, 3 threads";
      EXPECT_TRUE(same_bits(run(w, x, n_tokens, 2, false), want)) << "unpacked view";
      // Token by token (decode) and in uneven pieces, with the ISA's own
      // super-groups and with others (contiguous groups; 3, which no tile
      // width or task divides; 8 on AVX2, whose tiles are narrower).
      for (int interleave : {0, 1, 3, 8}) {
        SCOPED_TRACE("interleave " + std::to_string(interleave));
        if (interleave > 0) {
          EXPECT_TRUE(same_bits(run(w, x, n_tokens, 2, true, interleave), want)) << "batch";
        }
        for (int threads : {1, 2}) {
          std::vector<float> pieces(n_tokens * n_out);
          ThreadPool pool(threads);
          PackedMatrix pm(w.view(), interleave);
          int64_t tok = 0;
          for (int64_t len : {1, 1, 2, 3, 5, 7, 11, 13, 10}) {
            matmul(pm, x.data() + tok * n_in, len, pieces.data() + tok * n_out, pool);
            tok += len;
          }
          ASSERT_EQ(tok, n_tokens);
          EXPECT_TRUE(same_bits(pieces, want)) << "uneven batches, " << threads << " threads";
        }
      }
      // Groups dealt to regions (the F and K types' default on both ISAs),
      // with counts that leave the last regions short and that no tile width
      // matches: decode, uneven batches and one prompt-sized batch.
      for (int regions : {2, 3, 4, 8}) {
        SCOPED_TRACE("regions " + std::to_string(regions));
        ThreadPool pool(2);
        const PackedMatrix pm(w.view(), 0, regions);
        ASSERT_EQ(pm.regions(), regions);
        std::vector<float> pieces(n_tokens * n_out);
        int64_t tok = 0;
        for (int64_t len : {1, 1, 2, 3, 5, 7, 11, 23}) {
          matmul(pm, x.data() + tok * n_in, len, pieces.data() + tok * n_out, pool);
          tok += len;
        }
        ASSERT_EQ(tok, n_tokens);
        EXPECT_TRUE(same_bits(pieces, want)) << "regions";
      }
    }
  }
}

// On every ISA, the product of w's default packing with x taken in calls of
// the given lengths, one after another on 2 threads, gives the rule's bits.
void expect_calls_follow_the_rule(const Weights& w, const std::vector<float>& x, std::initializer_list<int64_t> calls) {
  int64_t n_tokens = 0;
  for (int64_t len : calls) n_tokens += len;
  const std::vector<float> want = canonical_outputs(w, x, n_tokens);
  for (KernelIsa isa : isas()) {
    set_kernel_isa(isa);
    SCOPED_TRACE(kernel_isa_name(isa));
    ThreadPool pool(2);
    const PackedMatrix pm(w.view());
    std::vector<float> y(n_tokens * w.n_out);
    int64_t tok = 0;
    for (int64_t len : calls) {
      matmul(pm, x.data() + tok * w.n_in, len, y.data() + tok * w.n_out, pool);
      tok += len;
    }
    EXPECT_TRUE(same_bits(y, want));
  }
}

// Calls of up to 1024 tokens run streamed (a contiguous range of tiles per
// thread, each covered for all tokens a few groups at a time; Q6_K and Q3_K
// widened from 48 tokens on), larger ones in prompt tasks of 48 tokens (F16
// and BF16 widened too, 528 tokens a task): both give the canonical bits,
// and so do the multi-token tiles that request the next tile's weights.
TEST_P(MatmulTest, StreamedCallsAndPromptTasksGiveTheSameBits) {
  const DType t = GetParam();
  IsaRestore restore;
  const Weights w = make_weights(t, 256, 100, 97);
  const std::vector<float> x = make_x(1100 * 256, 13);
  {
    SCOPED_TRACE("1100 tokens in prompt tasks (23 token tasks, the last short)");
    expect_calls_follow_the_rule(w, x, {1100});
  }
  {
    SCOPED_TRACE("1024, 60 and 16 tokens streamed");
    expect_calls_follow_the_rule(w, x, {1024, 60, 16});
  }
}

// packed_matrix_bytes (what model loading budgets for) is what PackedMatrix
// takes in its default layout, padding groups of short last regions included,
// on every ISA.
TEST(PackedMatrixBytes, MatchTheDefaultLayout) {
  IsaRestore restore;
  for (KernelIsa isa : isas()) {
    set_kernel_isa(isa);
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
      for (int64_t n_out : {16, 77, 200, 1000}) {
        const int64_t n_in = block_elems(t) == 256 ? 256 : 64;
        const Weights w = make_weights(t, n_in, n_out, 61);
        EXPECT_EQ(packed_matrix_bytes(t, n_in, n_out), PackedMatrix(w.view()).packed_bytes())
            << kernel_isa_name(isa) << " " << dtype_name(static_cast<uint32_t>(t)) << " n_out " << n_out;
      }
    }
    // F matrices of more than 4 MiB take the long matrices' regions: at the
    // bound (4 MiB of F16) and just above it.
    for (int64_t n_out : {2048, 2064}) {
      const Weights w = make_weights(DType::F16, 1024, n_out, 67);
      EXPECT_EQ(packed_matrix_bytes(DType::F16, 1024, n_out), PackedMatrix(w.view()).packed_bytes())
          << kernel_isa_name(isa) << " F16 n_out " << n_out;
    }
  }
}

// Default layouts per ISA. The F types' short matrices are dealt to 4
// regions on AVX-512 (4 streams start faster after each decode dispatch)
// and matrices of more than 4 MiB to 8 (long shares read faster from 8);
// AVX2 deals both to 4 (session 28). Q8_0 takes 8 on AVX-512 (its row
// tiles' width) and 2 on AVX2 (its decode tile's); the other 32-element
// block types keep AVX-512's interleaved layout (session 29).
TEST(PackedMatrixRegions, FollowTheTypeTheSizeAndTheIsa) {
  if (std::getenv("REPRISE_REGIONS") || std::getenv("REPRISE_INTERLEAVE")) GTEST_SKIP() << "layout fixed by the environment";
  IsaRestore restore;
  for (KernelIsa isa : isas()) {
    set_kernel_isa(isa);
    SCOPED_TRACE(kernel_isa_name(isa));
    const bool avx512 = isa == KernelIsa::Avx512;
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
      const int64_t n_in = 1024, long_rows = (int64_t{4} << 20) / static_cast<int64_t>(dtype_row_bytes(t, n_in)) + 16;
      EXPECT_EQ(PackedMatrix(make_weights(t, n_in, 1000, 71).view()).regions(), 4) << dtype_name(static_cast<uint32_t>(t));
      EXPECT_EQ(PackedMatrix(make_weights(t, n_in, long_rows, 73).view()).regions(), avx512 ? 8 : 4)
          << dtype_name(static_cast<uint32_t>(t));
    }
    EXPECT_EQ(PackedMatrix(make_weights(DType::Q8_0, 512, 300, 75).view()).regions(), avx512 ? 8 : 2);
    EXPECT_EQ(PackedMatrix(make_weights(DType::Q4_0, 512, 300, 75).view()).regions(), avx512 ? 0 : 2);
    // Q6_K and Q3_K: AVX-512 decodes them a group at a time from
    // contiguous groups (session 35); AVX2 deals them to regions as the
    // other K types.
    for (DType t : {DType::Q6_K, DType::Q3_K}) {
      const PackedMatrix pm(make_weights(t, 512, 300, 77).view());
      EXPECT_EQ(pm.regions(), avx512 ? 0 : 2) << dtype_name(static_cast<uint32_t>(t));
      if (avx512) {
        EXPECT_EQ(pm.interleave(), 1) << dtype_name(static_cast<uint32_t>(t));
      }
    }
    EXPECT_EQ(PackedMatrix(make_weights(DType::Q4_K, 512, 300, 77).view()).regions(), avx512 ? 4 : 2);
  }
}

// Every small batch (2 to 11 tokens) on Q8_0's 8 regions, where AVX-512
// reads whole region rows in one pass with a tile per batch size: rows
// that fill whole region rows, a short last row, and more groups than one
// kernel call takes, against the rule's bits token by token.
TEST(MatmulSmallBatch, Q8_0RegionRowsGiveTheRulesBitsForEveryBatchSize) {
  IsaRestore restore;
  for (auto [n_in, n_out] : {std::pair<int64_t, int64_t>{256, 128}, {96, 200}, {1056, 1000}}) {
    SCOPED_TRACE("n_in " + std::to_string(n_in) + " n_out " + std::to_string(n_out));
    const Weights w = make_weights(DType::Q8_0, n_in, n_out, 83 + static_cast<uint32_t>(n_out));
    const int64_t n_tokens = 11;
    const std::vector<float> x = make_x(n_tokens * n_in, 85);
    const std::vector<float> want = canonical_outputs(w, x, n_tokens);
    for (KernelIsa isa : isas()) {
      set_kernel_isa(isa);
      SCOPED_TRACE(kernel_isa_name(isa));
      const PackedMatrix pm(w.view(), 0, 8);
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        for (int64_t len = 2; len <= n_tokens; ++len) {
          std::vector<float> y(len * n_out, -1.0f);
          matmul(pm, x.data(), len, y.data(), pool);
          const std::vector<float> want_len(want.begin(), want.begin() + len * n_out);
          EXPECT_TRUE(same_bits(y, want_len)) << len << " tokens, " << threads << " threads";
        }
      }
    }
  }
}

// Decode tiles prefetch their weights or not as the pool's tuner measures
// faster (prefetch_tuner.h); while it measures, a product alternates between
// the two. Every call must give the rule's bits either way.
TEST(MatmulDecode, SameBitsWhicheverPrefetchTheTunerPicks) {
  if (std::getenv("REPRISE_PREFETCH")) GTEST_SKIP() << "REPRISE_PREFETCH fixes the distance; the tuner is off";
  IsaRestore restore;
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K}) {
    const Weights w = make_weights(t, 512, 200, 41);
    const std::vector<float> x = make_x(512, 43);
    std::vector<float> want(w.n_out);
    for (int64_t r = 0; r < w.n_out; ++r) want[r] = canonical(w, r, x.data());
    for (KernelIsa isa : isas()) {
      set_kernel_isa(isa);
      SCOPED_TRACE(std::string(kernel_isa_name(isa)) + " " + dtype_name(static_cast<uint32_t>(t)));
      ThreadPool pool(2);
      PackedMatrix pm(w.view());
      const int calls = 2 * PrefetchTuner::Settings{}.pairs_per_round + 8;
      for (int i = 0; i < calls; ++i) {
        std::vector<float> y(w.n_out, -1.0f);
        matmul(pm, x.data(), 1, y.data(), pool);
        ASSERT_TRUE(same_bits(y, want)) << "call " << i;
      }
      // The calls went through a whole measuring round: both settings ran.
      EXPECT_EQ(pool.caller_local<PrefetchTuner>().rounds(t), 1);
    }
  }
}

// Decode products split their tiles into one range per thread and let a
// thread that is done take tiles from the back of the others' ranges. With
// more threads than cores (so threads are descheduled mid-range and others
// take over), over several matrices of uneven sizes, every output must be
// written, once, with the rule's bits.
TEST(MatmulDecode, RangesAndStealingCoverEveryTile) {
  IsaRestore restore;
  const Weights a = make_weights(DType::Q8_0, 256, 1000, 51), b = make_weights(DType::Q8_0, 256, 77, 52),
                c = make_weights(DType::Q8_0, 256, 300, 53);
  const PackedMatrix pa(a.view()), pb(b.view()), pc(c.view());
  for (int threads : {3, 4, 7}) {
    ThreadPool pool(threads);
    for (int64_t n_tokens : {1, 2, 5}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, " + std::to_string(n_tokens) + " tokens");
      const std::vector<float> x = make_x(n_tokens * 256, 54 + static_cast<uint32_t>(n_tokens));
      const std::vector<float> want_a = run(a, x, n_tokens, 1), want_b = run(b, x, n_tokens, 1),
                               want_c = run(c, x, n_tokens, 1);
      for (int rep = 0; rep < 40; ++rep) {
        std::vector<float> ya(n_tokens * 1000, NAN), yb(n_tokens * 77, NAN), yc(n_tokens * 300, NAN);
        const MatmulOutput outs[] = {{&pa, ya.data()}, {&pb, yb.data()}, {&pc, yc.data()}};
        matmul_many(outs, x.data(), n_tokens, pool);
        ASSERT_TRUE(same_bits(ya, want_a) && same_bits(yb, want_b) && same_bits(yc, want_c)) << "rep " << rep;
      }
    }
  }
}

// Matrices of 8 MiB and more are packed at load on one thread per core
// (PackedMatrix), in pieces; the pieces' bytes must not depend on the split.
// On a one-core machine this is the single-piece path again.
TEST(MatmulLargeMatrix, PackedInPiecesFollowsTheRule) {
  IsaRestore restore;
  for (DType t : {DType::Q6_K, DType::Q3_K, DType::IQ4_XS, DType::Q5_K, DType::Q5_0, DType::F16}) {
    // IQ4_XS packs 4.4 bits per weight, Q3_K 3.625: more rows reach 8 MiB.
    const Weights w = make_weights(t, 4096, t == DType::IQ4_XS ? 4096 : t == DType::Q3_K ? 4736 : 3072, 29);
    ASSERT_GE(PackedMatrix(w.view()).packed_bytes(), size_t{8} << 20);
    // The ISA's super-groups, and 3 (pieces of whole super-groups, the last short).
    for (int interleave : {0, 3}) expect_every_isa_follows_the_rule(w, make_x(2 * 4096, 31), 2, interleave);
  }
}

// Integer sums at their limits: every weight quant at its extreme (Q4_0
// nibbles 15 or 0, Q8_0 quants -128, 127 and -127) against activations that
// are all +127, all -127 or mixed. Kernels add integer products in narrower
// types where the sums fit (AVX2 adds a Q4_0 block's unsigned nibble
// products in 16 bits: 32 * 15 * 127 = 60960 over a row's two lanes, at most
// 30480 per lane); these rows are where a lane would overflow if they did not.
TEST(MatmulQuantizedWeights, IntegerSumsAtTheirLimits) {
  IsaRestore restore;
  const int64_t n_in = 32 * 4, n_out = 40, n_tokens = 7;
  std::vector<float> x(n_tokens * n_in);
  // amax 1 in every block, so every quant is +-127: all +127, all -127, or mixed.
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t k = 0; k < n_in; ++k)
      x[t * n_in + k] = t % 3 == 0 ? 1.0f : t % 3 == 1 ? -1.0f : (k % 3 == 0 ? 1.0f : -1.0f);
  for (DType type : {DType::Q8_0, DType::Q4_0, DType::IQ4_NL}) {
    Weights w{type, n_in, n_out, std::vector<uint8_t>(dtype_row_bytes(type, n_in) * n_out)};
    for (int64_t r = 0; r < n_out; ++r) {
      uint8_t* row = w.bytes.data() + r * dtype_row_bytes(type, n_in);
      for (int64_t b = 0; b < n_in / 32; ++b) {
        const uint16_t d = f32_to_f16(r % 5 == 0 ? 1.0f : 0.25f);
        if (type == DType::Q8_0) {
          auto& blk = reinterpret_cast<BlockQ8_0*>(row)[b];
          blk.d = d;
          for (int i = 0; i < 32; ++i) blk.qs[i] = static_cast<int8_t>(r % 3 == 0 ? -128 : (r % 3 == 1 ? 127 : -127));
        } else if (type == DType::Q4_0) {
          auto& blk = reinterpret_cast<BlockQ4_0*>(row)[b];
          blk.d = d;
          // Nibble 15 is +7 and nibble 0 is -8; unsigned kernels see 15 or 0.
          for (int i = 0; i < 16; ++i) blk.qs[i] = r % 2 == 0 ? 0xff : 0x00;
        } else {
          // IQ4_NL's table ends: nibble 0 is -127, nibble 15 is +113.
          auto& blk = reinterpret_cast<BlockIQ4_NL*>(row)[b];
          blk.d = d;
          for (int i = 0; i < 16; ++i) blk.qs[i] = r % 2 == 0 ? 0xff : 0x00;
        }
      }
    }
    expect_every_isa_follows_the_rule(w, x, n_tokens);
  }
  // Rows alternately with every bit set (quants at their top: 15, 31 or 63)
  // and all zero, then set_block(row, block bytes) writes finite scales.
  auto saturated = [&](DType type, int64_t in, auto set_block) {
    const size_t block = dtype_row_bytes(type, block_elems(type)), row_bytes = dtype_row_bytes(type, in);
    Weights w{type, in, n_out, std::vector<uint8_t>(row_bytes * n_out)};
    for (int64_t r = 0; r < n_out; ++r) {
      uint8_t* row = w.bytes.data() + r * row_bytes;
      std::memset(row, r % 2 == 0 ? 0xff : 0x00, row_bytes);
      for (int64_t b = 0; b < in / block_elems(type); ++b) set_block(r, row + b * block);
    }
    return w;
  };
  // Q4_1 / Q5_0 / Q5_1: scale (and min) 1 or 0.25.
  for (DType type : {DType::Q4_1, DType::Q5_0, DType::Q5_1}) {
    const Weights w = saturated(type, n_in, [&](int64_t r, uint8_t* blk) {
      const uint16_t d = f32_to_f16(r % 5 == 0 ? 1.0f : 0.25f);
      std::memcpy(blk, &d, 2);
      if (type != DType::Q5_0) std::memcpy(blk + 2, &d, 2);
    });
    expect_every_isa_follows_the_rule(w, x, n_tokens);
  }
  // K types, with the largest sub-block scales and mins (Q6_K: -128 and
  // 127, so the products reach 63 * 127 * 128 per element, and the integer
  // sums over a super-block their largest magnitude).
  const int64_t k_in = 512;
  std::vector<float> xk(n_tokens * k_in);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t k = 0; k < k_in; ++k)
      xk[t * k_in + k] = t % 3 == 0 ? 1.0f : t % 3 == 1 ? -1.0f : (k % 3 == 0 ? 1.0f : -1.0f);
  for (DType type : {DType::Q2_K, DType::Q3_K, DType::IQ4_XS, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const Weights w = saturated(type, k_in, [&](int64_t r, uint8_t* blk) {
      const uint16_t d = f32_to_f16(r % 5 == 0 ? 1.0f : 0.25f);
      if (type == DType::Q2_K) {
        // Quants 3 (every bit set, even rows) or 0; every scale and min 15.
        auto& q2 = *reinterpret_cast<BlockQ2_K*>(blk);
        q2.d = d;
        q2.dmin = d;
        std::memset(q2.scales, 0xff, 16);
      } else if (type == DType::IQ4_XS) {
        // Table ends +113 (every bit set, even rows) or -127 (none, odd
        // rows); scales -32 (bits zero) or +31 (all set), by row % 3.
        auto& xs = *reinterpret_cast<BlockIQ4_XS*>(blk);
        xs.d = d;
        xs.scales_h = r % 3 == 0 ? 0x0000 : 0xffff;
        std::memset(xs.scales_l, r % 3 == 0 ? 0x00 : 0xff, 4);
      } else if (type == DType::Q3_K) {
        // Quants +3 (every bit set, even rows) or -4 (none, odd rows);
        // scales -32 (bytes zero) or +31 (bytes 0xff), by row % 3.
        auto& q3 = *reinterpret_cast<BlockQ3_K*>(blk);
        q3.d = d;
        std::memset(q3.scales, r % 3 == 0 ? 0x00 : 0xff, 12);
      } else if (type == DType::Q6_K) {
        auto& q6 = *reinterpret_cast<BlockQ6_K*>(blk);
        q6.d = d;
        for (int j = 0; j < 16; ++j) q6.scales[j] = static_cast<int8_t>((j + r) % 2 == 0 ? -128 : 127);
      } else {
        std::memcpy(blk, &d, 2);
        std::memcpy(blk + 2, &d, 2);
        std::memset(blk + 4, 0xff, 12);  // every scale and min 63
      }
    });
    expect_every_isa_follows_the_rule(w, xk, n_tokens);
  }
}

// Activations whose Q8_0 quantization hits the rule's edges: all-zero
// blocks (d = 0, no division), exact halves after scaling (round half to
// even), amax whose d is an f16 subnormal or overflows f16, and values that
// only just round to +-127. Every ISA, decode and batch, against the rule.
TEST(MatmulQuantizedActivations, EdgeCasesFollowTheRule) {
  IsaRestore restore;
  const int64_t n_in = 32 * 20, n_out = 19, n_tokens = 14;
  std::vector<float> x = make_x(n_tokens * n_in, 17);
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* row = x.data() + t * n_in;
    std::fill(row, row + 32, 0.0f);                                      // block 0: zeros
    for (int i = 0; i < 32; ++i) row[32 + i] = (i % 2 ? 1 : -1) * (i * 0.5f);  // block 1: amax 15.5
    row[64] = 127.0f;                                                    // block 2: id = 1, halves tie
    for (int i = 1; i < 32; ++i) row[64 + i] = static_cast<float>(i) + 0.5f * static_cast<float>(i % 3 - 1);
    for (int i = 0; i < 32; ++i) row[96 + i] = 1e-9f * static_cast<float>(i - 16 + t);  // d subnormal in f16
    // d overflows f16 (so the token's outputs are infinite or NaN: only the last two tokens).
    if (t >= n_tokens - 2)
      for (int i = 0; i < 32; ++i) row[128 + i] = 3e6f * static_cast<float>(16 - i);
    for (int i = 0; i < 32; ++i) row[160 + i] = -0.0f;                                 // negative zeros
    row[192] = 1.0f;
    row[193] = -1.0f + 1e-7f;                                                          // rounds to -127
  }
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL}) {
    expect_every_isa_follows_the_rule(make_weights(t, n_in, n_out, 23), x, n_tokens);
  }
}

// Activations whose Q8_K quantization (the K types) hits the rule's edges:
// an all-zero section (d = 0), negative zeros, the largest magnitude held by
// both signs (which one sets the scale's sign changes no product: the quants
// and the scale flip together), exact halves after
// scaling (round half to even), and a section whose max is positive (every
// quant's sign flips). Every ISA, decode and batch, against the rule.
TEST(MatmulQuantizedActivations, SectionEdgeCasesFollowTheRule) {
  IsaRestore restore;
  const int64_t n_in = 256 * 5, n_out = 21, n_tokens = 13;
  std::vector<float> x = make_x(n_tokens * n_in, 29);
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* row = x.data() + t * n_in;
    const float f = static_cast<float>(t % 4 + 1);
    std::fill(row, row + 256, 0.0f);         // section 0: zeros
    std::fill(row + 256, row + 512, -0.0f);  // section 1: negative zeros
    // Section 2: max -127 * f then +127 * f; scale -127 / max = 1 / f, so
    // halves (times f) tie.
    for (int i = 0; i < 256; ++i) row[512 + i] = f * (i % 2 ? 1.0f : -1.0f) * (0.5f * static_cast<float>(i % 255));
    row[512] = -127.0f * f;
    row[513] = 127.0f * f;
    row[767] = 127.0f * f;
    // Section 3: max +127: every quant is the negated rounded value.
    for (int i = 0; i < 256; ++i) row[768 + i] = 0.5f * static_cast<float>(i % 200) - 37.25f;
    row[768 + 100] = 127.0f;
  }
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::IQ4_XS, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    expect_every_isa_follows_the_rule(make_weights(t, n_in, n_out, 31), x, n_tokens);
  }
}

TEST_P(MatmulTest, CloseToDoublePrecision) {
  const DType t = GetParam();
  const int64_t n_in = 512, n_out = 48, n_tokens = 9;
  const Weights w = make_weights(t, n_in, n_out, 3);
  const std::vector<float> x = make_x(n_tokens * n_in, 9);
  const std::vector<float> y = run(w, x, n_tokens, 2);
  std::vector<float> row(n_in);
  // Relative to sum |w x|: activation rounding dominates (f16 2^-11, bf16 2^-8,
  // Q8_0 up to amax/254 per element).
  const double rel = t == DType::F32 ? 1e-6 : t == DType::F16 ? 2e-3 : t == DType::BF16 ? 1e-2 : 2e-2;
  for (int64_t r = 0; r < n_out; ++r) {
    dequantize_row(w.view(), r, row.data());
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < n_in; ++k) {
        ref += static_cast<double>(row[k]) * x[tok * n_in + k];
        mag += std::fabs(static_cast<double>(row[k]) * x[tok * n_in + k]);
      }
      EXPECT_NEAR(y[tok * n_out + r], ref, rel * mag + 1e-6) << "row " << r << " token " << tok;
    }
  }
}

TEST_P(MatmulTest, ManyEqualsSingle) {
  const DType t = GetParam();
  const int64_t n_in = block_elems(t) == 256 ? 256 : 128;
  const Weights a = make_weights(t, n_in, 40, 1), b = make_weights(t, n_in, 17, 2);
  for (int64_t n_tokens : {1, 30}) {
    const std::vector<float> x = make_x(n_tokens * n_in, 4);
    ThreadPool pool(2);
    PackedMatrix pa(a.view()), pb(b.view());
    std::vector<float> ya(n_tokens * 40), yb(n_tokens * 17);
    const MatmulOutput outs[] = {{&pa, ya.data()}, {&pb, yb.data()}};
    matmul_many(outs, x.data(), n_tokens, pool);
    EXPECT_TRUE(same_bits(ya, run(a, x, n_tokens, 1)));
    EXPECT_TRUE(same_bits(yb, run(b, x, n_tokens, 1)));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulTest, ::testing::ValuesIn(kTypes),
                         [](const auto& info) { return dtype_name(static_cast<uint32_t>(info.param)); });

// ---- Attention.

// K/V of n positions as rows: position p's KV head j at p * kv_dim + j * head_dim.
struct KvStore {
  int64_t n_pos, kv_dim;
  std::vector<uint16_t> k, v;
  KvStore(int64_t n, int64_t dim, uint32_t seed) : n_pos(n), kv_dim(dim), k(n * dim), v(n * dim) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& e : k) e = f32_to_f16(dist(rng));
    for (auto& e : v) e = f32_to_f16(dist(rng));
  }
  uint16_t key(int64_t p, int64_t e) const { return k[p * kv_dim + e]; }
  uint16_t value(int64_t p, int64_t e) const { return v[p * kv_dim + e]; }
};

// The same K/V laid out as a SequenceMemory holds it (what the kernels
// read): `block` positions per block, the blocks in a shuffled order or in
// order, in each block one KV head's state after another, keys in groups of
// `group` positions (tensor/key_layout.h). block 0: whole rows, one after
// another (only with group 1).
struct StoredKv {
  std::vector<uint16_t> k, v;
  std::vector<const uint16_t*> krows, vrows;
  int64_t head_stride = 0, group = 1;
};
StoredKv store_kv_layout(const KvStore& src, int64_t n_head_kv, int64_t head_dim, int64_t block, int64_t group,
                         bool shuffled) {
  StoredKv kv;
  kv.group = group;
  if (block == 0) {
    EXPECT_EQ(group, 1);
    kv.k = src.k;
    kv.v = src.v;
    for (int64_t p = 0; p < src.n_pos; ++p) {
      kv.krows.push_back(kv.k.data() + p * src.kv_dim);
      kv.vrows.push_back(kv.v.data() + p * src.kv_dim);
    }
    return kv;
  }
  EXPECT_EQ(block % group, 0);
  const int64_t n_blocks = (src.n_pos + block - 1) / block;
  std::vector<int64_t> place(n_blocks);
  std::iota(place.begin(), place.end(), 0);
  if (shuffled) std::shuffle(place.begin(), place.end(), std::mt19937(7));
  // Unwritten key lanes hold NaN: the kernels must never weigh them.
  kv.k.assign(n_blocks * block * src.kv_dim, 0x7e00);
  kv.v.assign(kv.k.size(), 0);
  kv.head_stride = block * head_dim;
  for (int64_t p = 0; p < src.n_pos; ++p) {
    const int64_t at = place[p / block] * block * src.kv_dim + (p % block) * head_dim;
    const int64_t group_at = place[p / block] * block * src.kv_dim + (p % block - p % group) * head_dim;
    for (int64_t j = 0; j < n_head_kv; ++j) {
      for (int64_t i = 0; i < head_dim; ++i)
        kv.k[group_at + j * kv.head_stride + i * group + p % group] = src.key(p, j * head_dim + i);
      std::copy_n(src.v.begin() + p * src.kv_dim + j * head_dim, head_dim, kv.v.begin() + at + j * kv.head_stride);
    }
    kv.krows.push_back(kv.k.data() + at);
    kv.vrows.push_back(kv.v.data() + at);
  }
  return kv;
}

// As FlatMemory holds it: one block of every position, groups of 16.
StoredKv flat_layout(const KvStore& src, int64_t n_head_kv, int64_t head_dim) {
  return store_kv_layout(src, n_head_kv, head_dim, (src.n_pos + 15) / 16 * 16, 16, false);
}

std::vector<float> run_attention(const StoredKv& kv, const std::vector<float>& q, int64_t n_head, int64_t n_head_kv,
                                 int64_t head_dim, const std::vector<int64_t>& first, const std::vector<int64_t>& end,
                                 int64_t t0, int64_t n, int threads) {
  ThreadPool pool(threads);
  AttentionBatch a;
  a.q = q.data() + t0 * n_head * head_dim;
  a.n_tokens = n;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  a.first = first.data() + t0;
  a.end = end.data() + t0;
  a.key_rows = kv.krows.data();
  a.value_rows = kv.vrows.data();
  a.kv_head_stride = kv.head_stride;
  a.key_group = kv.group;
  std::vector<float> out(n * n_head * head_dim);
  a.out = out.data();
  attention(a, pool);
  return out;
}

std::vector<float> run_attention(const KvStore& kv, const std::vector<float>& q, int64_t n_head, int64_t n_head_kv,
                                 int64_t head_dim, const std::vector<int64_t>& first, const std::vector<int64_t>& end,
                                 int64_t t0, int64_t n, int threads) {
  return run_attention(flat_layout(kv, n_head_kv, head_dim), q, n_head, n_head_kv, head_dim, first, end, t0, n, threads);
}

// A tiled-attention case: random f16 K/V of n_pos positions for n_head_kv
// heads (flat layout) and the f32 rows of n_q queries of n_head heads.
struct TiledCase {
  KvStore kv;
  StoredKv stored;
  std::vector<float> q;
  TiledCase(int64_t n_pos, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t n_q, uint32_t seed)
      : kv(n_pos, n_head_kv * head_dim, seed),
        stored(flat_layout(kv, n_head_kv, head_dim)),
        q(make_x(n_q * n_head * head_dim, seed + 1)) {}
};
std::string tiled_trace(int64_t head_dim, int64_t n_head, int64_t n_head_kv, int64_t n_q) {
  return "head_dim " + std::to_string(head_dim) + ", " + std::to_string(n_head) + " heads, " +
         std::to_string(n_head_kv) + " KV heads, " + std::to_string(n_q) + " queries";
}

// softmax(q k^T * scale) v in double precision over positions [first, end)
// of the f16 K/V at element offset off.
std::vector<double> softmax_attention(const KvStore& kv, const float* q, int64_t off, int64_t first, int64_t end,
                                      int64_t head_dim, double scale) {
  std::vector<double> s;
  double mx = -1e300;
  for (int64_t p = first; p < end; ++p) {
    double dot = 0;
    for (int64_t i = 0; i < head_dim; ++i) dot += static_cast<double>(q[i]) * f16_to_f32(kv.key(p, off + i));
    s.push_back(dot * scale);
    mx = std::max(mx, s.back());
  }
  double sum = 0;
  for (auto& e : s) sum += (e = std::exp(e - mx));
  std::vector<double> out(head_dim);
  for (int64_t i = 0; i < head_dim; ++i) {
    double o = 0;
    for (int64_t p = first; p < end; ++p) o += s[p - first] * f16_to_f32(kv.value(p, off + i));
    out[i] = o / sum;
  }
  return out;
}

TEST(Attention, QueryIndependentOfBatchAndCloseToReference) {
  IsaRestore restore;
  // Heads per KV head: 2, 4 (a decode task's 4 heads then share one KV
  // head, which the AVX-512 decode kernel handles separately) and 7 (a
  // decode task takes a whole KV head: 4 heads, then 3, through this path);
  // and 1 and 2 below 64 positions, where a decode task's 4 heads read 4
  // or 2 KV heads, each its own keys.
  for (const auto& [n_head, n_head_kv] :
       {std::pair<int64_t, int64_t>{4, 2}, {8, 2}, {14, 2}, {8, 8}, {8, 4}})
  for (int64_t head_dim : {64, 40, 16, 128, 8, 4, 12, 32, 96, 44, 80}) {
    if (n_head == 8 && head_dim % 32 != 0) continue;
    if (n_head == 14 && head_dim != 64 && head_dim != 40) continue;
    SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", " + std::to_string(n_head) + " heads, " +
                 std::to_string(n_head_kv) + " KV heads");
    // Positions below 64 (these numerics for every head size) with 14 heads
    // and with 1 or 2 heads per KV head.
    const int64_t n_pos = n_head == 14 || n_head_kv >= 4 ? 60 : 150, n_q = 37;
    KvStore kv(n_pos, n_head_kv * head_dim, 7);
    std::vector<float> q = make_x(n_q * n_head * head_dim, 8);
    for (auto& e : q) e *= 0.5f;
    std::vector<int64_t> first(n_q), end(n_q);
    for (int64_t t = 0; t < n_q; ++t) {
      const int64_t pos = n_pos - n_q + t;
      first[t] = t % 5 == 0 ? pos / 3 : 0;  // some sliding windows
      end[t] = t >= 10 && t < 14 ? n_pos - n_q + 14 : pos + 1;  // a bidirectional span
    }
    std::vector<float> first_isa;
    for (KernelIsa isa : isas()) {
      set_kernel_isa(isa);
      const auto all = run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, 0, n_q, 2);
      // Every instruction set gives the same bits.
      if (first_isa.empty()) first_isa = all;
      EXPECT_TRUE(same_bits(all, first_isa)) << kernel_isa_name(isa);
      EXPECT_TRUE(same_bits(all, run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, 0, n_q, 1)));
      EXPECT_TRUE(same_bits(all, run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, 0, n_q, 3)));
      for (int64_t t = 0; t < n_q; ++t) {
        auto one = run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, t, 1, 2);
        ASSERT_EQ(0, std::memcmp(one.data(), all.data() + t * n_head * head_dim, one.size() * sizeof(float)))
            << "query " << t << " alone differs from the batch";
      }
      // Double-precision softmax(q k^T) v with the f16-rounded inputs.
      const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      for (int64_t t = 0; t < n_q; ++t)
        for (int64_t h = 0; h < n_head; ++h) {
          const int64_t off = (h / (n_head / n_head_kv)) * head_dim;
          std::vector<float> qt(q.begin() + (t * n_head + h) * head_dim, q.begin() + (t * n_head + h + 1) * head_dim);
          for (float& e : qt) e = round_f16(e);  // this path rounds the query to f16
          const std::vector<double> want = softmax_attention(kv, qt.data(), off, first[t], end[t], head_dim, scale);
          for (int64_t i = 0; i < head_dim; ++i)
            // The f16 accumulator rounds at every key: allow ~1e-2 of the value scale.
            EXPECT_NEAR(all[(t * n_head + h) * head_dim + i], want[i], 1.5e-2) << "t " << t << " h " << h << " d " << i;
        }
    }
  }
}

// Rows whose keys reach past the first 64 positions take ggml's tiled
// numerics (f32 query and accumulator, 64-position tiles): every such row
// equals the plainly written reference bit for bit, alone or in a batch, on
// every instruction set, across tile edges, sliding windows, a bidirectional
// span and grouped heads; and it is within f32 rounding of softmax(q k^T) v
// in double precision.
TEST(Attention, TiledRowsEqualTheirReference) {
  IsaRestore restore;
  // 14 / 2 and 20 / 1: query-head groups that are not a multiple of a
  // decode task's 4 heads (a task then takes whole KV heads, or 16 heads);
  // 2 / 2 and 8 / 8: multi-head, whose AVX-512 decode takes heads in pairs.
  for (const auto& [n_head, n_head_kv] :
       {std::pair<int64_t, int64_t>{2, 2}, {8, 8}, {4, 2}, {8, 2}, {14, 2}, {20, 1}})
    for (int64_t head_dim : {16, 32, 64, 80, 128, 256}) {  // 80: a last 16-dimension chunk
      for (int64_t n_q : {41, 42, 43}) {  // a run's last group of queries takes 1, 2 or 3 of them
        SCOPED_TRACE(tiled_trace(head_dim, n_head, n_head_kv, n_q));
        const TiledCase c(300, n_head, n_head_kv, head_dim, n_q, 31);
        const KvStore& kv = c.kv;
        const StoredKv& stored = c.stored;
        const std::vector<float>& q = c.q;
        std::vector<int64_t> first(n_q), end(n_q);
        for (int64_t t = 0; t < n_q; ++t) {
          const int64_t pos = 40 + t * 6;  // 40 .. 280: rows on both sides of the rule
          first[t] = t % 4 == 1 ? std::max<int64_t>(0, pos - 70) : t % 4 == 2 ? 64 : 0;  // windows inside / at a tile
          end[t] = t >= 20 && t < 24 ? 170 : pos + 1;               // a bidirectional span
        }
        std::vector<float> first_isa;
        for (KernelIsa isa : isas()) {
          set_kernel_isa(isa);
          const auto all = run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, 0, n_q, 2);
          if (first_isa.empty()) first_isa = all;
          EXPECT_TRUE(same_bits(all, first_isa)) << kernel_isa_name(isa);
          int tiled_rows = 0;
          for (int64_t t = 0; t < n_q; ++t) {
            if (!kernels::takes_tiled_attention(head_dim, end[t])) continue;
            ++tiled_rows;
            const auto one = run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, t, 1, 1);
            for (int64_t h = 0; h < n_head; ++h) {
              const int64_t off = (h / (n_head / n_head_kv)) * head_dim;
              const float* qt = q.data() + (t * n_head + h) * head_dim;
              std::vector<float> want(head_dim);
              kernels::attend_tiled_reference(qt, stored.krows.data(), stored.vrows.data(),
                                              (off / head_dim) * stored.head_stride, stored.group, first[t], end[t],
                                              head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim)), want.data());
              const float* got = all.data() + (t * n_head + h) * head_dim;
              ASSERT_EQ(0, std::memcmp(got, want.data(), head_dim * sizeof(float))) << "query " << t << " head " << h;
              ASSERT_EQ(0, std::memcmp(one.data() + h * head_dim, want.data(), head_dim * sizeof(float)))
                  << "query " << t << " alone, head " << h;
              const std::vector<double> exact = softmax_attention(kv, qt, off, first[t], end[t], head_dim,
                                                                  1.0 / std::sqrt(static_cast<double>(head_dim)));
              for (int64_t i = 0; i < head_dim; ++i)
                EXPECT_NEAR(got[i], exact[i], 2e-5) << "t " << t << " h " << h << " d " << i;
            }
          }
          EXPECT_GT(tiled_rows, 30);
        }
      }
    }
}

// Decode queries at long contexts (900 to 1100 keys, past the tile-size and
// power-of-two edges the shorter tests stop below) equal the plainly written
// reference bit for bit, on every instruction set and thread count, with
// multi-head tasks (AVX-512: two heads interleaved, tile_step_pair) and
// grouped ones.
TEST(Attention, DecodeTasksEqualTheReferenceAtEveryContextLength) {
  IsaRestore restore;
  for (const auto& [n_head, n_head_kv] : {std::pair<int64_t, int64_t>{8, 8}, {2, 2}, {8, 2}})
    for (int64_t head_dim : {64, 128}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", " + std::to_string(n_head) + " heads, " +
                   std::to_string(n_head_kv) + " KV heads");
      const int64_t n_pos = 1100;
      KvStore kv(n_pos, n_head_kv * head_dim, 41);
      const StoredKv stored = flat_layout(kv, n_head_kv, head_dim);
      const std::vector<int64_t> ends = {900, 1023, 1024, 1025, 1100, 1100};
      const std::vector<int64_t> firsts = {0, 0, 0, 0, 0, 333};  // the last with a sliding window
      const int64_t n_q = static_cast<int64_t>(ends.size());
      std::vector<float> q = make_x(n_q * n_head * head_dim, 42);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      for (KernelIsa isa : isas()) {
        set_kernel_isa(isa);
        for (int64_t t = 0; t < n_q; ++t)
          for (int threads : {1, 2, 3}) {
            const auto got = run_attention(kv, q, n_head, n_head_kv, head_dim, firsts, ends, t, 1, threads);
            for (int64_t h = 0; h < n_head; ++h) {
              const int64_t kv_head = h / (n_head / n_head_kv);
              std::vector<float> want(head_dim);
              kernels::attend_tiled_reference(q.data() + (t * n_head + h) * head_dim, stored.krows.data(),
                                              stored.vrows.data(), kv_head * stored.head_stride, stored.group,
                                              firsts[t], ends[t], head_dim, scale, want.data());
              ASSERT_EQ(0, std::memcmp(got.data() + h * head_dim, want.data(), head_dim * sizeof(float)))
                  << kernel_isa_name(isa) << ", end " << ends[t] << ", " << threads << " threads, head " << h;
            }
          }
      }
    }
}

// Prompts long enough that a task takes a head's run of up to 128 queries
// (up to 32 groups walking each tile together), through both prompt paths:
// K/V widened to f32 (300 queries of 8 heads on 2 KV heads: 1200 query rows
// per KV head, past the in-place limit of 1024) and read in place (the other
// cases). Every row equals the plainly written reference bit for bit, on
// every instruction set and thread count (which change the runs' lengths).
TEST(Attention, LongPromptRunsEqualTheReference) {
  IsaRestore restore;
  for (const auto& [n_head, n_head_kv] : {std::pair<int64_t, int64_t>{8, 8}, {8, 2}})
    for (int64_t head_dim : {64, 128})
      for (int64_t n_q : {300, 100}) {
        SCOPED_TRACE(tiled_trace(head_dim, n_head, n_head_kv, n_q));
        const int64_t n_pos = 700;
        const TiledCase c(n_pos, n_head, n_head_kv, head_dim, n_q, 43);
        const KvStore& kv = c.kv;
        const StoredKv& stored = c.stored;
        const std::vector<float>& q = c.q;
        std::vector<int64_t> first(n_q), end(n_q);
        for (int64_t t = 0; t < n_q; ++t) {
          end[t] = n_pos - n_q + t + 1;
          first[t] = t % 7 == 3 ? end[t] - 200 : 0;  // some sliding windows
        }
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        std::vector<float> want(n_q * n_head * head_dim);
        for (int64_t t = 0; t < n_q; ++t)
          for (int64_t h = 0; h < n_head; ++h)
            kernels::attend_tiled_reference(q.data() + (t * n_head + h) * head_dim, stored.krows.data(),
                                            stored.vrows.data(), (h / (n_head / n_head_kv)) * stored.head_stride,
                                            stored.group, first[t], end[t], head_dim, scale,
                                            want.data() + (t * n_head + h) * head_dim);
        for (KernelIsa isa : isas()) {
          set_kernel_isa(isa);
          for (int threads : {1, 2, 5}) {
            const auto got = run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, 0, n_q, threads);
            for (int64_t t = 0; t < n_q; ++t)
              ASSERT_EQ(0, std::memcmp(got.data() + t * n_head * head_dim, want.data() + t * n_head * head_dim,
                                       n_head * head_dim * sizeof(float)))
                  << kernel_isa_name(isa) << ", " << threads << " threads, query " << t;
          }
        }
      }
}

// How K/V are stored is only a layout: whole rows, cache-like blocks of
// several sizes (each KV head's state adjacent, blocks shuffled) with keys
// in groups of 1 to 16 positions, all give the same bits, for prompts and
// decode, on both numerics and every instruction set.
TEST(Attention, KvLayoutIsOnlyALayout) {
  IsaRestore restore;
  for (const auto& [n_head, n_head_kv] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}})
    for (int64_t head_dim : {8, 64, 128, 40}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", " + std::to_string(n_head) + " heads");
      const int64_t n_pos = 200, n_q = 24;
      const KvStore kv(n_pos, n_head_kv * head_dim, 51);
      const StoredKv rows = store_kv_layout(kv, n_head_kv, head_dim, 0, 1, false);
      std::vector<float> q = make_x(n_q * n_head * head_dim, 52);
      std::vector<int64_t> first(n_q), end(n_q);
      for (int64_t t = 0; t < n_q; ++t) {
        end[t] = 20 + 7 * t + 1;  // 21 .. 182: both numerics
        first[t] = t % 3 == 1 ? end[t] / 2 : 0;
      }
      // (block, group): FlatMemory's, the cache's default, and smaller blocks.
      for (const auto& [block, group] : {std::pair<int64_t, int64_t>{208, 16}, {32, 16}, {48, 16}, {8, 8}, {12, 4},
                                         {4, 4}, {6, 2}, {5, 1}}) {
        SCOPED_TRACE("block " + std::to_string(block) + ", group " + std::to_string(group));
        ASSERT_EQ(group, key_group_for(block));
        const StoredKv stored = store_kv_layout(kv, n_head_kv, head_dim, block, group, block != 208);
        for (KernelIsa isa : isas()) {
          set_kernel_isa(isa);
          SCOPED_TRACE(kernel_isa_name(isa));
          EXPECT_TRUE(same_bits(run_attention(stored, q, n_head, n_head_kv, head_dim, first, end, 0, n_q, 2),
                                run_attention(rows, q, n_head, n_head_kv, head_dim, first, end, 0, n_q, 2)));
          for (int64_t t : {0, 9, 23}) {  // decode-sized batches
            EXPECT_TRUE(same_bits(run_attention(stored, q, n_head, n_head_kv, head_dim, first, end, t, 1, 2),
                                  run_attention(rows, q, n_head, n_head_kv, head_dim, first, end, t, 1, 2)))
                << "query " << t;
          }
        }
      }
    }
}

// A K value that overflowed f16 (inf) gives scores of +inf, -inf or NaN
// (0 * inf). Rows that see it still give one answer in every batch, path and
// instruction set: the reference's (NaN where it is NaN, -inf scores weigh 0).
void expect_non_finite_scores_agree(int64_t n_head, int64_t n_head_kv) {
  const int64_t head_dim = 64, n_pos = 160, n_q = 24;
  KvStore kv(n_pos, n_head_kv * head_dim, 41);
  kv.k[111 * n_head_kv * head_dim] = 0x7c00;  // +inf, element 0 of KV head 0 at position 111
  std::vector<float> q = make_x(n_q * n_head * head_dim, 42);
  for (int64_t t = 0; t < n_q; ++t) {  // element 0 of the query: 0 (NaN score), negative or positive
    const float e0 = t % 3 == 0 ? 0.0f : t % 3 == 1 ? -0.5f : 0.5f;
    for (int64_t h = 0; h < n_head; ++h) q[(t * n_head + h) * head_dim] = e0;
  }
  std::vector<int64_t> first(n_q, 0), end(n_q);
  for (int64_t t = 0; t < n_q; ++t) end[t] = 100 + 2 * t;  // 100 .. 146: some rows see position 111
  const StoredKv stored = flat_layout(kv, n_head_kv, head_dim);
  int nan_rows = 0;
  for (KernelIsa isa : isas()) {
    set_kernel_isa(isa);
    SCOPED_TRACE(kernel_isa_name(isa));
    const auto all = run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, 0, n_q, 2);
    for (int64_t t = 0; t < n_q; ++t) {
      const auto one = run_attention(kv, q, n_head, n_head_kv, head_dim, first, end, t, 1, 1);
      for (int64_t h = 0; h < n_head; ++h) {
        std::vector<float> want(head_dim);
        kernels::attend_tiled_reference(q.data() + (t * n_head + h) * head_dim, stored.krows.data(),
                                        stored.vrows.data(), (h / (n_head / n_head_kv)) * stored.head_stride,
                                        stored.group, first[t], end[t], head_dim, 0.125f, want.data());
        const float* got[] = {all.data() + (t * n_head + h) * head_dim, one.data() + h * head_dim};
        for (const float* g : got) {
          if (std::isnan(want[0])) {
            for (int64_t i = 0; i < head_dim; ++i) ASSERT_TRUE(std::isnan(g[i])) << "t " << t << " h " << h;
          } else {
            ASSERT_EQ(0, std::memcmp(g, want.data(), head_dim * sizeof(float))) << "t " << t << " h " << h;
          }
        }
        nan_rows += std::isnan(want[0]);
      }
    }
  }
  EXPECT_GT(nan_rows, 0);
}

// Multi-head attention (2 / 2) too: AVX-512 decode takes two heads' tiles
// together there, and only one of the two sees the inf.
TEST(Attention, TiledRowsWithNonFiniteScoresAgree) {
  IsaRestore restore;
  for (const auto& [n_head, n_head_kv] : {std::pair<int64_t, int64_t>{4, 2}, {2, 2}}) {
    SCOPED_TRACE(std::to_string(n_head) + " heads, " + std::to_string(n_head_kv) + " KV heads");
    expect_non_finite_scores_agree(n_head, n_head_kv);
  }
}

// attention_many (one dispatch for several sequences' decode queries, each
// against its own K/V rows) gives each batch what attention() gives it alone,
// on every instruction set; batches the decode kernel does not take (prompt
// chunks) fall back to attention() each.
TEST(Attention, ManyEqualsEachAlone) {
  IsaRestore restore;
  const int64_t n_head = 8, n_head_kv = 2, head_dim = 64;
  std::vector<std::unique_ptr<KvStore>> kv;
  std::vector<StoredKv> stored;
  std::vector<std::vector<float>> q;
  std::vector<std::vector<int64_t>> first, end;
  const std::vector<int64_t> n_tokens{1, 1, 1, 5, 1};  // one prompt chunk among decode steps
  for (size_t s = 0; s < n_tokens.size(); ++s) {
    const int64_t n_pos = 20 + 37 * static_cast<int64_t>(s);
    kv.push_back(std::make_unique<KvStore>(n_pos, n_head_kv * head_dim, 11 + s));
    stored.push_back(flat_layout(*kv.back(), n_head_kv, head_dim));
    q.push_back(make_x(n_tokens[s] * n_head * head_dim, 20 + s));
    first.emplace_back(n_tokens[s], s == 2 ? 9 : 0);  // one sliding window
    end.emplace_back();
    for (int64_t t = 0; t < n_tokens[s]; ++t) end.back().push_back(n_pos - n_tokens[s] + t + 1);
  }
  for (bool with_chunk : {false, true}) {
    const size_t n_seq = with_chunk ? n_tokens.size() : 3;
    for (KernelIsa isa : isas()) {
      set_kernel_isa(isa);
      SCOPED_TRACE(std::string(kernel_isa_name(isa)) + (with_chunk ? ", with a prompt chunk" : ""));
      std::vector<std::vector<float>> out(n_seq);
      std::vector<AttentionBatch> batches(n_seq);
      for (size_t s = 0; s < n_seq; ++s) {
        AttentionBatch& a = batches[s];
        out[s].assign(n_tokens[s] * n_head * head_dim, 0.0f);
        a.q = q[s].data();
        a.n_tokens = n_tokens[s];
        a.n_head = n_head;
        a.n_head_kv = n_head_kv;
        a.head_dim = head_dim;
        a.scale = 0.125f;
        a.first = first[s].data();
        a.end = end[s].data();
        a.key_rows = stored[s].krows.data();
        a.value_rows = stored[s].vrows.data();
        a.kv_head_stride = stored[s].head_stride;
        a.key_group = stored[s].group;
        a.out = out[s].data();
      }
      ThreadPool pool(2);
      attention_many(batches, pool);
      for (size_t s = 0; s < n_seq; ++s)
        EXPECT_TRUE(same_bits(out[s], run_attention(*kv[s], q[s], n_head, n_head_kv, head_dim, first[s], end[s], 0,
                                                    n_tokens[s], 2)))
            << "sequence " << s;
    }
  }
}

// ---- Key layout.

// Keys written with store_keys (whole groups and partial runs, every group
// size) read back through KeyView, gather_key_rows and key_tile16 as the
// f16 of what was stored.
TEST(KeyLayout, StoreThenReadBack) {
  for (int64_t group : {1, 2, 4, 8, 16})
    for (int64_t d : {8, 40, 64}) {
      SCOPED_TRACE("group " + std::to_string(group) + ", d " + std::to_string(d));
      const int64_t n_pos = 80;
      const std::vector<float> src = make_x(n_pos * d, 61);
      std::vector<uint16_t> store(n_pos * d, 0x7e00);
      std::vector<const uint16_t*> rows(n_pos);
      for (int64_t p = 0; p < n_pos; ++p) rows[p] = store.data() + p * d;
      // Whole groups (even ones), and runs of 1 .. group positions cut at
      // group edges (odd ones).
      std::mt19937 rng(static_cast<uint32_t>(group * 100 + d));
      for (int64_t p = 0; p < n_pos;) {
        const int64_t edge = (p / group + 1) * group;
        const int64_t n = (p / group) % 2 == 0
                              ? group
                              : std::min<int64_t>(edge - p, std::uniform_int_distribution<int64_t>(1, group)(rng));
        store_keys(store.data() + (p - p % group) * d, group, p, n, src.data() + p * d, d, d);
        p += n;
      }
      const KeyView keys{rows.data(), 0, group, d};
      for (int64_t p = 0; p < n_pos; ++p)
        for (int64_t i = 0; i < d; ++i) ASSERT_EQ(keys.at(p, i), f32_to_f16(src[p * d + i])) << p << " " << i;
      // Unaligned, a whole 16-position block, and aligned partial ones.
      for (auto [p0, n] : {std::pair<int64_t, int64_t>{33, 5}, {32, 16}, {48, 7}, {64, 9}, {16, 1}}) {
        std::vector<uint16_t> gathered(16 * d + 1, 0x5555);
        gather_key_rows(keys, p0, n, gathered.data());
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < d; ++i) ASSERT_EQ(gathered[j * d + i], keys.at(p0 + j, i)) << p0 << " " << j;
        ASSERT_EQ(gathered[n * d], 0x5555) << "wrote past position " << p0 + n - 1;
      }
      std::vector<uint16_t> scratch(16 * d);
      const uint16_t* tile = key_tile16(keys, 48, 50, 70, scratch.data());
      for (int64_t lane = 2; lane < 16; ++lane)  // positions 50 .. 63 (in [lo, hi))
        for (int64_t i = 0; i < d; ++i) ASSERT_EQ(tile[i * 16 + lane], keys.at(48 + lane, i));
    }
}

// ---- Element-wise helpers.

TEST(Exp, VectorMatchesScalarAndLibm) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-110.0f, 90.0f);
  std::vector<float> x(4099);
  for (auto& v : x) v = dist(rng);
  x[0] = -INFINITY;
  x[1] = INFINITY;
  x[2] = 0.0f;
  x[3] = -0.0f;
  x[4] = 88.5f;
  x[5] = -87.5f;
  x[6] = -100.0f;
  std::vector<float> y(x.size());
  expf_vec(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float s = expf_vec(x[i]);
    ASSERT_EQ(0, std::memcmp(&s, &y[i], 4)) << "x = " << x[i];
    const double want = std::exp(static_cast<double>(x[i]));
    if (want > 1.17549435e-38 && want < 3.4e38) {
      EXPECT_NEAR(y[i], want, want * 4e-7) << "x = " << x[i];
    } else if (want < 1e-38) {
      EXPECT_LE(y[i], 1.2e-38f);
    }
  }
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_TRUE(std::isinf(y[1]));
  EXPECT_EQ(y[2], 1.0f);
  EXPECT_TRUE(std::isnan(expf_vec(NAN)));
  // 2^n with n = -150 rounds once, as ggml's AVX-512 scalef finish does.
  EXPECT_EQ(expf_vec(-103.8f), 0x1p-149f);
  EXPECT_EQ(expf_vec(-104.5f), 0.0f);
}

// Attention's softmax uses the C library's expf, vectorized: same bits.
TEST(Exp, ExactMatchesLibm) {
  std::vector<float> x;
  for (uint32_t b = 0; b < 0xffffffffu - 9973; b += 9973) {
    float f;
    std::memcpy(&f, &b, 4);
    x.push_back(f);
  }
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, 88.72f, 88.73f, -103.97f, -103.98f, -87.33f, 1e-30f, -1e-30f})
    x.push_back(f);
  std::vector<float> y(x.size());
  expf_exact(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(y[i]));
      continue;
    }
    ASSERT_EQ(0, std::memcmp(&want, &y[i], 4)) << "x = " << x[i] << " got " << y[i] << " want " << want;
  }
}

TEST(Rope, TableMatchesDirect) {
  for (RopeStyle style : {RopeStyle::Normal, RopeStyle::Neox}) {
    for (int n_rot : {64, 24, 6}) {
      std::vector<float> a = make_x(4 * 64, 2), b = a;
      rope(a.data(), 4, 64, n_rot, 37, 10000.0f, 1.0f, style);
      std::vector<float> c(n_rot / 2), s(n_rot / 2);
      rope_table(n_rot, 37, 10000.0f, 1.0f, nullptr, c.data(), s.data());
      rope_apply(b.data(), 4, 64, n_rot, c.data(), s.data(), style);
      EXPECT_TRUE(same_bits(a, b));
      // And against the rotation in double.
      std::vector<float> orig = make_x(4 * 64, 2);
      for (int h = 0; h < 4; ++h)
        for (int i = 0; i < n_rot / 2; ++i) {
          const int i0 = style == RopeStyle::Normal ? 2 * i : i;
          const int i1 = style == RopeStyle::Normal ? 2 * i + 1 : i + n_rot / 2;
          const double th = 37.0 * std::pow(10000.0, -2.0 * i / n_rot);
          const double x0 = orig[h * 64 + i0], x1 = orig[h * 64 + i1];
          EXPECT_NEAR(a[h * 64 + i0], x0 * std::cos(th) - x1 * std::sin(th), 1e-3);
          EXPECT_NEAR(a[h * 64 + i1], x0 * std::sin(th) + x1 * std::cos(th), 1e-3);
        }
    }
  }
}

// Llama 3.1's frequency factors divide each pair's angle (in double: the
// angle over the factor, times the linear scale); factors of one are no
// factors, bit for bit; and all-2 factors are linear scaling by 2 exactly
// (a power of two), which is how the model test checks that the factors
// reach every path.
TEST(Rope, FrequencyFactorsDivideEachPairsAngle) {
  for (int n_rot : {128, 64, 6}) {
    const int half = n_rot / 2;
    std::vector<float> factors(half), ones(half, 1.0f), twos(half, 2.0f);
    for (int i = 0; i < half; ++i) factors[i] = 1.0f + 31.0f * static_cast<float>(i) / half;  // 1 .. 32, as Llama 3.2's
    for (int64_t pos : {0, 1, 37, 5000, 131071}) {
      for (float scale : {1.0f, 0.25f}) {
        std::vector<float> c(half), s(half), c1(half), s1(half), cn(half), sn(half);
        rope_table(n_rot, pos, 500000.0f, scale, factors.data(), c.data(), s.data());
        for (int i = 0; i < half; ++i) {
          const double th = scale * (static_cast<double>(pos) * std::pow(500000.0, -2.0 * i / n_rot) / factors[i]);
          // float angles lose ~pos * 2^-24 radians
          const double tol = 1e-5 + static_cast<double>(pos) * 4e-7;
          EXPECT_NEAR(c[i], std::cos(th), tol) << "pos " << pos << " pair " << i;
          EXPECT_NEAR(s[i], std::sin(th), tol) << "pos " << pos << " pair " << i;
        }
        rope_table(n_rot, pos, 500000.0f, scale, ones.data(), c1.data(), s1.data());
        rope_table(n_rot, pos, 500000.0f, scale, nullptr, cn.data(), sn.data());
        EXPECT_TRUE(same_bits(c1, cn));
        EXPECT_TRUE(same_bits(s1, sn));
        rope_table(n_rot, pos, 500000.0f, scale, twos.data(), c1.data(), s1.data());
        rope_table(n_rot, pos, 500000.0f, scale * 0.5f, nullptr, cn.data(), sn.data());
        EXPECT_TRUE(same_bits(c1, cn));
        EXPECT_TRUE(same_bits(s1, sn));
      }
    }
  }
}

// GELU (gemma's gate) against its tanh form in double, over a range that
// covers both tails, and vector lanes equal to the scalar rule.
TEST(Elementwise, GeluMul) {
  constexpr int n = 4003;
  std::vector<float> g(n), u = make_x(n, 2);
  for (int i = 0; i < n; ++i) g[i] = -12.0f + 24.0f * static_cast<float>(i) / n;
  g[7] = 0.0f;
  g[8] = -0.0f;
  g[9] = 60.0f;
  g[10] = -60.0f;
  std::vector<float> g2 = g;
  gelu_mul(g.data(), u.data(), n);
  for (int i = 0; i < n; ++i) {
    const double x = g2[i];
    const double want = 0.5 * x * (1 + std::tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x))) * u[i];
    EXPECT_NEAR(g[i], want, 1e-6 * (1 + std::fabs(want))) << "x " << x;
    EXPECT_EQ(g[i], gelu_sigmoid(g2[i]) * u[i]) << "vector and scalar gelu differ at " << i;
  }
}

// Softmax (the image encoder's attention, jamba's router) against double
// precision, at lengths around the vector width, with -inf entries.
TEST(Elementwise, Softmax) {
  for (int64_t n : {1, 7, 8, 9, 16, 31, 100, 1025}) {
    std::vector<float> x = make_x(n, 40 + static_cast<uint32_t>(n));
    for (auto& v : x) v *= 8.0f;
    if (n > 3) x[2] = -INFINITY;
    const std::vector<float> in = x;
    softmax_inplace(x.data(), n);
    double mx = -INFINITY, sum = 0;
    for (float v : in) mx = std::max<double>(mx, v);
    for (float v : in) sum += std::exp(static_cast<double>(v) - mx);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (std::isinf(in[i])) {
        EXPECT_EQ(x[i], 0.0f);
        continue;
      }
      const double arg = static_cast<double>(in[i]) - mx;
      const double want = std::exp(arg) / sum;
      // Float: x - max is rounded (relative error up to |x - max| * 2^-24
      // in the result), then a few ulp.
      EXPECT_NEAR(x[i], want, want * (5e-7 + std::fabs(arg) * 0x1p-23) + 1e-30) << "n " << n << " i " << i;
      total += x[i];
    }
    EXPECT_NEAR(total, 1.0, 1e-5) << "n " << n;
  }
}

// silu_mul and gelu_mul on every ISA (AVX-512 takes 16 lanes, the driver 8
// and the scalar tail the rest) give each element the scalar rule's bits:
// values in the fast range and beyond it (the exp's slow lanes), zeros,
// infinities and NaN, at lengths that end in every kind of tail.
TEST(Elementwise, SiluAndGeluMulGiveTheScalarBitsOnEveryIsa) {
  const KernelIsa native = kernel_isa();
  std::vector<float> base = make_x(1000, 11);
  for (size_t i = 0; i < base.size(); ++i) base[i] *= i % 3 == 0 ? 40.0f : 4.0f;
  const float specials[] = {0.0f, -0.0f, 88.0f, -88.0f, 104.0f, -104.0f, 150.0f, -150.0f, 1e30f, -1e30f,
                            INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f};
  for (size_t i = 0; i < std::size(specials); ++i) base[37 * i + 5] = specials[i];
  const std::vector<float> u = make_x(1000, 12);
  auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); };
  for (KernelIsa isa : isas()) {
    set_kernel_isa(isa);
    SCOPED_TRACE(kernel_isa_name(isa));
    for (int64_t n : {1, 7, 8, 15, 16, 17, 23, 24, 31, 32, 33, 1000}) {
      for (int64_t start : {int64_t{0}, int64_t{5}}) {
        if (start + n > static_cast<int64_t>(base.size())) continue;
        std::vector<float> s(base.begin() + start, base.begin() + start + n), gl = s;
        silu_mul(s.data(), u.data(), n);
        gelu_mul(gl.data(), u.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const float x = base[start + i];
          EXPECT_TRUE(same(s[i], silu(x) * u[i])) << "silu n " << n << " i " << i << " x " << x;
          EXPECT_TRUE(same(gl[i], gelu_sigmoid(x) * u[i])) << "gelu n " << n << " i " << i << " x " << x;
        }
      }
    }
  }
  set_kernel_isa(native);
}

TEST(Elementwise, SiluMulAndRmsNorm) {
  std::vector<float> g = make_x(1003, 1), u = make_x(1003, 2), g2 = g;
  silu_mul(g.data(), u.data(), 1003);
  for (size_t i = 0; i < g.size(); ++i) {
    const double s = g2[i] / (1.0 + std::exp(-static_cast<double>(g2[i])));
    EXPECT_NEAR(g[i], s * u[i], 1e-5 * (1 + std::fabs(s * u[i])));
    EXPECT_EQ(g[i], silu(g2[i]) * u[i]) << "vector and scalar silu differ at " << i;
  }
  std::vector<float> x = make_x(515, 3), w = make_x(515, 4), out(515);
  rms_norm(x.data(), w.data(), 1e-5f, 515, out.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double sc = 1.0 / std::sqrt(ss / 515 + 1e-5);
  for (int i = 0; i < 515; ++i) EXPECT_NEAR(out[i], x[i] * sc * w[i], 1e-5 * (1 + std::fabs(x[i] * sc * w[i])));
}

}  // namespace
