#include "tensor/kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "tensor/attention_tiled.h"
#include "tensor/avx2_math.h"
#include "tensor/cpu_topology.h"
#include "tensor/fp16.h"
#include "tensor/huge_pages.h"
#include "tensor/key_layout.h"
#include "tensor/kernels_impl.h"
#include "tensor/prefetch_tuner.h"
#include "tensor/quant_blocks.h"
#include "tensor/quantize.h"
#include "tensor/read_probe.h"
#include "tensor/scratch_allocator.h"
#include "util/error.h"

namespace reprise {

using kernels::IsaKernels;
using kernels::kGroupRows;
using kernels::kTokenTile;
using kernels::takes_tiled_attention;
using kernels::widen_kv_block;
using kernels::GroupLayout;
using kernels::stored_groups;
using kernels::isa_kernels;
using kernels::MatmulArgs;
using kernels::XBlock;
using kernels::kSectionQ4K;
using kernels::kSectionQ5K;
using kernels::kSectionQ6K;
using kernels::avx2::exp8;
using kernels::avx2::exp_scalar;
using kernels::avx2::expf_exact8;
using kernels::avx2::load_h8;
using kernels::avx2::round_h8;
using kernels::avx2::transpose8x8_epi32;

// ---------------------------------------------------------------------------
// Instruction set selection.

namespace {

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

bool cpu_has_avx_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avxvnni");
}

KernelIsa detect_isa() {
  const char* env = std::getenv("REPRISE_ISA");
  if (env && std::string(env) == "avx2") return KernelIsa::Avx2;
  if (env && std::string(env) == "avx2vnni" && cpu_has_avx_vnni()) return KernelIsa::Avx2Vnni;
  if (cpu_has_avx512()) return KernelIsa::Avx512;
  return cpu_has_avx_vnni() ? KernelIsa::Avx2Vnni : KernelIsa::Avx2;
}

std::atomic<int> g_isa{-1};

}  // namespace

const IsaKernels& kernels::isa_kernels() {
  switch (kernel_isa()) {
    case KernelIsa::Avx512: return kernels::avx512_kernels();
    case KernelIsa::Avx2Vnni: return kernels::avx2_vnni_kernels();
    default: return kernels::avx2_kernels();
  }
}

KernelIsa kernel_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(detect_isa());
    g_isa.store(v, std::memory_order_relaxed);
  }
  return static_cast<KernelIsa>(v);
}

bool kernel_isa_supported(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return cpu_has_avx512();
    case KernelIsa::Avx2Vnni: return cpu_has_avx_vnni();
    default: return true;
  }
}

void set_kernel_isa(KernelIsa isa) {
  if (!kernel_isa_supported(isa)) throw Error(std::string("kernel ISA not supported here: ") + kernel_isa_name(isa));
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return "avx512";
    case KernelIsa::Avx2Vnni: return "avx2vnni";
    default: return "avx2";
  }
}

// ---------------------------------------------------------------------------
// Weight packing.

namespace {

size_t group_bytes_for(DType type, int64_t n_in) {
  switch (type) {
    case DType::F32: return static_cast<size_t>(n_in) * kGroupRows * 4;
    case DType::F16:
    case DType::BF16: return static_cast<size_t>(n_in) * kGroupRows * 2;
    case DType::Q8_0: return static_cast<size_t>(n_in / 32) * kernels::kBlockBytes<kernels::QType::Q8_0>;
    case DType::Q4_0: return static_cast<size_t>(n_in / 32) * kernels::kBlockBytes<kernels::QType::Q4_0>;
    case DType::IQ4_NL: return static_cast<size_t>(n_in / 32) * kernels::kBlockBytes<kernels::QType::IQ4NL>;
    case DType::Q4_1: return static_cast<size_t>(n_in / 32) * kernels::kBlockBytes<kernels::QType::Q4_1>;
    case DType::Q5_0: return static_cast<size_t>(n_in / 32) * kernels::kBlockBytes<kernels::QType::Q5_0>;
    case DType::Q5_1: return static_cast<size_t>(n_in / 32) * kernels::kBlockBytes<kernels::QType::Q5_1>;
    case DType::Q2_K: return static_cast<size_t>(n_in / kQK_K) * kernels::kSectionQ2K;
    case DType::Q3_K: return static_cast<size_t>(n_in / kQK_K) * kernels::kSectionQ3K;
    case DType::Q4_K: return static_cast<size_t>(n_in / kQK_K) * kSectionQ4K;
    case DType::Q5_K: return static_cast<size_t>(n_in / kQK_K) * kSectionQ5K;
    case DType::Q6_K: return static_cast<size_t>(n_in / kQK_K) * kSectionQ6K;
    case DType::IQ4_XS: return static_cast<size_t>(n_in / kQK_K) * kernels::kSectionIq4Xs;
    default: throw Error("matmul: unsupported weight type " + dtype_name(static_cast<uint32_t>(type)));
  }
}

// Input elements per unit (kernels_impl.h): one k for the F types, one
// block for the Q types, one section for the K types.
int64_t unit_elements(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return 1;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS: return kQK_K;
    default: return 32;
  }
}

size_t unit_bytes_for(DType type) { return group_bytes_for(type, unit_elements(type)); }

// Which of an IsaKernels setting's per-family values applies to `type`: the
// F types', the 32-element block types' or the K types'.
template <typename T>
T for_family(DType type, T f, T q, T k) {
  switch (unit_elements(type)) {
    case 1: return f;
    case kQK_K: return k;
    default: return q;
  }
}

// 8 rows x 8 16-bit elements -> 8 outputs of the 8 rows' element k.
inline void transpose8x8_epi16(__m128i (&v)[8]) {
  const __m128i a0 = _mm_unpacklo_epi16(v[0], v[1]), a1 = _mm_unpackhi_epi16(v[0], v[1]);
  const __m128i a2 = _mm_unpacklo_epi16(v[2], v[3]), a3 = _mm_unpackhi_epi16(v[2], v[3]);
  const __m128i a4 = _mm_unpacklo_epi16(v[4], v[5]), a5 = _mm_unpackhi_epi16(v[4], v[5]);
  const __m128i a6 = _mm_unpacklo_epi16(v[6], v[7]), a7 = _mm_unpackhi_epi16(v[6], v[7]);
  const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
  const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
  const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
  const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
  v[0] = _mm_unpacklo_epi64(b0, b4);
  v[1] = _mm_unpackhi_epi64(b0, b4);
  v[2] = _mm_unpacklo_epi64(b1, b5);
  v[3] = _mm_unpackhi_epi64(b1, b5);
  v[4] = _mm_unpacklo_epi64(b2, b6);
  v[5] = _mm_unpackhi_epi64(b2, b6);
  v[6] = _mm_unpacklo_epi64(b3, b7);
  v[7] = _mm_unpackhi_epi64(b3, b7);
}

// Full 16-row groups of 16-bit or 32-bit elements, 8 inputs at a time,
// input k's 16 elements at out + k * k_stride elements; returns the first k
// not packed (the caller finishes in scalar code).
int64_t pack_full_group_f(const MatrixView& w, int64_t r0, uint8_t* out, int64_t k_stride) {
  const int64_t k8 = w.n_in / 8 * 8;
  if (w.type == DType::F32) {
    auto* o = reinterpret_cast<uint32_t*>(out);
    for (int64_t k = 0; k < k8; k += 8)
      for (int h = 0; h < 2; ++h) {
        __m256i v[8];
        for (int i = 0; i < 8; ++i)
          v[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.row(r0 + 8 * h + i) + k * 4));
        transpose8x8_epi32(v);
        for (int i = 0; i < 8; ++i)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + (k + i) * k_stride + 8 * h), v[i]);
      }
    return k8;
  }
  auto* o = reinterpret_cast<uint16_t*>(out);
  for (int64_t k = 0; k < k8; k += 8)
    for (int h = 0; h < 2; ++h) {
      __m128i v[8];
      for (int i = 0; i < 8; ++i)
        v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.row(r0 + 8 * h + i) + k * 2));
      transpose8x8_epi16(v);
      for (int i = 0; i < 8; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(o + (k + i) * k_stride + 8 * h), v[i]);
    }
  return k8;
}

