// Block layouts of the quantized weight types reprise computes with. These are
// the on-disk GGUF layouts (ggml's block_q8_0 ... block_q6_K), so tensor data
// is read in place.
#pragma once
#include <cstdint>

namespace reprise {

constexpr int kQK8_0 = 32;
constexpr int kQK4_0 = 32;

// Q8_0: 32 signed bytes scaled by one f16: x[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: 32 nibbles, low nibbles hold elements 0..15 and high nibbles 16..31:
// x[i] = d * (nibble - 8).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_1: x[i] = d * nibble + m (nibbles as Q4_0).
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0: x[i] = d * (u - 16), u = nibble (as Q4_0) + 16 * bit i of qh.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1: x[i] = d * u + m, u as Q5_0's.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// The "K" types: super-blocks of 256 elements split into sub-blocks that have
// their own small integer scales, themselves scaled by f16 super-block scales.
constexpr int kQK_K = 256;

// Q4_K: 8 sub-blocks of 32; sub-block j has a 6-bit scale sc[j] and 6-bit
// min m[j] (packed into `scales`, see k_scale_min): x = d*sc[j]*q - dmin*m[j]
// with q in 0..15. Bytes qs[32p .. 32p+31] hold sub-block 2p in their low
// nibbles and sub-block 2p+1 in their high nibbles.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K: Q4_K plus a fifth bit: element l of sub-block j (l < 32) adds 16 when
// bit j of qh[l] is set, so q is in 0..31.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales: x = d * scales[i/16] *
// (u - 32), u in 0..63. Per half h (128 elements) and l < 32, u of elements
// 128h + l + 32s (s = 0..3) has its low 4 bits in ql[64h + l + 32(s&1)]
// (low nibble for s < 2, high for s >= 2) and its high 2 bits in bits 2s..2s+1
// of qh[32h + l].
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Element i's (0..255) unsigned quant u (0..63) of a Q6_K block.
inline int q6_k_quant(const BlockQ6_K& b, int i) {
  const int h = i / 128, s = (i % 128) / 32, l = i % 32;
  const uint8_t lo = b.ql[64 * h + l + 32 * (s & 1)];
  return (s < 2 ? lo & 0x0f : lo >> 4) | (((b.qh[32 * h + l] >> (2 * s)) & 3) << 4);
}

// Q2_K: 16 sub-blocks of 16, sub-block k with a 4-bit scale (low nibble of
// scales[k]) and a 4-bit min (high nibble): x = d * sc[k] * q - dmin * m[k],
// q in 0..3. Element 128h + 32s + l (l < 32) has its q at bits 2s..2s+1 of
// qs[32h + l]; it is in sub-block 8h + 2s + l / 16.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// Element i's (0..255) quant (0..3) of a Q2_K block.
inline int q2_k_quant(const BlockQ2_K& b, int i) {
  const int h = i / 128, s = (i % 128) / 32, l = i % 32;
  return (b.qs[32 * h + l] >> (2 * s)) & 3;
}

// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales: x = d * sc[i/16] * q,
// q in -4..3. Element 128h + 32s + l (l < 32) has its low 2 bits at bits
// 2s..2s+1 of qs[32h + l]; q = low - 4 unless bit 4h + s of hmask[l] is set.
// Scale k's low 4 bits are the low (k < 8) or high nibble of scales[k % 8],
// its top 2 bits bits 2(k/4)..2(k/4)+1 of scales[8 + k % 4]; sc = that - 32.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// Element i's (0..255) quant (-4..3) of a Q3_K block.
inline int q3_k_quant(const BlockQ3_K& b, int i) {
  const int h = i / 128, s = (i % 128) / 32, l = i % 32;
  const int low = (b.qs[32 * h + l] >> (2 * s)) & 3;
  return ((b.hmask[l] >> (4 * h + s)) & 1) ? low : low - 4;
}

// Sub-block k's (0..15) scale (-32..31) of a Q3_K block.
inline int q3_k_scale(const BlockQ3_K& b, int k) {
  const int low = k < 8 ? b.scales[k] & 0x0f : b.scales[k - 8] >> 4;
  return (low | (((b.scales[8 + k % 4] >> (2 * (k / 4))) & 3) << 4)) - 32;
}

// IQ4_NL: 32 elements, x = d * kIq4nlValues[nibble], nibbles ordered as
// Q4_0's (low nibbles elements 0..15, high nibbles 16..31). llama-quantize
// writes it for rows that are not whole super-blocks in Q2_K/Q3_K files.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockIQ4_NL) == 18);
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,   38,  53,  69,  89,  113};

// IQ4_XS: 8 sub-blocks of 32 with signed 6-bit scales over IQ4_NL's table:
// x = d * sc[i/32] * kIq4nlValues[nibble]. Sub-block j's nibbles are
// qs[16j .. 16j+15], ordered as IQ4_NL's (low nibbles its elements 0..15).
// Its scale's low 4 bits are nibble j % 2 of scales_l[j / 2], its top 2 bits
// bits 2j..2j+1 of scales_h; sc = that - 32.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// Sub-block j's (0..7) scale (-32..31) of an IQ4_XS block.
inline int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
  const int low = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
  return (low | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32;
}

// Sub-block j's (0..7) 6-bit scale and min from a Q4_K/Q5_K `scales` array:
// j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 in the nibbles of
// byte j + 4 with their top 2 bits in the top bits of bytes j - 4 and j.
inline void k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace reprise