// One group of F32/F16/BF16 rows r0 .. r0 + rows - 1 (zeros beyond), input
// k's 16 elements at out + k * k_stride elements (kGroupRows: contiguous;
// more: interleaved with the other groups of a super-group).
void pack_group_f(const MatrixView& w, int64_t r0, int rows, uint8_t* out, int64_t k_stride) {
  const size_t es = w.type == DType::F32 ? 4 : 2;
  int64_t k_done = 0;
  if (rows == kGroupRows) {
    k_done = pack_full_group_f(w, r0, out, k_stride);
  } else {
    for (int64_t k = 0; k < w.n_in; ++k) std::memset(out + k * k_stride * es, 0, kGroupRows * es);
  }
  for (int r = 0; r < rows; ++r) {
    const uint8_t* src = w.row(r0 + r);
    if (es == 4) {
      auto* o = reinterpret_cast<uint32_t*>(out);
      auto* s = reinterpret_cast<const uint32_t*>(src);
      for (int64_t k = k_done; k < w.n_in; ++k) o[k * k_stride + r] = s[k];
    } else {
      auto* o = reinterpret_cast<uint16_t*>(out);
      auto* s = reinterpret_cast<const uint16_t*>(src);
      for (int64_t k = k_done; k < w.n_in; ++k) o[k * k_stride + r] = s[k];
    }
  }
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// One group of Q4_1 / Q5_0 / Q5_1 blocks (kernels_impl.h); rows at or beyond
// `rows` are zero. Load-time work, so plain loops.
void pack_group_q4_1_q5(const MatrixView& w, int64_t r0, int rows, uint8_t* out) {
  const bool has_min = w.type != DType::Q5_0, has_plane = w.type != DType::Q4_1;
  const size_t block = group_bytes_for(w.type, 32), quants = has_min ? 64 : 32;
  const size_t src_block = dtype_row_bytes(w.type, 32);
  std::memset(out, 0, block * (w.n_in / 32));
  for (int64_t b = 0; b < w.n_in / 32; ++b) {
    uint8_t* o = out + b * block;
    for (int r = 0; r < rows; ++r) {
      const uint8_t* blk = w.row(r0 + r) + b * src_block;
      std::memcpy(o + 2 * r, blk, 2);                    // d
      if (has_min) std::memcpy(o + 32 + 2 * r, blk + 2, 2);  // m
      const uint8_t* qs = blk + src_block - 16;
      for (int c = 0; c < 4; ++c) std::memcpy(o + quants + c * 64 + r * 4, qs + 4 * c, 4);
      if (has_plane) {
        uint32_t qh;
        std::memcpy(&qh, qs - 4, 4);
        // Byte e takes bits e, 4 + e, ..., 28 + e of qh (element 4k + e's at bit k).
        for (int e = 0; e < 4; ++e) o[quants + 256 + r * 4 + e] = static_cast<uint8_t>(_pext_u32(qh, 0x11111111u << e));
      }
    }
  }
}

// One group's K-type sections (kernels_impl.h); rows at or beyond `rows` are
// zero (their outputs are never stored). Load-time work, so plain loops.
void pack_group_k(const MatrixView& w, int64_t r0, int rows, uint8_t* out) {
  const int64_t n_sections = w.n_in / kQK_K;
  const size_t section = group_bytes_for(w.type, kQK_K);
  std::memset(out, 0, section * n_sections);
  for (int64_t s = 0; s < n_sections; ++s) {
    uint8_t* o = out + s * section;
    auto* d = reinterpret_cast<float*>(o);
    for (int r = 0; r < rows; ++r) {
      const uint8_t* row = w.row(r0 + r);
      if (w.type == DType::Q6_K) {
        const auto& blk = reinterpret_cast<const BlockQ6_K*>(row)[s];
        d[r] = f16_to_f32(blk.d);
        for (int j = 0; j < 16; ++j) o[64 + j * 16 + r] = static_cast<uint8_t>(blk.scales[j]);
        // ggml: element 128h + 32k + l (sub-block 4h + k, element l) has
        // its low 4 bits in ql[64h + 32(k & 1) + l] (the high nibble when
        // k >= 2) and its high 2 bits at bit 2k of qh[32h + l]. Pair p
        // (sub-blocks 2p, 2p + 1) is h = p / 2, k = 2(p % 2) + odd. Four
        // elements at a time, as 32-bit words of bytes (the shifts move
        // bits within each byte; what crosses a byte is masked off).
        constexpr uint32_t kTwoBits = 0x03030303u;
        for (int p = 0; p < 4; ++p) {
          const int shift = 4 * (p % 2);
          const uint8_t* ql = blk.ql + 64 * (p / 2);
          const uint8_t* qh = blk.qh + 32 * (p / 2);
          auto u_word = [&](bool odd, int l) {
            return ((load_u32(ql + (odd ? 32 : 0) + l) >> shift) & 0x0f0f0f0fu) |
                   (((load_u32(qh + l) >> (shift + (odd ? 2 : 0))) & kTwoBits) << 4);
          };
          for (int q = 0; q < 4; ++q) {
            const uint32_t odd_hi = u_word(true, 16 + 4 * q);
            const uint32_t lines[3] = {u_word(false, 4 * q) | (odd_hi & kTwoBits) << 6,
                                       u_word(false, 16 + 4 * q) | ((odd_hi >> 2) & kTwoBits) << 6,
                                       u_word(true, 4 * q) | ((odd_hi >> 4) & kTwoBits) << 6};
            for (int l = 0; l < 3; ++l) std::memcpy(o + kernels::q6k_line_at(p, q, l) + r * 4, &lines[l], 4);
          }
        }
        continue;
      }
      // Q4_K and Q5_K share the block head and the nibble layout.
      const uint8_t* head = row + s * dtype_row_bytes(w.type, kQK_K);
      uint16_t dh, dminh;
      std::memcpy(&dh, head, 2);
      std::memcpy(&dminh, head + 2, 2);
      d[r] = f16_to_f32(dh);
      d[16 + r] = f16_to_f32(dminh);
      for (int j = 0; j < 8; ++j) k_scale_min(j, head + 4, &o[kernels::kQ4KScales + j * 16 + r],
                                                  &o[kernels::kQ4KMins + (j / 2) * 32 + 2 * r + j % 2]);
      const uint8_t* qs = w.type == DType::Q4_K ? reinterpret_cast<const BlockQ4_K*>(head)->qs
                                                : reinterpret_cast<const BlockQ5_K*>(head)->qs;
      if (w.type == DType::Q4_K) {
        for (int p = 0; p < 4; ++p)
          for (int c = 0; c < 8; ++c)
            std::memcpy(o + kernels::kQ4KNibbles + p * 512 + c * 64 + r * 4, qs + 32 * p + 4 * c, 4);
        continue;
      }
      // Q5_K: element l of sub-block j has its low 4 bits in the low (j
      // even) or high nibble of qs[32(j / 2) + l], its fifth bit at bit j
      // of qh[l]. Four elements at a time, as 32-bit words of bytes.
      const uint8_t* qh = reinterpret_cast<const BlockQ5_K*>(head)->qh;
      for (int j = 0; j < 8; ++j) {
        uint32_t u[8];
        for (int c = 0; c < 8; ++c)
          u[c] = ((load_u32(qs + 32 * (j / 2) + 4 * c) >> (4 * (j % 2))) & 0x0f0f0f0fu) |
                 (((load_u32(qh + 4 * c) >> j) & 0x01010101u) << 4);
        const uint32_t lines[5] = {
            u[0] | (u[5] & 0x07070707u) << 5,
            u[1] | ((u[5] >> 3) & 0x03030303u) << 5 | ((u[7] >> 3) & 0x01010101u) << 7,
            u[2] | (u[6] & 0x07070707u) << 5,
            u[3] | ((u[6] >> 3) & 0x03030303u) << 5 | ((u[7] >> 4) & 0x01010101u) << 7,
            u[4] | (u[7] & 0x07070707u) << 5};
        for (int l = 0; l < 5; ++l) std::memcpy(o + kernels::q5k_line_at(j, l) + r * 4, &lines[l], 4);
      }
    }
  }
}

// One group's sections of `section` bytes per 256 elements, zeroed, then
// write_row(block, section bytes, r) for each of its rows' super-blocks;
// rows at or beyond `rows` stay zero. Load-time work, so plain loops.
template <typename Block, typename WriteRow>
void pack_group_sections(const MatrixView& w, int64_t r0, int rows, size_t section, uint8_t* out,
                         WriteRow write_row) {
  const int64_t n_sections = w.n_in / kQK_K;
  std::memset(out, 0, section * n_sections);
  for (int64_t s = 0; s < n_sections; ++s)
    for (int r = 0; r < rows; ++r) write_row(reinterpret_cast<const Block*>(w.row(r0 + r))[s], out + s * section, r);
}

// One group's Q2_K sections (kernels_impl.h).
void pack_group_q2_k(const MatrixView& w, int64_t r0, int rows, uint8_t* out) {
  pack_group_sections<BlockQ2_K>(w, r0, rows, kernels::kSectionQ2K, out, [](const BlockQ2_K& blk, uint8_t* o, int r) {
    auto* d = reinterpret_cast<float*>(o);
    d[r] = f16_to_f32(blk.d);
    d[16 + r] = f16_to_f32(blk.dmin);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) {
      o[kernels::q2k_scales_at(k) + r] = blk.scales[k] & 0x0f;
      o[kernels::kQ2KMins + (k / 2) * 32 + 2 * r + k % 2] = blk.scales[k] >> 4;
    }
    for (int quad = 0; quad < 4; ++quad)
      for (int c = 0; c < 4; ++c)
        std::memcpy(o + kernels::q2k_line_at(quad, c) + r * 4, blk.qs + 16 * quad + 4 * c, 4);
  });
}

// One group's Q3_K sections (kernels_impl.h).
void pack_group_q3_k(const MatrixView& w, int64_t r0, int rows, uint8_t* out) {
  pack_group_sections<BlockQ3_K>(w, r0, rows, kernels::kSectionQ3K, out, [](const BlockQ3_K& blk, uint8_t* o, int r) {
    reinterpret_cast<float*>(o)[r] = f16_to_f32(blk.d);
    for (int k = 0; k < 16; ++k) o[kernels::kQ3KScales + k * 16 + r] = static_cast<uint8_t>(q3_k_scale(blk, k));
    // Sub-block k = 8h + 2j + l: element 4c + i's low bits are bits 2j..2j+1
    // of qs[32h + 16l + 4c + i], its high bit (u = q + 4 = low + 4 high) bit
    // 4h + j of hmask[16l + 4c + i]. Four elements at a time, as 32-bit
    // words of bytes (the shifts move bits within each byte; what crosses a
    // byte is masked off); each qs and hmask word serves four sub-blocks.
    uint32_t u[16][4];
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 2; ++l)
        for (int c = 0; c < 4; ++c) {
          const uint32_t q = load_u32(blk.qs + 32 * h + 16 * l + 4 * c);
          const uint32_t m = load_u32(blk.hmask + 16 * l + 4 * c) >> (4 * h);
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j)
            u[8 * h + 2 * j + l][c] = ((q >> (2 * j)) & 0x03030303u) | ((m >> j) & 0x01010101u) << 2;
        }
#pragma GCC unroll 8
    for (int m = 0; m < 8; ++m) {
      const uint32_t(&ux)[4] = u[2 * m];
      const uint32_t(&uy)[4] = u[2 * m + 1];
      const uint32_t lines[3] = {
          ux[0] | uy[0] << 3 | (ux[3] & 0x03030303u) << 6,
          ux[1] | uy[1] << 3 | ((ux[3] >> 2) & 0x01010101u) << 6 | (uy[3] & 0x01010101u) << 7,
          ux[2] | uy[2] << 3 | ((uy[3] >> 1) & 0x03030303u) << 6};
      for (int l = 0; l < 3; ++l) std::memcpy(o + kernels::q3k_line_at(m, l) + r * 4, &lines[l], 4);
    }
  });
}

// One group's IQ4_XS sections (kernels_impl.h).
void pack_group_iq4_xs(const MatrixView& w, int64_t r0, int rows, uint8_t* out) {
  pack_group_sections<BlockIQ4_XS>(w, r0, rows, kernels::kSectionIq4Xs, out,
                                   [](const BlockIQ4_XS& blk, uint8_t* o, int r) {
                                     reinterpret_cast<float*>(o)[r] = f16_to_f32(blk.d);
                                     for (int j = 0; j < 8; ++j) {
                                       o[kernels::kIq4XsScales + j * 16 + r] =
                                           static_cast<uint8_t>(iq4_xs_scale(blk, j));
                                       for (int c = 0; c < 4; ++c)
                                         std::memcpy(o + kernels::kIq4XsNibbles + j * 256 + c * 64 + r * 4,
                                                     blk.qs + 16 * j + 4 * c, 4);
                                     }
                                   });
}

// Writes groups [g0, g1) of w in the packed layout to dst (g1 - g0 groups).
void pack_groups(const MatrixView& w, int64_t g0, int64_t g1, uint8_t* dst) {
  const size_t gb = group_bytes_for(w.type, w.n_in);
  for (int64_t g = g0; g < g1; ++g) {
    uint8_t* out = dst + (g - g0) * gb;
    const int64_t r0 = g * kGroupRows;
    const int rows = static_cast<int>(std::min<int64_t>(kGroupRows, w.n_out - r0));
    switch (w.type) {
      case DType::F32:
      case DType::F16:
      case DType::BF16:
        pack_group_f(w, r0, rows, out, kGroupRows);
        break;
      case DType::Q8_0: {
        const int64_t nb = w.n_in / kQK8_0;
        if (rows == kGroupRows) {
          // 16 rows x 8 dword chunks per block: two 8x8 dword transposes.
          const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
          for (int64_t b = 0; b < nb; ++b) {
            uint8_t* ob = out + b * 544;
            auto* d = reinterpret_cast<uint16_t*>(ob);
            for (int h = 0; h < 2; ++h) {
              __m256i v[8];
              for (int i = 0; i < 8; ++i) {
                const auto& blk = reinterpret_cast<const BlockQ8_0*>(w.row(r0 + 8 * h + i))[b];
                d[8 * h + i] = blk.d;
                v[i] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs)), bias);
              }
              transpose8x8_epi32(v);
              for (int c = 0; c < 8; ++c)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(ob + 32 + c * 64 + h * 32), v[c]);
            }
          }
          break;
        }
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t* ob = out + b * 544;
          auto* d = reinterpret_cast<uint16_t*>(ob);
          for (int r = 0; r < kGroupRows; ++r) {
            if (r < rows) {
              const auto& blk = reinterpret_cast<const BlockQ8_0*>(w.row(r0 + r))[b];
              d[r] = blk.d;
              for (int c = 0; c < 8; ++c)
                for (int j = 0; j < 4; ++j)
                  ob[32 + c * 64 + r * 4 + j] = static_cast<uint8_t>(blk.qs[4 * c + j]) ^ 0x80;
            } else {
              d[r] = 0;
              for (int c = 0; c < 8; ++c) std::memset(ob + 32 + c * 64 + r * 4, 0x80, 4);
            }
          }
        }
        break;
      }
      case DType::Q4_0:
      case DType::IQ4_NL: {
        // The same block layout (d, then nibbles in the same order).
        static_assert(sizeof(BlockIQ4_NL) == sizeof(BlockQ4_0));
        const int64_t nb = w.n_in / kQK4_0;
        if (rows == kGroupRows) {
          // 16 rows x 4 dword chunks per block: four 4x4 dword transposes.
          for (int64_t b = 0; b < nb; ++b) {
            uint8_t* ob = out + b * 288;
            auto* d = reinterpret_cast<uint16_t*>(ob);
            for (int q = 0; q < 4; ++q) {
              __m128 v[4];
              for (int i = 0; i < 4; ++i) {
                const auto& blk = reinterpret_cast<const BlockQ4_0*>(w.row(r0 + 4 * q + i))[b];
                d[4 * q + i] = blk.d;
                v[i] = _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs)));
              }
              _MM_TRANSPOSE4_PS(v[0], v[1], v[2], v[3]);
              for (int c = 0; c < 4; ++c)
                _mm_storeu_si128(reinterpret_cast<__m128i*>(ob + 32 + c * 64 + q * 16), _mm_castps_si128(v[c]));
            }
          }
          break;
        }
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t* ob = out + b * 288;
          auto* d = reinterpret_cast<uint16_t*>(ob);
          for (int r = 0; r < kGroupRows; ++r) {
            if (r < rows) {
              const auto& blk = reinterpret_cast<const BlockQ4_0*>(w.row(r0 + r))[b];
              d[r] = blk.d;
              for (int c = 0; c < 4; ++c) std::memcpy(ob + 32 + c * 64 + r * 4, blk.qs + 4 * c, 4);
            } else {
              d[r] = 0;
              for (int c = 0; c < 4; ++c) std::memset(ob + 32 + c * 64 + r * 4, 0x88, 4);
            }
          }
        }
        break;
      }
      case DType::Q4_1:
      case DType::Q5_0:
      case DType::Q5_1:
        pack_group_q4_1_q5(w, r0, rows, out);
        break;
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q6_K:
        pack_group_k(w, r0, rows, out);
        break;
      case DType::IQ4_XS:
        pack_group_iq4_xs(w, r0, rows, out);
        break;
      case DType::Q2_K:
        pack_group_q2_k(w, r0, rows, out);
        break;
      case DType::Q3_K:
        pack_group_q3_k(w, r0, rows, out);
        break;
      default:
        throw Error("matmul: unsupported weight type " + dtype_name(static_cast<uint32_t>(w.type)));
    }
  }
}

}  // namespace

namespace {

// Packs groups [g0, g1) of w into their places in the interleaved layout
// at dst (all n_groups of them, super-groups of f; g0 a multiple of f):
// each super-group is packed contiguously, then spread unit by unit.
void pack_interleaved(const MatrixView& w, int64_t g0, int64_t g1, int64_t n_groups, int f, uint8_t* dst) {
  const size_t gb = group_bytes_for(w.type, w.n_in), ub = unit_bytes_for(w.type);
  const int64_t n_units = w.n_in / unit_elements(w.type);
  if (f == 1) return pack_groups(w, g0, g1, dst + g0 * gb);
  if (unit_elements(w.type) == 1) {  // the F types
    // Straight into place: a unit is one k, too small to copy one by one.
    for (int64_t first = g0; first < g1; first += f) {
      const int64_t in_super = std::min<int64_t>(f, n_groups - first);
      for (int64_t j = 0; j < in_super; ++j) {
        const int64_t r0 = (first + j) * kGroupRows;
        const int rows = static_cast<int>(std::min<int64_t>(kGroupRows, w.n_out - r0));
        pack_group_f(w, r0, rows, dst + first * gb + j * ub, in_super * kGroupRows);
      }
    }
    return;
  }
  std::vector<uint8_t> contiguous(f * gb);
  for (int64_t first = g0; first < g1; first += f) {
    const int64_t in_super = std::min<int64_t>(f, n_groups - first);
    pack_groups(w, first, first + in_super, contiguous.data());
    uint8_t* out = dst + first * gb;
    for (int64_t u = 0; u < n_units; ++u)
      for (int64_t j = 0; j < in_super; ++j)
        std::memcpy(out + (u * in_super + j) * ub, contiguous.data() + j * gb + u * ub, ub);
  }
}

// Packs all groups of w to dst on up to one thread per core, in pieces of at
// least 4 MiB (whole super-groups): a multi-gigabyte model's repacking (and
// the first touch of its pages, which the kernel zeroes) is otherwise
// seconds of one core's work at load. The pieces are disjoint, so the bytes
// do not depend on the split.
// Groups [g0, g1) of w, each to its place among `regions` regions
// (kernels_impl.h).
void pack_to_regions(const MatrixView& w, int64_t g0, int64_t g1, int64_t n_groups, int regions, uint8_t* dst) {
  const size_t gb = group_bytes_for(w.type, w.n_in);
  const int64_t region_groups = stored_groups(n_groups, regions) / regions;
  for (int64_t g = g0; g < g1; ++g) pack_groups(w, g, g + 1, dst + ((g % regions) * region_groups + g / regions) * gb);
}

void pack_all_groups(const MatrixView& w, int64_t n_groups, size_t group_bytes, int f, int regions, uint8_t* dst) {
  static const int cores = default_thread_count();
  const int64_t n_supers = (n_groups + f - 1) / f;
  const int64_t min_supers = std::max<int64_t>(1, static_cast<int64_t>((size_t{4} << 20) / (group_bytes * f)));
  const int n = static_cast<int>(std::clamp<int64_t>(n_supers / min_supers, 1, cores));
  auto piece_range = [&](int i, int64_t* g0, int64_t* g1) {
    *g0 = std::min(n_groups, n_supers * i / n * f);
    *g1 = std::min(n_groups, n_supers * (i + 1) / n * f);
  };
  // Pieces are whole super-groups (any groups, for regions).
  auto pack_piece = [&](int64_t g0, int64_t g1) {
    if (regions > 1) pack_to_regions(w, g0, g1, n_groups, regions, dst);
    else pack_interleaved(w, g0, g1, n_groups, f, dst);
  };
  if (n == 1) return pack_piece(0, n_groups);
  std::vector<std::exception_ptr> errors(n);
  {
    std::vector<std::jthread> threads;
    auto piece = [&](int i) {
      try {
        int64_t g0, g1;
        piece_range(i, &g0, &g1);
        pack_piece(g0, g1);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    };
    for (int i = 1; i < n; ++i) threads.emplace_back(piece, i);
    piece(0);
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

namespace {
int default_regions(DType type, int64_t n_in, int64_t n_out);
}  // namespace

size_t packed_matrix_bytes(DType type, int64_t n_in, int64_t n_out) {
  // As PackedMatrix's default layout stores them: dealt to regions, the last
  // regions padded to whole.
  const int64_t n_groups = (n_out + kGroupRows - 1) / kGroupRows;
  return group_bytes_for(type, n_in) * static_cast<size_t>(stored_groups(n_groups, default_regions(type, n_in, n_out)));
}

namespace {

const char* interleave_env() { return std::getenv("REPRISE_INTERLEAVE"); }

// Q3_K runs Q6_K's rule: it takes Q6_K's layout (IsaKernels::regions_q6_k,
// interleave_q6_k) and, for prompts, its widened kernel.
bool runs_q6k_rule(DType t) { return t == DType::Q6_K || t == DType::Q3_K; }

// F matrices above this size take IsaKernels::regions_f_long. Between the
// 60M models' largest layer matrix (1.6 MB in F16) and the 534 MB model's
// feed-forward ones (8 MB), where the two settings measured apart.
constexpr int64_t kLongMatrixBytes = int64_t{4} << 20;

// The current ISA's regions for this type and shape (IsaKernels::regions_*;
// 0: the interleaved layout), or REPRISE_REGIONS (0: none; for
// comparisons). REPRISE_INTERLEAVE, which picks an interleaved layout,
// implies none.
int default_regions(DType type, int64_t n_in, int64_t n_out) {
  static const char* const env = std::getenv("REPRISE_REGIONS");
  if (env) return std::clamp(std::atoi(env), 0, 64);
  if (interleave_env()) return 0;
  const IsaKernels& isa = isa_kernels();
  if (runs_q6k_rule(type)) return isa.regions_q6_k;
  if (type == DType::Q8_0) return isa.regions_q8_0;
  const int64_t bytes = static_cast<int64_t>(group_bytes_for(type, n_in)) * ((n_out + kGroupRows - 1) / kGroupRows);
  const int regions_f = bytes > kLongMatrixBytes ? isa.regions_f_long : isa.regions_f;
  return for_family(type, regions_f, isa.regions_q, isa.regions_k);
}

// The current ISA's super-group for this type (IsaKernels::interleave_*),
// or REPRISE_INTERLEAVE (1: the contiguous layout; for comparisons on
// other CPUs).
int default_interleave(DType type) {
  static const int env = [] {
    const char* v = interleave_env();
    return v ? std::clamp(std::atoi(v), 1, 64) : 0;
  }();
  if (env > 0) return env;
  const IsaKernels& isa = isa_kernels();
  if (runs_q6k_rule(type)) return isa.interleave_q6_k;
  return for_family(type, isa.interleave_f, isa.interleave_q, isa.interleave_k);
}

}  // namespace

PackedMatrix::PackedMatrix(const MatrixView& w, int interleave, int regions) : view_(w) {
  group_bytes_ = group_bytes_for(w.type, w.n_in);
  n_groups_ = (w.n_out + kGroupRows - 1) / kGroupRows;
  if (interleave < 0 || regions < 0) throw Error("PackedMatrix: negative interleave or regions");
  if (regions > 1 && interleave > 1) throw Error("PackedMatrix: regions take contiguous groups (interleave 1)");
  regions_ = regions > 1 ? regions : interleave == 0 ? default_regions(w.type, w.n_in, w.n_out) : 0;
  interleave_ = regions_ > 1 ? 1 : interleave > 0 ? interleave : default_interleave(w.type);
  stored_groups_ = stored_groups(n_groups_, regions_);
  // Decode streams these once per token: huge pages (huge_pages.h). Padding
  // groups of the last regions stay zero.
  data_ = allocate_streamed(group_bytes_ * stored_groups_);
  pack_all_groups(w, n_groups_, group_bytes_, interleave_, regions_, data_.get());
}

// ---------------------------------------------------------------------------
// Activations.

namespace {

// Q8: Q8_0 blocks of 32; Q8K: Q8_K sections of 256 (the K types).
enum class ActKind { F32, F16, BF16, Q8, Q8K };
constexpr int kActKinds = 5;

ActKind act_kind(DType t) {
  switch (t) {
    case DType::F32: return ActKind::F32;
    case DType::F16: return ActKind::F16;
    case DType::BF16: return ActKind::BF16;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::IQ4_NL: return ActKind::Q8;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS: return ActKind::Q8K;
    default: throw Error("matmul: unsupported weight type " + dtype_name(static_cast<uint32_t>(t)));
  }
}

inline __m256 round_bf16(__m256 x) {
  // Round to nearest even on the upper 16 bits; NaN made quiet (as ggml).
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i nan = _mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xffff0000u))),
                                      _mm256_set1_epi32(64 << 16));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(r, nan, is_nan));
}

float round_bf16_scalar(float f) { return bf16_to_f32(f32_to_bf16(f)); }

void convert_row(ActKind kind, const float* x, int64_t n, void* out) {
  switch (kind) {
    case ActKind::F16: {
      auto* o = static_cast<float*>(out);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
      for (; i < n; ++i) o[i] = f16_to_f32(f32_to_f16(x[i]));
      return;
    }
    case ActKind::BF16: {
      auto* o = static_cast<float*>(out);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, round_bf16(_mm256_loadu_ps(x + i)));
      for (; i < n; ++i) o[i] = round_bf16_scalar(x[i]);
      return;
    }
    case ActKind::Q8: {
      auto* o = static_cast<XBlock*>(out);
      isa_kernels().quantize_q8(x, n / kQK8_0, o, 1);
      return;
    }
    case ActKind::Q8K:
      isa_kernels().quantize_q8_k(x, n / kQK_K, static_cast<XBlock*>(out), 1);
      return;
    case ActKind::F32:
      std::memcpy(out, x, n * sizeof(float));
      return;
  }
}

// `bytes` bytes of v, 64-byte aligned (v grows to hold them).
uint8_t* aligned_scratch(ScratchVector<uint8_t>& v, size_t bytes) {
  if (v.size() < bytes + 64) v.resize(bytes + 64);
  auto p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t(63));
}

struct ActBuffer {
  ScratchVector<uint8_t> bytes;
  void* ensure(size_t n) { return aligned_scratch(bytes, n); }
};

// One per activation kind, per pool (ThreadPool::caller_local).
struct ActBuffers {
  ActBuffer kinds[kActKinds];
};

// Activations converted to the weight's dot type, in the token-tiled layout
// of kernels_impl.h.
struct PackedX {
  const void* data = nullptr;
  int64_t tile = 0;  // tokens per tile
  int64_t k = 0;     // elements per token (floats, or blocks)
};

PackedX pack_activations(ActKind kind, const float* x, int64_t n_in, int64_t n_tokens, ActBuffer& buf,
                         ThreadPool& pool) {
  PackedX px;
  px.tile = std::min<int64_t>(kTokenTile, n_tokens);
  const bool blocks = kind == ActKind::Q8 || kind == ActKind::Q8K;
  px.k = blocks ? n_in / kQK8_0 : n_in;
  const size_t elem = blocks ? sizeof(XBlock) : sizeof(float);
  const int64_t n_tiles = (n_tokens + px.tile - 1) / px.tile;
  auto* out = static_cast<uint8_t*>(buf.ensure(elem * px.k * px.tile * n_tiles));
  px.data = out;
  const IsaKernels& isa = isa_kernels();
  auto run = [&](int64_t tile) {
    const int64_t t0 = tile * px.tile, t1 = std::min(n_tokens, t0 + px.tile);
    const int nt = static_cast<int>(t1 - t0);
    uint8_t* base = out + tile * px.tile * px.k * elem;
    if (px.tile == 1) {
      convert_row(kind, x + t0 * n_in, n_in, base);
      return;
    }
    if (blocks) {
      auto* dst = reinterpret_cast<XBlock*>(base);
      if (nt < px.tile) std::memset(base, 0, px.tile * px.k * elem);
      for (int64_t j = 0; j < nt; ++j) {
        const float* row = x + (t0 + j) * n_in;
        if (kind == ActKind::Q8K) isa.quantize_q8_k(row, n_in / kQK_K, dst + j, px.tile);
        else isa.quantize_q8(row, px.k, dst + j, px.tile);
      }
      return;
    }
    auto* dst = reinterpret_cast<float*>(base);
    if (isa.pack_f_tile) {
      const int round = kind == ActKind::F16 ? 1 : kind == ActKind::BF16 ? 2 : 0;
      isa.pack_f_tile(x + t0 * n_in, n_in, nt, static_cast<int>(px.tile), round, dst);
      return;
    }
    thread_local std::vector<float> row;
    row.resize(n_in);
    if (nt < px.tile) std::memset(base, 0, px.tile * px.k * elem);
    for (int64_t j = 0; j < nt; ++j) {
      convert_row(kind, x + (t0 + j) * n_in, n_in, row.data());
      for (int64_t k = 0; k < n_in; ++k) dst[k * px.tile + j] = row[k];
    }
  };
  if (n_tiles > 1 && pool.size() > 1) pool.parallel_for(n_tiles, run);
  else for (int64_t i = 0; i < n_tiles; ++i) run(i);
  return px;
}

using MatmulFn = void (*)(const MatmulArgs&);
MatmulFn matmul_fn(const IsaKernels& k, DType t) {
  switch (t) {
    case DType::F32: return k.matmul_f32;
    case DType::F16: return k.matmul_f16;
    case DType::BF16: return k.matmul_bf16;
    case DType::Q8_0: return k.matmul_q8_0;
    case DType::Q4_0: return k.matmul_q4_0;
    case DType::Q4_1: return k.matmul_q4_1;
    case DType::Q5_0: return k.matmul_q5_0;
    case DType::Q5_1: return k.matmul_q5_1;
    case DType::Q2_K: return k.matmul_q2_k;
    case DType::Q3_K: return k.matmul_q3_k;
    case DType::Q4_K: return k.matmul_q4_k;
    case DType::Q5_K: return k.matmul_q5_k;
    case DType::Q6_K: return k.matmul_q6_k;
    case DType::IQ4_NL: return k.matmul_iq4_nl;
    case DType::IQ4_XS: return k.matmul_iq4_xs;
    default: throw Error("matmul: unsupported weight type");
  }
}

// One matrix of a (possibly multi-matrix) product.
struct Job {
  MatmulFn fn;
  MatmulFn fn_wide;    // the kernel for widened groups
  size_t wide_unit;    // a widened unit's bytes; 0: tasks do not widen
  int64_t k_block;     // 0: all of n_in at once
  GroupLayout groups;  // the packed groups (base null: packed on the fly from view)
  const MatrixView* view;
  int64_t n_out;
  PackedX x;
  float* y;
  // Prompt-sized products' tasks (decode-sized ones are split by
  // run_decode): the groups are dealt to the n_group_tasks tasks evenly, in
  // tiles of this many (a task's share is a whole number of tiles).
  int64_t task_tile;
  int64_t tokens_per_task;
  int64_t n_group_tasks;
  int64_t n_token_tasks;
  int64_t first_task;
  int64_t prefetch;  // decode tiles' software-prefetch distance (MatmulArgs::prefetch)
};

thread_local ScratchVector<uint8_t> t_pack_scratch, t_widen_scratch;

// Calls of fewer tokens than this (the engine's prompt chunks are 512 by
// default) are split as decode splits them (run_decode: a contiguous range
// of 8-group tiles per thread, claimed in halves, the rest stolen from the
// back), and each tile is covered for all the call's tokens a few groups at
// a time (run_job_range), rather than in prompt tasks of 8 groups x 48
// tokens dealt one by one. Each weight is then read from memory once per
// call, by a thread whose tiles follow one another in memory (one stream
// that the hardware prefetcher follows, where dealt tasks jump), and
// widened once. Paired (session 32, 60M, AVX-512): against dealt tasks, 12
// sequences decoding together Q8_0 1.09x, Q4_K 1.14x; pp16 1.05-1.16x;
// pp64 1.02-1.13x, pp512 1.00-1.09x (Q6_K, F16), pp1024 1.00-1.10x; the 284
// MB Q8_0 model pp128 1.20x. Larger calls keep the tasks: a chunk's pass
// over all tokens would read their activations from beyond L3 (8192 tokens
// at n_in 4096: 33 MB), where a task's 48 tokens stay in L1.
constexpr int64_t kStreamedTokens = 1025;

// Groups a streamed call's kernel call covers at once (see run_job_range):
// up to 8, within ~512 KiB of weights (well inside L2), in multiples of 4
// (the widest small-batch tile).
int64_t small_batch_groups(size_t group_bytes) {
  const int64_t fit = static_cast<int64_t>((size_t{512} << 10) / group_bytes) / 4 * 4;
  return std::clamp<int64_t>(fit, 4, 8);
}

inline __m256 load_h8_any(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A task's groups [g0, g0 + n) of src widened (F16/BF16 to f32, Q6_K/Q3_K
// sections to Q6_K wide) into dst as one interleaved super-group of n: the
// values the packed kernels unpack on the fly, so the same bits.
void widen_task_groups(DType type, const GroupLayout& src, int64_t g0, int64_t n, int64_t n_units, size_t wide_unit,
                       uint8_t* dst) {
  constexpr int64_t kMaxGroups = 16;
  if (n > kMaxGroups) throw Error("widen_task_groups: too many groups");
  const uint8_t* in[kMaxGroups];
  size_t stride[kMaxGroups];
  for (int64_t j = 0; j < n; ++j) in[j] = src.group(g0 + j, &stride[j]);
  const size_t unit_bytes = src.unit_bytes;
  for (int64_t u = 0; u < n_units; ++u) {
    // The source is read once, in rows of n units (interleaved) or n
    // streams: prefetch ~2 KiB ahead in each.
    const int64_t ahead = u + std::max<int64_t>(1, 2048 / static_cast<int64_t>(unit_bytes * n));
    if (ahead < n_units)
      for (int64_t j = 0; j < n; ++j)
        for (size_t off = 0; off < unit_bytes; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(in[j] + ahead * stride[j] + off), _MM_HINT_T0);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* unit = in[j] + u * stride[j];
      uint8_t* out = dst + (u * n + j) * wide_unit;
      switch (type) {
        case DType::Q6_K: kernels::widen_q6_k_sections(unit, 1, out); break;
        case DType::Q3_K: kernels::widen_q3_k_sections(unit, 1, out); break;
        case DType::F16:
          for (int h = 0; h < 2; ++h)
            _mm256_store_ps(reinterpret_cast<float*>(out) + 8 * h,
                            load_h8_any(reinterpret_cast<const uint16_t*>(unit) + 8 * h));
          break;
        default:  // BF16: the upper halves of f32
          for (int h = 0; h < 2; ++h) {
            const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(unit) + h));
            _mm256_store_ps(reinterpret_cast<float*>(out) + 8 * h, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
          }
      }
    }
  }
}

// Units (k steps, blocks or sections) in one of job j's groups.
int64_t units_per_group(const Job& j, int64_t n_in) { return n_in / unit_elements(j.view->type); }

// Groups [g0, g1) of job j for tokens [t0, t1), in one kernel call per k
// block (packed on the fly, or widened, first when the job asks for it).
void run_job_part(const Job& j, int64_t n_tokens, int64_t n_in, int64_t g0, int64_t g1, int64_t t0, int64_t t1) {
  const int64_t n_groups = g1 - g0;
  // The part's groups are `first`.. of `layout`.
  GroupLayout layout = j.groups;
  int64_t first = g0;
  if (!layout.base) {
    uint8_t* packed = aligned_scratch(t_pack_scratch, n_groups * layout.group_bytes);
    pack_groups(*j.view, g0, g1, packed);
    layout = {packed, layout.group_bytes, layout.unit_bytes, n_groups, 1};
    first = 0;
  }
  MatmulFn fn = j.fn;
  if (j.wide_unit > 0) {
    // Same values, same operations as the packed kernels: identical bits,
    // without a conversion or unpacking per weight per token tile.
    const int64_t n_units = units_per_group(j, n_in);
    uint8_t* wide = aligned_scratch(t_widen_scratch, n_groups * n_units * j.wide_unit);
    widen_task_groups(j.view->type, layout, first, n_groups, n_units, j.wide_unit, wide);
    layout = {wide, n_units * j.wide_unit, j.wide_unit, n_groups, n_groups};
    first = 0;
    fn = j.fn_wide;
  }
  MatmulArgs a;
  a.x = j.x.data;
  a.x_tile = j.x.tile;
  a.x_k = j.x.k;
  a.t0 = t0;
  a.n_tokens = t1 - t0;
  a.n_in = n_in;
  a.y_stride = j.n_out;
  a.prefetch = j.prefetch;
  // Widened groups are in cache already. The F types' decode-sized batches
  // read their weights as fast without (8 sequences, 60M F16: 0.97x with).
  a.prefetch_next = fn == j.fn && (n_tokens >= kTokenTile || for_family(j.view->type, false, true, true));
  // k blocks keep a task's weight panel and token tile in L1 together.
  const int64_t kb = j.k_block > 0 ? j.k_block : n_in;
  a.layout = layout;
  a.g_first = first;
  a.n_groups = n_groups;
  a.n_rows = j.n_out - g0 * kGroupRows;
  a.y = j.y + t0 * j.n_out + g0 * kGroupRows;
  for (int64_t k0 = 0; k0 < n_in; k0 += kb) {
    a.k_begin = k0;
    a.k_end = std::min(n_in, k0 + kb);
    fn(a);
  }
}

// Groups [g0, g1) of job j for tokens [t0, t1). A streamed call's kernel
// covers all its tokens in several passes over the groups it is given (one
// per token tile): hand it a few groups at a time (small_batch_groups, by
// their widened size where they are widened), so the later passes find the
// weights in L2 instead of reading a thread's (megabytes of) weights from
// memory again. Each output is computed as before.
void run_job_range(const Job& j, int64_t n_tokens, int64_t n_in, int64_t g0, int64_t g1, int64_t t0, int64_t t1) {
  int64_t chunk = g1 - g0;
  if (n_tokens > 1 && n_tokens < kStreamedTokens) {
    const size_t bytes =
        j.wide_unit > 0 ? static_cast<size_t>(units_per_group(j, n_in)) * j.wide_unit : j.groups.group_bytes;
    chunk = small_batch_groups(bytes);
    // Q8_0's small batches read whole region rows (run_tiles_rows, AVX-512)
    // in one pass, so chunks of them lose nothing to a second pass.
    if (j.view->type == DType::Q8_0 && j.groups.regions > 1)
      chunk = (chunk + j.groups.regions - 1) / j.groups.regions * j.groups.regions;
  }
  for (int64_t c = g0; c < g1; c += chunk) run_job_part(j, n_tokens, n_in, c, std::min(g1, c + chunk), t0, t1);
}

void run_job_task(const Job& j, int64_t n_tokens, int64_t n_in, int64_t task) {
  const int64_t gt = task % j.n_group_tasks, tt = task / j.n_group_tasks;
  const int64_t n_tiles = (j.groups.n_groups + j.task_tile - 1) / j.task_tile;
  const int64_t g0 = std::min(j.groups.n_groups, gt * n_tiles / j.n_group_tasks * j.task_tile);
  const int64_t g1 = std::min(j.groups.n_groups, (gt + 1) * n_tiles / j.n_group_tasks * j.task_tile);
  const int64_t t0 = tt * j.tokens_per_task, t1 = std::min(n_tokens, t0 + j.tokens_per_task);
  run_job_range(j, n_tokens, n_in, g0, g1, t0, t1);
}

// Products of fewer than kStreamedTokens tokens (decode, several sequences
// decoding together, prompt chunks). The 8-group
// tiles of all the call's matrices, in order, are cut into one contiguous
// range per thread. A thread claims half of what is left of its own range at
// a time, front to back, so it reads one long sequential stream (what the
// hardware prefetcher follows best) in a few kernel calls; once its range is
// done it takes half of what is left of another range, from the back, until
// none is left, so both threads finish within about a tile of each other.
// The fixed tasks this replaces (about four per thread, dynamically claimed)
// left the thread that finished first waiting half a task, 1.5-3.9 us of a
// 41 us dispatch on the 60M model, and restarted a stream at every task.
// Which thread computes a tile changes no bits.
constexpr int64_t kDecodeTile = 8;

// One thread's range of tiles: [next, end) packed in one word, so the owner
// (advancing next) and a thief (lowering end) claim with one compare-and-swap.
struct alignas(64) TileRange {
  std::atomic<uint64_t> next_end;
};

inline uint64_t pack_range(uint64_t next, uint64_t end) { return next | (end << 32); }

// Tiles [t0, t1) of the call, one kernel call per matrix they cover.
void run_decode_span(std::span<const Job> jobs, std::span<const int64_t> first_tile, int64_t n_tokens, int64_t n_in,
                     int64_t t0, int64_t t1) {
  size_t i = 0;
  while (t0 < t1) {
    while (i + 1 < jobs.size() && first_tile[i + 1] <= t0) ++i;
    const Job& j = jobs[i];
    const int64_t stop = i + 1 < jobs.size() ? std::min(t1, first_tile[i + 1]) : t1;
    const int64_t g0 = (t0 - first_tile[i]) * kDecodeTile;
    const int64_t g1 = std::min(j.groups.n_groups, (stop - first_tile[i]) * kDecodeTile);
    run_job_range(j, n_tokens, n_in, g0, g1, 0, n_tokens);
    t0 = stop;
  }
}

// Claims half (at least one tile) of what is left of `range`: from the front
// for its owner, from the back for a thief. Returns false when nothing is left.
bool claim_tiles(std::atomic<uint64_t>& range, bool owner, uint64_t& t0, uint64_t& t1) {
  for (uint64_t cur = range.load(std::memory_order_acquire);;) {
    const uint64_t next = cur & 0xffffffffu, end = cur >> 32;
    if (next >= end) return false;
    const uint64_t take = std::max<uint64_t>(1, (end - next) / 2);
    t0 = owner ? next : end - take;
    t1 = t0 + take;
    const uint64_t claimed = owner ? pack_range(next + take, end) : pack_range(next, end - take);
    if (range.compare_exchange_weak(cur, claimed, std::memory_order_acq_rel, std::memory_order_acquire)) return true;
  }
}

void run_decode(std::span<const Job> jobs, int64_t n_tokens, int64_t n_in, ThreadPool& pool) {
  struct Scratch {
    std::vector<int64_t> first_tile;
    std::unique_ptr<TileRange[]> ranges;
    int n_ranges = 0;
  };
  Scratch& sc = pool.caller_local<Scratch>();
  sc.first_tile.resize(jobs.size());
  int64_t n_tiles = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    sc.first_tile[i] = n_tiles;
    n_tiles += (jobs[i].groups.n_groups + kDecodeTile - 1) / kDecodeTile;
  }
  const int n = static_cast<int>(std::min<int64_t>(pool.size(), n_tiles));
  if (sc.n_ranges < n) {
    sc.ranges = std::make_unique<TileRange[]>(n);
    sc.n_ranges = n;
  }
  for (int r = 0; r < n; ++r)
    sc.ranges[r].next_end.store(pack_range(n_tiles * r / n, n_tiles * (r + 1) / n), std::memory_order_relaxed);
  const std::span<const int64_t> first_tile(sc.first_tile);
  TileRange* ranges = sc.ranges.get();
  // Task r is range r's owner; parallel_for publishes the ranges' stores.
  pool.parallel_for(n, [&](int64_t own) {
    uint64_t t0, t1;
    for (int k = 0; k < n; ++k) {
      std::atomic<uint64_t>& range = ranges[(own + k) % n].next_end;
      while (claim_tiles(range, k == 0, t0, t1))
        run_decode_span(jobs, first_tile, n_tokens, n_in, static_cast<int64_t>(t0), static_cast<int64_t>(t1));
    }
  });
}

struct MatrixRef {
  const uint8_t* groups;
  const MatrixView* view;
  float* y;
  int interleave;  // of groups (1 when packing on the fly)
  int regions;     // PackedMatrix::regions (0 when packing on the fly)
};

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct DecodePrefetch {
  int64_t distance = 0;
  PrefetchTuner::Plan plan;
  PrefetchTuner* tuner = nullptr;
  double start = 0.0;
};

// Decode-sized batches stream their weights once, and their tiles prefetch
// that stream ahead or not as the pool's tuner has measured faster for the
// weight type (prefetch_tuner.h); larger batches tile weights through L2 and
// never prefetch. REPRISE_PREFETCH=bytes fixes the distance (0: off) for
// comparisons.
const char* fixed_prefetch_env() {
  static const char* const fixed = std::getenv("REPRISE_PREFETCH");
  return fixed;
}

DecodePrefetch plan_decode_prefetch(const MatrixRef& first, int64_t n_tokens, ThreadPool& pool) {
  DecodePrefetch d;
  if (n_tokens >= kTokenTile) return d;
  if (const char* fixed = fixed_prefetch_env()) {
    d.distance = std::atoll(fixed);
    return d;
  }
  const IsaKernels& isa = isa_kernels();
  const int64_t distance =
      for_family(first.view->type, isa.decode_prefetch_f, isa.decode_prefetch_q, isa.decode_prefetch_k);
  // Weights packed on the fly have no stable identity to time against.
  if (!first.groups) {
    d.distance = distance;
    return d;
  }
  PrefetchTuner& tuner = pool.caller_local<PrefetchTuner>();
  d.start = seconds_now();
  d.plan = tuner.plan(first.view->type, first.groups, n_tokens, d.start);
  d.distance = d.plan.prefetch ? distance : 0;
  d.tuner = &tuner;
  return d;
}

// A product's job without its task split: the kernel, the weights, the
// activations and the output.
Job base_job(const MatrixRef& m, const PackedX& x, const IsaKernels& isa) {
  const MatrixView& v = *m.view;
  Job j{};
  j.fn = matmul_fn(isa, v.type);
  j.groups = {m.groups, group_bytes_for(v.type, v.n_in), unit_bytes_for(v.type), (v.n_out + kGroupRows - 1) / kGroupRows,
              m.interleave, m.regions};
  j.view = &v;
  j.n_out = v.n_out;
  j.x = x;
  j.y = m.y;
  return j;
}

// Records the job's packed buffer for the paired probe, with the last
// regions' padding groups (never read, at most regions - 1 of them).
void note_read(const Job& j) {
  WeightReadLog::note(j.groups.base, j.groups.group_bytes * stored_groups(j.groups.n_groups, j.groups.regions));
}

void run_matmuls(std::span<const MatrixRef> mats, const float* x, int64_t n_tokens, ThreadPool& pool) {
  if (mats.empty() || n_tokens <= 0) return;
  const IsaKernels& isa = isa_kernels();
  const int64_t n_in = mats[0].view->n_in;
  ActBuffer* bufs = pool.caller_local<ActBuffers>().kinds;
  PackedX packed[kActKinds];
  std::vector<Job> jobs;
  jobs.reserve(mats.size());
  // Work split: calls of up to 1024 tokens split rows only (run_decode,
  // kStreamedTokens); larger ones tile rows x tokens so a task's weights
  // stay in L2 and its tokens in L1.
  int64_t task = 0;
  for (const auto& m : mats) {
    const MatrixView& v = *m.view;
    if (v.n_in != n_in) throw Error("matmul_many: matrices differ in n_in");
    const ActKind kind = act_kind(v.type);
    const int ki = static_cast<int>(kind);
    if (!packed[ki].data) packed[ki] = pack_activations(kind, x, n_in, n_tokens, bufs[ki], pool);
    Job j = base_job(m, packed[ki], isa);
    note_read(j);
    // Large batches of Q6_K and Q3_K widen their quants to bytes once, and
    // F16/BF16 prompt tasks their weights to f32, reused over every token
    // tile. Streamed F16/BF16 tiles convert in place faster (60M pp128 and
    // pp512: widening 0.95x).
    const bool f16_like = v.type == DType::F16 || v.type == DType::BF16;
    const bool wide =
        n_tokens >= 4 * kTokenTile && (runs_q6k_rule(v.type) || (f16_like && n_tokens >= kStreamedTokens));
    if (wide) {
      j.wide_unit = f16_like ? kGroupRows * sizeof(float) : kernels::kSectionQ6KWide;
      j.fn_wide = f16_like ? isa.matmul_f32 : isa.matmul_q6_k_wide;
      if (f16_like) j.k_block = 512;
    }
    if (n_tokens >= kStreamedTokens) {
      // Groups per task, at most (the tasks' count follows from it); widened
      // tasks reuse their groups over up to 44 token tiles.
      const int64_t groups_per_task = wide ? 4 : 8;
      j.tokens_per_task = wide ? 44 * kTokenTile : 4 * kTokenTile;
      j.task_tile = groups_per_task;  // one tile a task: groups_per_task each, the last fewer
      j.n_group_tasks = (j.groups.n_groups + groups_per_task - 1) / groups_per_task;
      j.n_token_tasks = (n_tokens + j.tokens_per_task - 1) / j.tokens_per_task;
      j.first_task = task;
      task += j.n_group_tasks * j.n_token_tasks;
    }
    jobs.push_back(j);
  }
  const DecodePrefetch prefetch = plan_decode_prefetch(mats[0], n_tokens, pool);
  for (Job& j : jobs) j.prefetch = prefetch.distance;
  if (n_tokens < kStreamedTokens) {
    run_decode(jobs, n_tokens, n_in, pool);
  } else {
    pool.parallel_for(task, [&](int64_t t) {
      size_t i = 0;
      while (i + 1 < jobs.size() && jobs[i + 1].first_task <= t) ++i;
      run_job_task(jobs[i], n_tokens, n_in, t - jobs[i].first_task);
    });
  }
  if (prefetch.plan.timed) {
    const double now = seconds_now();
    prefetch.tuner->report(prefetch.plan, now - prefetch.start, now);
  }
}

}  // namespace

std::string decode_prefetch_summary(ThreadPool& pool) {
  if (const char* fixed = fixed_prefetch_env()) return "fixed " + std::to_string(std::atoll(fixed)) + " bytes";
  const std::string s = pool.caller_local<PrefetchTuner>().summary();
  return s.empty() ? "not yet decided" : s;
}

void matmul(const PackedMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  const MatrixRef m{w.groups(), &w.view(), y, w.interleave(), w.regions()};
  run_matmuls(std::span<const MatrixRef>(&m, 1), x, n_tokens, pool);
}

void matmul(const MatrixView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  const MatrixRef m{nullptr, &w, y, 1, 0};
  run_matmuls(std::span<const MatrixRef>(&m, 1), x, n_tokens, pool);
}

void matmul_many(std::span<const MatmulOutput> outputs, const float* x, int64_t n_tokens, ThreadPool& pool) {
  MatrixRef refs[8];
  std::vector<MatrixRef> more;
  MatrixRef* r = refs;
  if (outputs.size() > 8) {
    more.resize(outputs.size());
    r = more.data();
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    r[i] = {outputs[i].w->groups(), &outputs[i].w->view(), outputs[i].y, outputs[i].w->interleave(),
            outputs[i].w->regions()};
  run_matmuls(std::span<const MatrixRef>(r, outputs.size()), x, n_tokens, pool);
}

void plan_team_step(std::span<const PackedMatrix* const> firsts, int64_t n_tokens, TeamStepPlan& plan,
                    ThreadPool& pool) {
  if (n_tokens < 1 || n_tokens >= kTokenTile) throw Error("plan_team_step: not a decode-sized batch");
  plan.n_tokens = n_tokens;
  plan.plans.resize(firsts.size());
  plan.distance.resize(firsts.size());
  plan.seconds.assign(firsts.size(), 0.0);
  for (size_t i = 0; i < firsts.size(); ++i) {
    const PackedMatrix& w = *firsts[i];
    const MatrixRef m{w.groups(), &w.view(), nullptr, w.interleave(), w.regions()};
    const DecodePrefetch d = plan_decode_prefetch(m, n_tokens, pool);
    plan.plans[i] = d.plan;
    plan.distance[i] = d.distance;
  }
  plan.last_barrier = seconds_now();
}

void report_team_step(const TeamStepPlan& plan, ThreadPool& pool) {
  if (fixed_prefetch_env()) return;
  PrefetchTuner& tuner = pool.caller_local<PrefetchTuner>();
  const double now = seconds_now();
  for (size_t i = 0; i < plan.plans.size(); ++i)
    if (plan.plans[i].timed) tuner.report(plan.plans[i], plan.seconds[i], now);
}

void team_matmul_many(std::span<const MatmulOutput> outputs, const float* x, DecodeTeam::Member& m,
                      TeamStepPlan& plan, int index, int64_t n_tokens) {
  const IsaKernels& isa = isa_kernels();
  if (n_tokens <= 0) n_tokens = plan.n_tokens;
  if (n_tokens >= kTokenTile) throw Error("team_matmul_many: not a decode-sized batch");
  const int64_t n_in = outputs[0].w->view().n_in;
  // This member's activations, one buffer per kind: every member reads
  // all of x, converted by itself (the same bits).
  thread_local ActBuffers t_acts;
  PackedX packed[kActKinds];
  constexpr size_t kMaxOutputs = 4;
  if (outputs.size() > kMaxOutputs) throw Error("team_matmul_many: too many outputs");
  Job jobs[kMaxOutputs];
  int64_t first_tile[kMaxOutputs];
  int64_t n_tiles = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const PackedMatrix& w = *outputs[i].w;
    const MatrixView& v = w.view();
    if (v.n_in != n_in) throw Error("team_matmul_many: matrices differ in n_in");
    const ActKind kind = act_kind(v.type);
    const int ki = static_cast<int>(kind);
    if (!packed[ki].data) packed[ki] = pack_activations(kind, x, n_in, n_tokens, t_acts.kinds[ki], m.pool());
    jobs[i] = base_job(MatrixRef{w.groups(), &v, outputs[i].y, w.interleave(), w.regions()}, packed[ki], isa);
    jobs[i].prefetch = plan.distance[index];
    // The recording log is the calling thread's (WeightReadLog), which may
    // be any member's.
    note_read(jobs[i]);
    first_tile[i] = n_tiles;
    n_tiles += (jobs[i].groups.n_groups + kDecodeTile - 1) / kDecodeTile;
  }
  const std::span<const Job> job_span(jobs, outputs.size());
  const std::span<const int64_t> first_span(first_tile, outputs.size());
  int64_t t0, t1;
  while (m.claim(n_tiles, true, t0, t1)) run_decode_span(job_span, first_span, n_tokens, n_in, t0, t1);
  m.barrier();
  if (m.index() == 0) {
    const double now = seconds_now();
    plan.seconds[index] = now - plan.last_barrier;
    plan.last_barrier = now;
  }
}

void team_barrier(DecodeTeam::Member& m, TeamStepPlan& plan) {
  m.barrier();
  if (m.index() == 0) plan.last_barrier = seconds_now();
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

// ---------------------------------------------------------------------------
// Row lookups and conversions.

void dequantize_row(const MatrixView& w, int64_t r, float* out) {
  reprise::dequantize_row(w.type, w.row(r), out, w.n_in);
}

void convert_f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void expf_exact(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, expf_exact8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float in[8] = {}, res[8];
    for (int64_t j = i; j < n; ++j) in[j - i] = x[j];
    _mm256_store_ps(res, expf_exact8(_mm256_load_ps(in)));
    for (int64_t j = i; j < n; ++j) out[j] = res[j - i];
  }
}

float expf_vec(float x) { return exp_scalar(x); }

void expf_vec(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) out[i] = exp_scalar(x[i]);
}

// ---------------------------------------------------------------------------
// Element-wise operations.

void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out) {
  // Sum of squares in double (ggml_float), two 4-lane accumulators.
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) sum = std::fma(static_cast<double>(x[i]), static_cast<double>(x[i]), sum);
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
  const __m256 s = _mm256_set1_ps(scale);
  i = 0;
  if (weight) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), s), _mm256_loadu_ps(weight + i)));
    for (; i < n; ++i) out[i] = (x[i] * scale) * weight[i];
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), s));
    for (; i < n; ++i) out[i] = x[i] * scale;
  }
}

void layer_norm(const float* x, const float* weight, const float* bias, float eps, int64_t n,
                float* out) {
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= n;
  double var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(var) + eps);
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(x[i] - mean) * scale;
    if (weight) v *= weight[i];
    if (bias) v += bias[i];
    out[i] = v;
  }
}

void rope_table(int n_rot, int64_t pos, float freq_base, float freq_scale, const float* freq_factors, float* cos_out,
                float* sin_out) {
  // theta_i = pos * base^(-2i/n_rot), built by repeated multiplication as ggml
  // does; then divided by the pair's factor and scaled (ggml's rope_yarn
  // without extrapolation mixing).
  const float theta_scale = std::pow(freq_base, -2.0f / n_rot);
  float theta = static_cast<float>(pos);
  for (int i = 0; i < n_rot / 2; ++i) {
    const float angle = freq_scale * (freq_factors ? theta / freq_factors[i] : theta);
    cos_out[i] = std::cos(angle);
    sin_out[i] = std::sin(angle);
    theta *= theta_scale;
  }
}

void rope_apply(float* x, int n_heads, int head_dim, int n_rot, const float* cos_v, const float* sin_v,
                RopeStyle style) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    if (style == RopeStyle::Normal) {
      int i = 0;
      // Pairs (2i, 2i+1): deinterleave 8 pairs at a time.
      for (; i + 8 <= half; i += 8) {
        const __m256 p0 = _mm256_loadu_ps(v + 2 * i), p1 = _mm256_loadu_ps(v + 2 * i + 8);
        // a = even elements, b = odd elements (in pair order after permute).
        const __m256 a = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(p0, p1, 0x88), _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
        const __m256 b = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(p0, p1, 0xdd), _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
        const __m256 c = _mm256_loadu_ps(cos_v + i), s = _mm256_loadu_ps(sin_v + i);
        const __m256 ra = _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s));
        const __m256 rb = _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c));
        const __m256 lo = _mm256_unpacklo_ps(ra, rb), hi = _mm256_unpackhi_ps(ra, rb);
        _mm256_storeu_ps(v + 2 * i, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(v + 2 * i + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
      }
      for (; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        const float ac = a * cos_v[i], bs = b * sin_v[i], as = a * sin_v[i], bc = b * cos_v[i];
        v[2 * i] = ac - bs;
        v[2 * i + 1] = as + bc;
      }
    } else {
      int i = 0;
      for (; i + 8 <= half; i += 8) {
        const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
        const __m256 c = _mm256_loadu_ps(cos_v + i), s = _mm256_loadu_ps(sin_v + i);
        _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
        _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c)));
      }
      for (; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        const float ac = a * cos_v[i], bs = b * sin_v[i], as = a * sin_v[i], bc = b * cos_v[i];
        v[i] = ac - bs;
        v[i + half] = as + bc;
      }
    }
  }
}

void rope(float* x, int n_heads, int head_dim, int n_rot, int64_t pos, float freq_base,
          float freq_scale, RopeStyle style) {
  float cos_cache[512], sin_cache[512];
  rope_table(n_rot, pos, freq_base, freq_scale, nullptr, cos_cache, sin_cache);
  rope_apply(x, n_heads, head_dim, n_rot, cos_cache, sin_cache, style);
}

// Vectorized: the exponentials are the C library's expf bits (expf_exact),
// the sum is in double over two 4-lane accumulators (as rms_norm's), so a
// row's result depends only on the row. (Scalar expf per element was ~30 %
// of the image encoder, whose attention softmaxes n x n scores.)
void softmax_inplace(float* x, int64_t n) {
  __m256 m8 = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float mx = -INFINITY;
  for (float l : lanes) mx = std::max(mx, l);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const __m256 mx8 = _mm256_set1_ps(mx);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_loadu_ps(x + i), mx8));
  for (; i < n; ++i) x[i] -= mx;
  expf_exact(x, x, n);
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (i = 0; i + 8 <= n; i += 8) {
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm_loadu_ps(x + i)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)));
  }
  alignas(32) double sums[4];
  _mm256_store_pd(sums, _mm256_add_pd(a0, a1));
  double sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  for (; i < n; ++i) sum += x[i];
  const float inv = static_cast<float>(1.0 / sum);
  const __m256 inv8 = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv8));
  for (; i < n; ++i) x[i] *= inv;
}

float silu(float x) { return x / (1.0f + exp_scalar(-x)); }

using kernels::avx2::kGeluCoef;
using kernels::avx2::kGeluSqrt2OverPi;

float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + std::tanh(kGeluSqrt2OverPi * x * (1.0f + kGeluCoef * x * x)));
}

// silu() on 8 lanes: x / (1 + e^-x), the same operations per lane.
inline __m256 silu8(__m256 x) {
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

void silu_mul(float* g, const float* u, int64_t n) {
  int64_t i = 0;
  if (const auto wide = kernels::isa_kernels().silu_mul) i = wide(g, u, n);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, _mm256_mul_ps(silu8(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
  for (; i < n; ++i) g[i] = silu(g[i]) * u[i];
}

void silu_in_place(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, silu8(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) x[i] = silu(x[i]);
}

// GELU's tanh form written as a sigmoid, 0.5 x (1 + tanh(y)) = x / (1 +
// e^(-2y)), so it runs on the vector exp (a scalar tanhf per element was
// ~30 % of a gemma3 prompt). Within a few ulp of the tanhf form; the
// scalar tail performs the same operations as a vector lane, so an
// element's result never depends on where it falls in the row.
float gelu_sigmoid(float x) {
  const float t = std::fma(kGeluCoef * x, x, 1.0f);
  return x / (1.0f + exp_scalar(-((2.0f * kGeluSqrt2OverPi * x) * t)));
}

void gelu_mul(float* g, const float* u, int64_t n) {
  const __m256 c1 = _mm256_set1_ps(2.0f * kGeluSqrt2OverPi), c2 = _mm256_set1_ps(kGeluCoef);
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  if (const auto wide = kernels::isa_kernels().gelu_mul) i = wide(g, u, n);
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 t = _mm256_fmadd_ps(_mm256_mul_ps(c2, x), x, one);
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(c1, x), t);
    const __m256 e = exp8(_mm256_xor_ps(y, sign));
    const __m256 r = _mm256_div_ps(x, _mm256_add_ps(one, e));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) g[i] = gelu_sigmoid(g[i]) * u[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] += x[i];
}

// ---------------------------------------------------------------------------
// Attention.
//
// Per query: q rounded to f16; for each key in order, s = dot(q, k) * scale
// with the summation order of ggml's AVX2 f16 dot: four 8-lane fma chains
// c0..c3 over 32-element steps (further 8-element steps into c0), then
// ((c0 + c1) + (c2 + c3)), lanes l + l+4, then (w0 + w1) + (w2 + w3), then
// the leftover elements by fma one by one; rows shorter than 32 are summed
// in double (score8 in attention_avx2.cpp computes it for 8 keys at once),
// then ggml's online softmax with an f16 value accumulator:
//   s > M:  ms = exp(M - s), M = s, acc = f16(acc * ms), vs = 1
//   else:   vs = exp(s - M)
//   acc = f16(fma(v, vs, acc)); S = fma(S, ms, vs)
// out = acc / S, with exp the C library's expf (computed 8 at a time by
// expf_exact8, which gives its bits). Keys are handled in tiles of 16; the
// arithmetic per key is unchanged.

namespace {

// The 16-position key tile at t0 (key_tile16) widened to f32 as [d][16] in
// kt; lanes of positions outside [lo, hi) are zero (the stored group's
// other positions may hold anything). scratch: 16 * keys.d values.
void widen_key_tile(const KeyView& keys, int64_t t0, int64_t lo, int64_t hi, uint16_t* scratch, float* kt) {
  const uint16_t* tile = key_tile16(keys, t0, lo, hi, scratch);
  alignas(32) int32_t lane_ok[16];
  for (int i = 0; i < 16; ++i) lane_ok[i] = t0 + i >= lo && t0 + i < hi ? -1 : 0;
  const __m256 ok0 = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(lane_ok)));
  const __m256 ok1 = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(lane_ok + 8)));
  for (int64_t d = 0; d < keys.d; ++d) {
    _mm256_store_ps(kt + d * 16, _mm256_and_ps(load_h8(tile + d * 16), ok0));
    _mm256_store_ps(kt + d * 16 + 8, _mm256_and_ps(load_h8(tile + d * 16 + 8), ok1));
  }
}

// acc = f16(acc * m) over n (n % 8 handled in scalar with the same rounding).
inline void scale_h(float* acc, float m, int64_t n) {
  const __m256 mv = _mm256_set1_ps(m);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, round_h8(_mm256_mul_ps(_mm256_loadu_ps(acc + i), mv)));
  for (; i < n; ++i) acc[i] = f16_to_f32(f32_to_f16(acc[i] * m));
}
inline void mad_h(float* acc, const uint16_t* v, float s, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, round_h8(_mm256_fmadd_ps(load_h8(v + i), sv, _mm256_loadu_ps(acc + i))));
  for (; i < n; ++i) acc[i] = f16_to_f32(f32_to_f16(std::fma(f16_to_f32(v[i]), s, acc[i])));
}

// The per-query path: up to kInterleave (query, head) items at once, keys in
// blocks of 8: every item's scores, its new-maximum plan (running maxima
// decide which exponential each key needs) and 8 exponentials, then the value
// updates key by key with the items interleaved, so their serial f16
// accumulator chains overlap. The operations per (query, key) do not depend
// on which items share a task (AVX2, and head sizes the AVX-512 kernels do
// not cover).
constexpr int kInterleave = 4;

struct AttendItem {
  const float* q;
  KeyView keys;
  const uint16_t* const* value_rows;
  int64_t offset;  // of the head within a value row
  int64_t first, end;
  float* out;
};

void attend_interleaved(const AttendItem* items, int n, int64_t d, float scale) {
  constexpr int kBlock = 16;  // a key tile (key_tile16)
  alignas(32) float qh[kInterleave][1024], acc[kInterleave][1024];
  float M[kInterleave], S[kInterleave];
  int64_t lo = items[0].first, hi = items[0].end;
  for (int r = 0; r < n; ++r) {
    convert_row(ActKind::F16, items[r].q, d, qh[r]);
    std::fill(acc[r], acc[r] + d, 0.0f);
    M[r] = -INFINITY;
    S[r] = 0.0f;
    lo = std::min(lo, items[r].first);
    hi = std::max(hi, items[r].end);
  }
  alignas(32) float s[kInterleave][kBlock], e[kInterleave][kBlock];
  // The tile's keys widened to f32 ([d][16]) for the KV head at offset
  // tile_off: items of one KV head (a prompt's consecutive tokens, grouped
  // heads) share them. The stored group is read in place (key_tile16), so
  // no key is gathered into rows.
  alignas(32) float kt[1024 * kBlock];
  alignas(32) uint16_t scratch[1024 * kBlock];
  bool takes[kInterleave][kBlock], is_new[kInterleave][kBlock];
  for (int64_t t0 = lo & ~int64_t(kBlock - 1); t0 < hi; t0 += kBlock) {
    int64_t tile_off = -1;
    for (int r = 0; r < n; ++r) {
      const AttendItem& it = items[r];
      alignas(32) float arg[kBlock] = {};
      float m = M[r];
      // Every position of [lo, hi) is stored (the batch's rows reach them).
      if (it.keys.kv_off != tile_off) {
        widen_key_tile(it.keys, t0, lo, hi, scratch, kt);
        tile_off = it.keys.kv_off;
      }
      kernels::score16_avx2(qh[r], kt, d, s[r]);
      for (int j = 0; j < kBlock; ++j) {
        const int64_t p = t0 + j;
        takes[r][j] = p >= it.first && p < it.end;
        is_new[r][j] = false;
        if (!takes[r][j]) continue;
        s[r][j] *= scale;
        is_new[r][j] = s[r][j] > m;
        arg[j] = is_new[r][j] ? m - s[r][j] : s[r][j] - m;
        if (is_new[r][j]) m = s[r][j];
      }
      _mm256_store_ps(e[r], expf_exact8(_mm256_load_ps(arg)));
      _mm256_store_ps(e[r] + 8, expf_exact8(_mm256_load_ps(arg + 8)));
    }
    for (int j = 0; j < kBlock; ++j) {
      for (int r = 0; r < n; ++r) {
        if (!takes[r][j]) continue;
        float ms = 1.0f, vs = 1.0f;
        if (is_new[r][j]) {
          M[r] = s[r][j];
          ms = e[r][j];
          scale_h(acc[r], ms, d);
        } else {
          vs = e[r][j];
        }
        mad_h(acc[r], items[r].value_rows[t0 + j] + items[r].offset, vs, d);
        S[r] = std::fma(S[r], ms, vs);
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    const float inv = S[r] == 0.0f ? 0.0f : 1.0f / S[r];
    const __m256 iv = _mm256_set1_ps(inv);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(items[r].out + i, _mm256_mul_ps(_mm256_loadu_ps(acc[r] + i), iv));
    for (; i < d; ++i) items[r].out[i] = acc[r][i] * inv;
  }
}

}  // namespace

// Declared in kernels_impl.h.
void kernels::widen_kv_block(const KeyView& keys, const uint16_t* const* value_rows, int64_t v_off, int64_t p0,
                             int64_t lo, int64_t hi, float* kt, float* v) {
  const int64_t D = keys.d;
  alignas(64) uint16_t scratch[16 * 256];
  widen_key_tile(keys, p0, lo, hi, scratch, kt);
  for (int i = 0; i < 16; ++i) {
    const int64_t p = p0 + i;
    float* vr = v + i * D;
    if (p >= lo && p < hi) {
      const uint16_t* vrow = value_rows[p] + v_off;
      int64_t d = 0;
      for (; d + 8 <= D; d += 8) _mm256_storeu_ps(vr + d, load_h8(vrow + d));
      for (; d < D; ++d) vr[d] = f16_to_f32(vrow[d]);
    } else {
      std::fill(vr, vr + D, 0.0f);
    }
  }
}

namespace {

// The per-key kernel takes up to 4 heads at a time.
constexpr int64_t kPerKeyHeadsPerCall = 4;

// Elements from KV head j to j + 1 of one position.
int64_t kv_stride(const AttentionBatch& b) { return b.kv_head_stride > 0 ? b.kv_head_stride : b.head_dim; }

// The keys of the KV head at element offset kv_off.
KeyView key_view(const AttentionBatch& b, int64_t kv_off) { return KeyView{b.key_rows, kv_off, b.key_group, b.head_dim}; }

bool all_tiled(const AttentionBatch& b) {
  for (int64_t t = 0; t < b.n_tokens; ++t)
    if (!takes_tiled_attention(b.head_dim, b.end[t])) return false;
  return true;
}

// Decode attention with the tiled numerics: a task is one KV head of one
// token (all its query heads, up to 16), f16 K/V rows read in place, so each
// KV head's rows are read, and its tiles transposed, by one task, and a
// thread reads two streams (the head's K and V rows) instead of one pair per
// head of a several-head task. Paired per token against tasks of 4 query
// heads (a whole KV head at least), 60M Q8_0 tg128@d2048: 1.05x without
// grouped heads (AVX2 1.05x) and 1.05x with 2 query heads per KV head.
// Contexts of 64 or fewer keys take the per-key numerics, whose f16 value
// accumulator is one serial rounding chain per head: those tasks take about
// 4 query heads (whole KV heads), which the kernel interleaves so the chains
// overlap (with one head a task, 60M decode's attention at positions 32-63
// took 1.1-1.2x as long). Multi-head models' tiled tasks take
// IsaKernels::tiled_heads_together KV heads (two on AVX-512, whose kernel
// interleaves the two heads' chains: tile_step_pair).
int64_t decode_heads_per_task(const AttentionBatch& b) {
  const int64_t group = b.n_head / b.n_head_kv;
  const int64_t tiled_kv_heads = group == 1 ? isa_kernels().tiled_heads_together : 1;
  const int64_t kv_heads = all_tiled(b) ? tiled_kv_heads : std::max<int64_t>(1, kPerKeyHeadsPerCall / group);
  return std::min<int64_t>(kv_heads * group, kernels::kMaxTiledGroups * kernels::kMaxTiledQueries);
}

bool decode_kernel_takes(const AttentionBatch& b, const IsaKernels& isa) {
  return b.n_tokens < 4 && ((isa.attend_rows && isa.attend_rows_supports(b.head_dim)) || all_tiled(b));
}

// Appends query (token t, head h) of b to qs (which has room).
void add_query(kernels::TiledQueries& qs, const AttentionBatch& b, int64_t t, int64_t h) {
  qs.q[qs.n] = b.q + (t * b.n_head + h) * b.head_dim;
  qs.first[qs.n] = b.first[t];
  qs.end[qs.n] = b.end[t];
  qs.out[qs.n] = b.out + (t * b.n_head + h) * b.head_dim;
  ++qs.n;
}

// Head h's queries of tokens [t0, t1) of b as groups of kMaxTiledQueries
// that read KV head h / group (at kv_off); returns the number of groups.
int head_query_groups(const AttentionBatch& b, int64_t h, int64_t t0, int64_t t1, kernels::TiledGroup* groups) {
  const int64_t kv_off = (h / (b.n_head / b.n_head_kv)) * kv_stride(b);
  int n = 0;
  for (int64_t g0 = t0; g0 < t1; g0 += kernels::kMaxTiledQueries, ++n) {
    groups[n].kv_off = kv_off;
    for (int64_t t = g0; t < std::min(t1, g0 + kernels::kMaxTiledQueries); ++t) add_query(groups[n].queries, b, t, h);
  }
  return n;
}

// Tiled-numerics attention for heads [h0, h0 + nh) of token t, reading f16
// K/V rows in place; heads that share a KV head share its transposed tiles.
void tiled_heads(const AttentionBatch& b, const IsaKernels& isa, int64_t t, int64_t h0, int64_t nh) {
  const int64_t D = b.head_dim, group = b.n_head / b.n_head_kv;
  // At most 16 heads: a group per 4 query heads, and one more where a KV head
  // starts mid-way.
  kernels::TiledGroup groups[kernels::kMaxTiledGroups + 4];
  int n = 0;
  for (int64_t h = h0; h < h0 + nh; ++h) {
    const int64_t off = (h / group) * kv_stride(b);
    if (n == 0 || groups[n - 1].kv_off != off || groups[n - 1].queries.n == kernels::kMaxTiledQueries)
      groups[n++] = kernels::TiledGroup{off, {}};
    add_query(groups[n - 1].queries, b, t, h);
  }
  isa.attend_tiled_rows(b.key_rows, b.value_rows, D, b.key_group, groups, n, b.scale);
}

int64_t decode_chunks(const AttentionBatch& b) {
  const int64_t per_task = decode_heads_per_task(b);
  return (b.n_head + per_task - 1) / per_task;
}

// Task `task` (of n_tokens * decode_chunks) of b's decode attention.
void decode_attention_task(const AttentionBatch& b, const IsaKernels& isa, int64_t task) {
  const int64_t D = b.head_dim, group = b.n_head / b.n_head_kv, chunks = decode_chunks(b);
  const int64_t per_task = decode_heads_per_task(b);
  const int64_t t = task / chunks, h_begin = (task % chunks) * per_task;
  const int64_t h_end = std::min(b.n_head, h_begin + per_task);
  if (takes_tiled_attention(D, b.end[t])) return tiled_heads(b, isa, t, h_begin, h_end - h_begin);
  for (int64_t h0 = h_begin; h0 < h_end; h0 += kPerKeyHeadsPerCall) {
    const int64_t nh = std::min(kPerKeyHeadsPerCall, h_end - h0);
    alignas(64) float qh[kPerKeyHeadsPerCall * 256];
    int64_t off[kPerKeyHeadsPerCall];
    for (int64_t i = 0; i < nh; ++i) {
      convert_row(ActKind::F16, b.q + (t * b.n_head + h0 + i) * D, D, qh + i * D);
      off[i] = ((h0 + i) / group) * kv_stride(b);
    }
    kernels::AttnRowsArgs a;
    a.q = qh;
    a.n_heads = nh;
    a.k_off = off;
    a.v_off = off;
    a.key_rows = b.key_rows;
    a.key_group = b.key_group;
    a.value_rows = b.value_rows;
    a.first = b.first[t];
    a.end = b.end[t];
    a.d = D;
    a.scale = b.scale;
    a.out = b.out + (t * b.n_head + h0) * D;
    isa.attend_rows(a);
  }
}

// Several batches' decode tasks end to end, as attention_many and
// team_attention deal them: task_end[i] is one past batch i's last task.
// Returns the tasks' count.
int64_t decode_task_ends(std::span<const AttentionBatch> batches, int64_t* task_end) {
  int64_t total = 0;
  for (size_t i = 0; i < batches.size(); ++i) task_end[i] = total += batches[i].n_tokens * decode_chunks(batches[i]);
  return total;
}

// The batch that task `task` (of decode_task_ends' numbering) belongs to,
// and (local) its index among that batch's tasks.
size_t batch_of_task(std::span<const int64_t> task_end, int64_t task, int64_t& local) {
  const size_t i = std::upper_bound(task_end.begin(), task_end.end(), task) - task_end.begin();
  local = task - (i ? task_end[i - 1] : 0);
  return i;
}

}  // namespace

bool team_attention_takes(int64_t head_dim, int64_t n_head, int64_t n_head_kv, int64_t end) {
  if (n_head_kv <= 0 || n_head % n_head_kv != 0) return false;
  // decode_kernel_takes and decode_heads_per_task for a one-token batch
  // whose query sees positions up to `end`.
  AttentionBatch b;
  b.n_tokens = 1;
  b.n_head = n_head;
  b.n_head_kv = n_head_kv;
  b.head_dim = head_dim;
  const int64_t first = 0;
  b.first = &first;
  b.end = &end;
  return decode_kernel_takes(b, isa_kernels()) && decode_heads_per_task(b) % (n_head / n_head_kv) == 0;
}

void team_attention(std::span<const AttentionBatch> batches, DecodeTeam::Member& m,
                    void (*prepare)(void*, size_t, int64_t, int64_t), void* ctx, TeamStepPlan& plan) {
  const IsaKernels& isa = isa_kernels();
  // The batches' tasks end to end, as attention_many deals them.
  constexpr size_t kMaxBatches = kTokenTile;
  if (batches.size() > kMaxBatches) throw Error("team_attention: too many sequences");
  for (const AttentionBatch& b : batches)
    if (b.n_tokens != 1) throw Error("team_attention: one token a sequence");
  int64_t task_end[kMaxBatches];
  const int64_t total = decode_task_ends(batches, task_end);
  const std::span<const int64_t> ends(task_end, batches.size());
  int64_t t0, t1;
  while (m.claim(total, false, t0, t1)) {
    for (int64_t task = t0; task < t1; ++task) {
      int64_t local;
      const size_t i = batch_of_task(ends, task, local);
      const AttentionBatch& b = batches[i];
      const int64_t per_task = decode_heads_per_task(b);
      const int64_t h0 = local * per_task, h1 = std::min(b.n_head, h0 + per_task);
      prepare(ctx, i, h0, h1);
      decode_attention_task(b, isa, local);
    }
  }
  team_barrier(m, plan);
}

void attention_many(std::span<const AttentionBatch> batches, ThreadPool& pool) {
  const IsaKernels& isa = isa_kernels();
  bool all_decode = batches.size() > 1;
  for (const AttentionBatch& b : batches) all_decode = all_decode && decode_kernel_takes(b, isa);
  if (!all_decode) {
    for (const AttentionBatch& b : batches) attention(b, pool);
    return;
  }
  // One dispatch for every batch's tasks (the same tasks attention() runs).
  thread_local std::vector<int64_t> task_end_buf;
  std::vector<int64_t>& task_end = task_end_buf;
  task_end.resize(batches.size());
  const int64_t total = decode_task_ends(batches, task_end.data());
  pool.parallel_for(total, [&](int64_t task) {
    int64_t local;
    const size_t i = batch_of_task(task_end, task, local);
    decode_attention_task(batches[i], isa, local);
  });
}

namespace {

// K transposed and V widened to f32 for a prompt's batched kernels, once per
// layer (thread-local buffers of the calling thread).
struct WidenedKv {
  float* kt;  // per KV head j: n_blocks blocks of [D][16] from kt + j * n_blocks * D * 16
  float* v;   // per KV head j: n_pos rows of D from v + j * n_pos * D
  int64_t base, n_blocks, n_pos;
};

// What WidenedKv points into, per pool (ThreadPool::caller_local).
struct WidenedKvBuffers {
  ScratchVector<uint8_t> kt, v;
};

WidenedKv widen_kv(const AttentionBatch& b, ThreadPool& pool) {
  const int64_t D = b.head_dim;
  int64_t lo = b.first[0], hi = b.end[0];
  for (int64_t t = 1; t < b.n_tokens; ++t) {
    lo = std::min(lo, b.first[t]);
    hi = std::max(hi, b.end[t]);
  }
  hi = std::max(hi, lo);
  const int64_t base = lo & ~int64_t(15);
  const int64_t n_blocks = (hi - base + 15) / 16 + 1;  // one spare block for 32-key steps
  const int64_t n_pos = n_blocks * 16;
  // 64-byte aligned: the kernel's full-vector loads must not split cache lines.
  WidenedKvBuffers& buffers = pool.caller_local<WidenedKvBuffers>();
  ScratchVector<uint8_t>& kt_buf = buffers.kt;
  ScratchVector<uint8_t>& v_buf = buffers.v;
  float* kt = reinterpret_cast<float*>(
      aligned_scratch(kt_buf, static_cast<size_t>(b.n_head_kv * n_blocks * D * 16) * sizeof(float)));
  float* vf = reinterpret_cast<float*>(aligned_scratch(v_buf, static_cast<size_t>(b.n_head_kv * n_pos * D) * sizeof(float)));
  // Pass 1: per KV head and block of 16 positions, K transposed and V widened.
  pool.parallel_for(b.n_head_kv * n_blocks, [&](int64_t task) {
    const int64_t j = task / n_blocks, blk = task % n_blocks;
    widen_kv_block(key_view(b, j * kv_stride(b)), b.value_rows, j * kv_stride(b), base + blk * 16, lo, hi,
                   kt + (j * n_blocks + blk) * D * 16, vf + (j * n_pos + blk * 16) * D);
  });
  return WidenedKv{kt, vf, base, n_blocks, n_pos};
}

void attention_per_key(const AttentionBatch& b, ThreadPool& pool) {
  const int64_t group = b.n_head / b.n_head_kv;
  const int64_t D = b.head_dim;
  const IsaKernels& isa = isa_kernels();
  // Batches (prefill) go through the ISA's batched kernel with K transposed
  // and V widened once per layer; single queries (decode) read f16 rows.
  if (decode_kernel_takes(b, isa)) {
    pool.parallel_for(b.n_tokens * decode_chunks(b), [&](int64_t task) { decode_attention_task(b, isa, task); });
    return;
  }
  // Prompts use the ISA's batched kernel, or the AVX2 one for head sizes the
  // ISA's does not take.
  auto* batched = isa.attention && isa.attention_supports(D) ? isa.attention
                  : kernels::attention_avx2_supports(D)       ? &kernels::attention_avx2
                                                               : nullptr;
  if (!batched || b.n_tokens < 4) {
    // Items of kInterleave (token, head) pairs: for prompts, consecutive
    // tokens of one head (they share K/V rows); for decode, the heads of one
    // token.
    const bool by_head = b.n_tokens >= kInterleave;
    const int64_t n_items = b.n_tokens * b.n_head;
    pool.parallel_for((n_items + kInterleave - 1) / kInterleave, [&](int64_t task) {
      AttendItem items[kInterleave];
      int n = 0;
      for (int64_t i = task * kInterleave; i < std::min(n_items, (task + 1) * kInterleave); ++i) {
        const int64_t t = by_head ? i % b.n_tokens : i / b.n_head;
        const int64_t h = by_head ? i / b.n_tokens : i % b.n_head;
        const int64_t off = (h / group) * kv_stride(b);
        items[n++] = {b.q + (t * b.n_head + h) * D, key_view(b, off), b.value_rows, off, b.first[t], b.end[t],
                      b.out + (t * b.n_head + h) * D};
      }
      attend_interleaved(items, n, D, b.scale);
    });
    return;
  }
  const WidenedKv w = widen_kv(b, pool);
  const float* kt = w.kt;
  const float* vf = w.v;
  const int64_t base = w.base, n_blocks = w.n_blocks, n_pos = w.n_pos;
  // Pass 2: per head and run of queries.
  constexpr int64_t kQueries = 16;
  const int64_t n_runs = (b.n_tokens + kQueries - 1) / kQueries;
  // Later runs attend to more keys (causal): hand them out first so the
  // pool's tail is short.
  pool.parallel_for(b.n_head * n_runs, [&](int64_t task) {
    const int64_t h = task % b.n_head, run = n_runs - 1 - task / b.n_head;
    const int64_t t0 = run * kQueries, nq = std::min(kQueries, b.n_tokens - t0);
    alignas(64) float qh[kQueries * 256];
    for (int64_t i = 0; i < nq; ++i) convert_row(ActKind::F16, b.q + ((t0 + i) * b.n_head + h) * D, D, qh + i * D);
    kernels::AttnArgs a;
    a.q = qh;
    a.q_stride = D;
    a.n_q = nq;
    a.first = b.first + t0;
    a.end = b.end + t0;
    a.d = D;
    a.scale = b.scale;
    const int64_t j = h / group;
    a.kt = kt + j * n_blocks * D * 16;
    a.v = vf + j * n_pos * D;
    a.base = base;
    a.out = b.out + (t0 * b.n_head + h) * D;
    a.out_stride = b.n_head * D;
    batched(a);
  });
}

// Queries per task of a prompt's tiled attention: one head's run of up to
// 128 queries, whose groups (kMaxTiledQueries each) take each K/V tile in
// turn while it is in L1 or L2 (tiled::walk_row_tiles), so a run reads its
// head's K/V from L3 or memory once. Runs of 16 read it 8 times as often:
// 128 measured 1.16x `pp512@d4096` and 1.07x at d1024 (60M Q8_0, head 64),
// the kernel 1.2-2x at head 64-256 from depth 2048. Shorter runs (down to
// 16) where that would leave fewer than 4 tasks per thread.
constexpr int64_t kMaxPromptRun = 128;
static_assert(kMaxPromptRun / kernels::kMaxTiledQueries <= kernels::kMaxWalkGroups, "a run walks its tiles at once");
int64_t prompt_run_queries(const AttentionBatch& b, int threads) {
  int64_t run = kMaxPromptRun;
  while (run > 16 && b.n_head * ((b.n_tokens + run - 1) / run) < 4 * int64_t{threads}) run /= 2;
  return run;
}

// Prompt rows that take the tiled numerics: per head, runs of queries
// (prompt_run_queries) in groups of kMaxTiledQueries that share each K/V
// load.
void attention_tiled(const AttentionBatch& b, ThreadPool& pool) {
  const IsaKernels& isa = isa_kernels();
  if (b.n_tokens < 4) {  // the decode tasks (each of these rows takes tiled_heads)
    pool.parallel_for(b.n_tokens * decode_chunks(b), [&](int64_t task) { decode_attention_task(b, isa, task); });
    return;
  }
  const int64_t D = b.head_dim, group = b.n_head / b.n_head_kv;
  const int64_t run_queries = prompt_run_queries(b, pool.size());
  const int64_t n_runs = (b.n_tokens + run_queries - 1) / run_queries;
  const int64_t in_place_rows = D >= 64 ? 1024 : 128;
  if (b.n_tokens * group <= in_place_rows) {
    // Up to 1024 query rows per KV head (a 512-token chunk without grouped
    // heads, 256 with 4 query heads per KV head; and every chat turn after a
    // long history): each task reads its head's f16 K/V in place, its run's
    // groups taking each tile in turn, rather than every KV head's K/V being
    // widened to f32 first, which at depth costs more memory traffic than
    // the attention itself. Same bits. Widening once served up to 128 rows
    // per KV head (runs of 16: in place 1.2-1.7x at 16-128 tokens, depth
    // ~1900, but 0.85-1.0x at 512); with runs of up to 128, paired, 60M
    // Q8_0: 512 tokens 1.03x at depth 0, 0.99x at 1024, 1.03x at 4096 (head
    // 128: 1.16x, 1.04x), 256 tokens 1.06x at 1024 and 1.15x at 4096; AVX2
    // 1.02-1.04x; 4 query heads per KV head, 256 tokens at 4096 1.05x, 512
    // 0.98x (so those stay widened). Heads below 64 (the small fixtures')
    // keep the old limit: the kernel at head 16, 512 tokens, 0.87x in place.
    pool.parallel_for(b.n_head * n_runs, [&](int64_t task) {
      const int64_t h = task % b.n_head, run = n_runs - 1 - task / b.n_head;
      kernels::TiledGroup groups[kMaxPromptRun / kernels::kMaxTiledQueries];
      const int n =
          head_query_groups(b, h, run * run_queries, std::min(b.n_tokens, (run + 1) * run_queries), groups);
      isa.attend_tiled_rows(b.key_rows, b.value_rows, D, b.key_group, groups, n, b.scale);
    });
    return;
  }
  const WidenedKv w = widen_kv(b, pool);
  // Later runs attend to more keys (causal): hand them out first.
  pool.parallel_for(b.n_head * n_runs, [&](int64_t task) {
    const int64_t h = task % b.n_head, run = n_runs - 1 - task / b.n_head;
    const int64_t j = h / group;
    const kernels::TiledKv kv{w.kt + j * w.n_blocks * D * 16, w.v + j * w.n_pos * D, w.base, D};
    kernels::TiledGroup groups[kMaxPromptRun / kernels::kMaxTiledQueries];
    const int n = head_query_groups(b, h, run * run_queries, std::min(b.n_tokens, (run + 1) * run_queries), groups);
    // A tile's widened K and V take 512 * D bytes: in L1 up to D = 64, in L2
    // beyond. All groups take each tile in turn at every head size: with
    // 128-query runs, against groups streaming the K/V one after another,
    // 1.36x at D = 128 and 1.49x at D = 256 from depth 2048-4608, 1.03x at
    // depth 512 (with runs of 16, D = 128 had measured 0.9x).
    isa.attend_tiled(kv, groups, n, b.scale);
  });
}

AttentionBatch token_range(const AttentionBatch& b, int64_t t0, int64_t t1) {
  AttentionBatch part = b;
  part.q = b.q + t0 * b.n_head * b.head_dim;
  part.first = b.first + t0;
  part.end = b.end + t0;
  part.out = b.out + t0 * b.n_head * b.head_dim;
  part.n_tokens = t1 - t0;
  return part;
}

}  // namespace

void attention(const AttentionBatch& b, ThreadPool& pool) {
  if (b.n_tokens <= 0) return;
  const IsaKernels& isa = isa_kernels();
  // Single queries (decode) read f16 rows in place, with each token's numerics.
  if (decode_kernel_takes(b, isa)) {
    pool.parallel_for(b.n_tokens * decode_chunks(b), [&](int64_t task) { decode_attention_task(b, isa, task); });
    return;
  }
  // Runs of consecutive tokens that take the same numerics.
  for (int64_t t0 = 0; t0 < b.n_tokens;) {
    const bool tiled = takes_tiled_attention(b.head_dim, b.end[t0]);
    int64_t t1 = t0 + 1;
    while (t1 < b.n_tokens && takes_tiled_attention(b.head_dim, b.end[t1]) == tiled) ++t1;
    const AttentionBatch part = token_range(b, t0, t1);
    if (tiled)
      attention_tiled(part, pool);
    else
      attention_per_key(part, pool);
    t0 = t1;
  }
}

}  // namespace reprise
