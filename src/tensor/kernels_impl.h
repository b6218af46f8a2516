// Internal interface between the kernel driver (kernels.cpp) and the
// per-ISA implementations (kernels_avx2.cpp, kernels_avx512.cpp).
//
// Packed weight layout ("row groups"). Rows are taken kGroupRows at a time;
// the last group is padded with zero rows. A group is a sequence of units
// (below: one k, one block or one section each). Groups are stored
// interleaved in super-groups of f (PackedMatrix::interleave): super-group
// i holds groups fi .. fi+f-1 (fewer in the last), unit by unit, each
// unit's groups in order; f = 1 is each group's units contiguous. A decode
// tile of f groups then reads one sequential stream.
// Or groups are dealt round-robin to S regions (PackedMatrix::regions,
// with f = 1): group g is the (g / S)-th group of region g % S, and a region
// holds ceil(n_groups / S) groups. A decode tile of S groups then reads S
// streams a region apart, each advancing one group per tile, which read
// memory faster than one interleaved stream for the F and K types (decode
// 1.06-1.34x) and, on AVX2, the block types (IsaKernels::regions_*;
// docs/performance.md, Decode streams). The units:
//   F32 / F16 / BF16: for each input index k: the 16 rows' elements at k
//                     (64 / 32 / 32 bytes), k-major.
//   Q8_0: for each 32-element block b: 16 f16 scales (32 bytes), then 8 chunks
//         of 64 bytes: chunk c holds, for each row, elements 4c..4c+3 of the
//         block as unsigned bytes (q + 128). 544 bytes per block.
//   Q4_0: for each block b: 16 f16 scales (32 bytes), then 4 chunks of 64
//         bytes: chunk c holds, for each row, the block's packed bytes
//         4c..4c+3 (low nibbles: elements 4c..4c+3, high nibbles: elements
//         16+4c..16+4c+3). 288 bytes per block.
//   Q4_1: for each block: 16 f16 scales, 16 f16 mins, then Q4_0's 4 chunks.
//         320 bytes per block.
//   Q5_0: for each block: Q4_0's layout, then a 64-byte plane of fifth bits:
//         row r's byte i has, at bit k, the bit of element 4k + i (so chunk
//         c's low nibbles take bit c, its high nibbles bit 4 + c). 352 bytes.
//   Q5_1: Q4_1's layout, then Q5_0's plane. 384 bytes.
//   IQ4_NL: Q4_0's layout (the nibbles index kIq4nlValues). 288 bytes.
//   K types, per 256-element super-block ("section"; k ranges given to these
//   kernels are whole super-blocks), sub-block scales unpacked to bytes:
//   Q4_K: 16 f32 d, 16 f32 dmin, 8 x 16 scales (u8), then the mins (u8) per
//         sub-block pair p: 16 rows x (m[2p], m[2p+1]), 32 bytes; then
//         for each sub-block pair p 8 chunks of 64 bytes: chunk c holds, for
//         each row, the pair's packed bytes 4c..4c+3 (low nibbles: sub-block
//         2p elements 4c..4c+3, high nibbles: sub-block 2p+1's). 2432 bytes.
//   Q5_K: Q4_K's header, then the quants u (0..31) of each 32-element
//         sub-block j in five 64-byte lines L0..L4: line l, row r, bytes
//         4r..4r+3 hold u of chunk l (elements 4l..4l+3) in bits 0-4, and
//         bits 5-7 carry the other three chunks: L0 bits 5-7 and L1 bits
//         5-6 chunk 5's bits 0-2 and 3-4, L2 and L3 likewise chunk 6's,
//         L4 bits 5-7 chunk 7's bits 0-2, L1 bit 7 its bit 3, L3 bit 7 its
//         bit 4. Five chunks are a mask each, the other three two or three
//         shifts and as many logic operations, a sub-block's lines read
//         front to back (the former nibbles plus fifth-bit planes took ~26
//         operations per 8 chunks, this 19). 2944 bytes.
//   Q2_K: 16 f32 d, 16 f32 dmin, then for each quad q = 2h + b (h, b in
//         0..1) its four sub-blocks' scales (u8; sub-block 8h + 2s + b's 16
//         bytes at 16s) and its 4 chunks of 64 bytes: chunk c holds, for
//         each row, the file's bytes qs[32h + 16b + 4c .. +3], whose bits
//         2s..2s+1 are elements 4c..4c+3 of sub-block 8h + 2s + b; then the
//         mins (u8) per 32-element block i: 16 rows x (m[2i], m[2i+1]), 32
//         bytes. Each quad's scales right before its chunks, so that a
//         section is read front to back. 1664 bytes (3.25 bits per weight;
//         the file's 2.625).
//   Q3_K: 16 f32 d, 16 x 16 scales (i8, -32..31), then the values u = q + 4
//         (0..7) of each pair m of 16-element sub-blocks (X = 2m, Y = 2m + 1:
//         elements 32m..32m + 31) in three 64-byte lines A, B, C: line l, row
//         r, bytes 4r..4r+3 hold u of X's chunk l (elements 4l..4l+3) in bits
//         0-2 and of Y's chunk l in bits 3-5; bits 6-7 carry both sub-blocks'
//         chunk 3: A bits 6-7 X's bits 0-1, B bit 6 X's bit 2, B bit 7 Y's
//         bit 0, C bits 6-7 Y's bits 1-2. Six chunks are a mask each (Y's read
//         as 8u), the other two two shifts and two logic operations; the
//         former low-bit quads plus high-bit planes took ~28 operations and 16
//         loads per 8 chunks, this 14 and 3 (docs/performance.md, Q3_K in
//         three lines a sub-block pair). 1856 bytes (3.625 bits per weight;
//         the file's 3.4375).
//   Q6_K: 16 f32 d, 16 x 16 scales (i8), then the quants u (q + 32, 0..63)
//         in quads of three 64-byte lines A, B, C: pair p's quad q holds,
//         for each row r, bytes 4r..4r+3 of A: u of elements 4q..4q+3 of
//         sub-block 2p, of B: elements 16+4q.. of sub-block 2p, of C:
//         elements 4q.. of sub-block 2p+1, each byte's bits 6-7 holding
//         bits 0-1 (A), 2-3 (B), 4-5 (C) of u of the same element of
//         sub-block 2p+1's second half (16+4q+i). Three of the four chunks
//         are one mask from their lines, the fourth two shifts and three
//         logic operations; the former nibble-plus-plane layout took 11
//         operations per four chunks (docs/performance.md, Q6_K in quads).
//         3392 bytes (6.6 bits per weight; the file's 6.56).
//   IQ4_XS: 16 f32 d, 8 x 16 scales (i8, -32..31), then for each sub-block
//         j 4 chunks of 64 bytes: chunk c holds, for each row, the file's
//         bytes qs[16j + 4c .. 16j + 4c + 3] (as Q4_0's: low nibbles index
//         elements 4c..4c+3 of the sub-block, high nibbles 16+4c..16+4c+3).
//         2240 bytes (4.4 bits per weight; the file's 4.25).
//   Q6_K wide (a prompt's scratch only, see matmul_q6_k_wide; Q6_K and Q3_K
//         sections widen to it): the same d and scales, then for each 32-element block j 8 chunks of 64 bytes: chunk
//         c holds, for each row, u of elements 4c..4c+3. 4416 bytes.
// Vectors run across the 16 rows of a group, so every output is accumulated
// on its own, in input order, by the same operations whatever the tile shape
// or instruction set:
//   F32/F16/BF16: y = fma(w[k], x[k], y) for k = 0, 1, ... (y starts at +0)
//   Q8_0/Q4_0:    y = fma(f32(dw[b]) * f32(dx[b]), float(isum[b]), y) for
//                 b = 0, 1, ..., where isum[b] is the exact integer dot of the
//                 block's quants (Q4_0 quants are nibble - 8).
//   Q5_0:         as Q4_0, quants u - 16.
//   IQ4_NL:       as Q8_0, quants kIq4nlValues[nibble] (ggml's
//                 vec_dot_iq4_nl_q8_0).
//   Q4_1/Q5_1:    y = fma(f32(dw[b]) * f32(dx[b]), float(isum[b]), y), then
//                 y = fma(f32(mw[b]) * f32(dx[b]), float(xsum[b]), y), isum
//                 the exact dot of the unsigned quants, xsum the sum of the
//                 activation quants.
//   Q4_K/Q5_K:    per super-block s (8 sub-blocks j of 32 elements):
//                 y = fma(d[s] * dx[s], float(isum[s]), y), then
//                 y = fma(dmin[s] * dx[s], float(-msum[s]), y), where
//                 isum[s] = sum_j sc[j] * (exact dot of sub-block j's unsigned
//                 quants with the activation quants) and msum[s] = sum_j
//                 m[j] * (sum of sub-block j's activation quants), exact
//                 integers.
//   Q2_K:         as Q4_K over 16 sub-blocks of 16 (sc, m 0..15; quants
//                 0..3), the integers of ggml's x86 vec_dot_q2_K_q8_K.
//   Q6_K:         per super-block s: y = fma(d[s] * dx[s], float(isum[s]), y),
//                 isum[s] = sum over its 16 sixteen-element halves i of
//                 sc[i] * dot(u - 32, x over the half), exact integers.
//   Q3_K:         as Q6_K (q = u - 32 there, -4..3 here): the integers of
//                 ggml's x86 vec_dot_q3_K_q8_K.
//   IQ4_XS:       as Q6_K over the 8 sub-blocks of 32: isum[s] = sum_j sc[j] *
//                 dot(kIq4nlValues[nibble], x over sub-block j) (the
//                 integers of ggml's x86 vec_dot_iq4_xs_q8_K).
// Activations for the K types and IQ4_XS are Q8_K (one f32 scale dx per 256
// elements, ggml's quantize_row_q8_K, as ggml's CPU backend quantizes them
// for these types); for the others they are Q8_0 blocks of 32 (ggml's AVX2
// rule).
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/attention_tiled.h"
#include "tensor/key_layout.h"
#include "tensor/quant_blocks.h"
#include "tensor/ssm_scan.h"

namespace reprise::kernels {

constexpr int kGroupRows = 16;

// One 32-element block of activations in the form the integer kernels read:
// quants, scale as f32, the offset corrections for unsigned weights
// (-128 * sum(qs) for Q8_0 stored as q + 128; -8 * sum(qs) for Q4_0 nibbles),
// and the sums of the first and last 16 quants (the K types' sub-blocks).
// Q8_K activations are 8 consecutive blocks sharing one d (corrections 0).
struct XBlock {
  int8_t qs[kQK8_0];
  float d;
  int32_t corr_q8;
  int32_t corr_q4;
  int16_t sum_lo;
  int16_t sum_hi;
};
static_assert(sizeof(XBlock) == 48);

// Negated activation sums as the 16-bit halves of one word, for vpdpwssd /
// vpmaddwd against a pair of byte mins: the halves' sums of one block
// -(elements 0..15, 16..31) (Q2_K's mins per 16), or the sums of two blocks
// -(even, odd) (Q4_K/Q5_K's mins per 32). Scalar and static: each ISA file
// gets its own copy, compiled with its own instruction set.
static inline int32_t neg_xsum_halves(const XBlock& xb) {
  const auto lo = static_cast<uint16_t>(-xb.sum_lo);
  const auto hi = static_cast<uint16_t>(-xb.sum_hi);
  return static_cast<int32_t>(lo | (static_cast<uint32_t>(hi) << 16));
}
static inline int32_t neg_xsum_pair(const XBlock& even, const XBlock& odd) {
  const auto lo = static_cast<uint16_t>(-(even.sum_lo + even.sum_hi));
  const auto hi = static_cast<uint16_t>(-(odd.sum_lo + odd.sum_hi));
  return static_cast<int32_t>(lo | (static_cast<uint32_t>(hi) << 16));
}

// Packed section bytes per 256-element super-block (see the layout above).
constexpr size_t kSectionQ4K = 2432;
constexpr size_t kSectionQ5K = 2944;
constexpr size_t kSectionQ6K = 3392;
// Where a Q4_K/Q5_K section's scales, min pairs and nibble chunks start.
constexpr size_t kQ4KScales = 128;
constexpr size_t kQ4KMins = 256;
constexpr size_t kQ4KNibbles = 384;
// Where line l (0..4) of a Q5_K section's sub-block j sits (see above).
constexpr size_t q5k_line_at(int j, int l) { return kQ4KNibbles + j * 320 + l * 64; }
// Where a Q6_K section's quants start, and line `line` (0: A, 1: B, 2: C)
// of pair p's quad q (see the layout above).
constexpr size_t kQ6KQuants = 320;
constexpr size_t q6k_line_at(int p, int q, int line) { return kQ6KQuants + p * 768 + q * 192 + line * 64; }
constexpr size_t kSectionQ6KWide = 4416;
// Where a Q2_K section's quads (each its scale line, then its chunks) and
// min pairs start.
constexpr size_t kQ2KQuads = 128;
constexpr size_t kQ2KMins = kQ2KQuads + 4 * 320;
constexpr size_t kSectionQ2K = kQ2KMins + 8 * 32;
// Sub-block k's 16 scale bytes; quad q's chunk c.
constexpr size_t q2k_scales_at(int k) { return kQ2KQuads + (2 * (k / 8) + k % 2) * 320 + (k % 8) / 2 * 16; }
constexpr size_t q2k_line_at(int quad, int c) { return kQ2KQuads + quad * 320 + 64 + c * 64; }
// Where a Q3_K section's scales and quant lines start (d and scales where
// Q6_K's are: a prompt widens Q3_K to Q6_K wide); line l of sub-block pair m.
constexpr size_t kQ3KScales = 64;
constexpr size_t kQ3KQuants = 320;
constexpr size_t kSectionQ3K = kQ3KQuants + 8 * 192;
constexpr size_t q3k_line_at(int m, int l) { return kQ3KQuants + m * 192 + l * 64; }
// Where an IQ4_XS section's scales and nibble chunks start.
constexpr size_t kIq4XsScales = 64;
constexpr size_t kIq4XsNibbles = 192;
constexpr size_t kSectionIq4Xs = kIq4XsNibbles + 8 * 256;
// IQ4_NL's table as the kernels look nibbles up: signed (the AVX2 kernels'
// sign trick) and plus 128 (unsigned, for vpdpbusd; the activations' -128 *
// sum corrects it, as for Q8_0's stored q + 128).
inline constexpr auto kIq4nlSigned = [] {
  struct Table {
    alignas(16) int8_t v[16];
  } t{};
  for (int i = 0; i < 16; ++i) t.v[i] = kIq4nlValues[i];
  return t;
}();
inline constexpr auto kIq4nlBiased = [] {
  struct Table {
    alignas(16) uint8_t v[16];
  } t{};
  for (int i = 0; i < 16; ++i) t.v[i] = static_cast<uint8_t>(kIq4nlValues[i] + 128);
  return t;
}();

// The per-type facts both ISA files' kernels (and the driver's sizes) read:
// constants only, no code, so sharing them shares nothing compiled for one
// instruction set with the other.
// 32-element block types: bytes before the quants (f16 scales, and mins)
// and per block.
enum class QType { Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4NL };
template <QType Q>
constexpr bool kHasMin = Q == QType::Q4_1 || Q == QType::Q5_1;
template <QType Q>
constexpr bool kHasFifthBit = Q == QType::Q5_0 || Q == QType::Q5_1;
template <QType Q>
constexpr size_t kQuantOffset = kHasMin<Q> ? 64 : 32;
template <QType Q>
constexpr size_t kBlockBytes = Q == QType::Q8_0 ? 32 + 512 : kQuantOffset<Q> + 256 + (kHasFifthBit<Q> ? 64 : 0);
// K types (Q6KWide: a prompt's widened Q6_K scratch): bytes per section.
enum class KType { Q4K, Q5K, Q6K, Q6KWide, IQ4XS, Q2K, Q3K };
template <KType KT>
constexpr size_t kSection = KT == KType::Q2K       ? kSectionQ2K
                             : KT == KType::Q3K     ? kSectionQ3K
                             : KT == KType::Q4K     ? kSectionQ4K
                             : KT == KType::Q5K     ? kSectionQ5K
                             : KT == KType::Q6K     ? kSectionQ6K
                             : KT == KType::Q6KWide ? kSectionQ6KWide
                                                    : kSectionIq4Xs;

// Activations are stored in token tiles of x_tile tokens: element k (a float
// for F-types, an XBlock per block for Q types) of token t is at
//   (t / x_tile) * x_tile * x_k + k * x_tile + t % x_tile
// so a kernel reads one pointer for all tokens of a tile. x_k is n_in for
// F-types and n_in / 32 for Q types. Full tiles are allocated (the last is
// padded).
constexpr int kTokenTile = 12;

inline int64_t x_offset(int64_t t, int64_t k, int64_t x_tile, int64_t x_k) {
  return (t / x_tile) * x_tile * x_k + k * x_tile + t % x_tile;
}

struct MatmulArgs;

// A buffer of packed groups: n_groups groups of group_bytes, interleaved in
// super-groups of `interleave` (the layout above).
// Groups a layout stores for n_groups: with regions > 1, every region holds
// ceil(n_groups / regions) groups (the last ones padded); else n_groups.
inline int64_t stored_groups(int64_t n_groups, int64_t regions) {
  return regions > 1 ? (n_groups + regions - 1) / regions * regions : n_groups;
}

struct GroupLayout {
  const uint8_t* base;
  size_t group_bytes;
  size_t unit_bytes;
  int64_t n_groups;
  int64_t interleave;
  int64_t regions = 0;  // > 1: groups dealt round-robin to this many regions (interleave 1)

  // Points a.w and its strides at groups [g, g + n) and returns how many of
  // them the strides reach: the rest of g's super-group (with regions: of
  // the S groups g / S * S .. that sit at the same place in each region), at
  // most n.
  inline int64_t point(int64_t g, int64_t n, MatmulArgs& a) const;
  // Group g's unit 0, and the bytes from one of its units to the next.
  inline const uint8_t* group(int64_t g, size_t* unit_stride) const;
};

// Computes y[(t0 + t) * y_stride + r] for tokens t in [0, n_tokens) and the
// rows of groups [0, n_groups) (groups g_first.. of `layout`); rows at or
// beyond n_rows (relative to the first group) are not written. t0 must
// be a multiple of the kernels' tile sizes (multiples of kTokenTile are).
// Only inputs [k_begin, k_end) are accumulated (multiples of 32 for Q8_0/Q4_0,
// of 256 for the K types):
// when k_begin > 0 the accumulators start from the values in y, so running
// consecutive k ranges gives the same bits as one pass over all of k.
//
// The tile runner (tile_runner.h) hands each kernel tile a copy whose groups
// lie in one super-group, with w, group_stride and unit_stride set: group
// g's unit u (one k for the F types, one 32-element block for the Q types,
// one section for the K types) is at
//   w + g * group_stride + u * unit_stride,
// so one kernel reads contiguous groups (group_stride = a group's bytes,
// unit_stride = a unit's) and interleaved ones (group_stride = a unit's
// bytes, unit_stride = the super-group's units).
struct MatmulArgs {
  GroupLayout layout;
  int64_t g_first;
  int64_t n_groups;
  int64_t n_rows;
  const void* x;
  int64_t x_tile;
  int64_t x_k;
  int64_t t0;
  int64_t n_tokens;
  int64_t n_in;
  int64_t k_begin;
  int64_t k_end;
  float* y;
  int64_t y_stride;
  // Decode tiles prefetch this many bytes ahead in each weight stream (0: off).
  int64_t prefetch;
  // Multi-token tiles of the first token tile request the next tile's
  // weights as they compute (prefetch_next_groups, tile_runner.h).
  bool prefetch_next = false;
  // Set by the tile runner (see above).
  const uint8_t* w;
  size_t group_stride;
  size_t unit_stride;
};

int64_t GroupLayout::point(int64_t g, int64_t n, MatmulArgs& a) const {
  if (regions > 1) {
    const int64_t region_groups = stored_groups(n_groups, regions) / regions, in_region = g % regions;
    a.w = base + (in_region * region_groups + g / regions) * group_bytes;
    a.group_stride = region_groups * group_bytes;
    a.unit_stride = unit_bytes;
    return regions - in_region < n ? regions - in_region : n;
  }
  if (interleave == 1) {
    a.w = base + g * group_bytes;
    a.group_stride = group_bytes;
    a.unit_stride = unit_bytes;
    return n;
  }
  const int64_t first = g / interleave * interleave;
  const int64_t in_super = n_groups - first < interleave ? n_groups - first : interleave;
  a.w = base + first * group_bytes + (g - first) * unit_bytes;
  a.group_stride = unit_bytes;
  a.unit_stride = in_super * unit_bytes;
  return first + in_super - g < n ? first + in_super - g : n;
}

const uint8_t* GroupLayout::group(int64_t g, size_t* unit_stride) const {
  MatmulArgs a;
  point(g, 1, a);
  *unit_stride = a.unit_stride;
  return a.w;
}

// Attention for a run of queries of one head against keys whose K rows are
// stored transposed in blocks of 16 (kt: [block][d][16] floats, block 0
// starting at position `base`) and V rows as floats (v: [pos - base][d]).
// q rows (n_q of them, q_stride apart) are f16-rounded. Query i attends to
// [first[i], end[i]). The arithmetic per (query, key) is that of the
// per-query path in kernels.cpp (attend_interleaved), so results are identical.
struct AttnArgs {
  const float* q;
  int64_t q_stride;
  int64_t n_q;
  const int64_t* first;
  const int64_t* end;
  int64_t d;
  float scale;
  const float* kt;
  const float* v;
  int64_t base;
  float* out;
  int64_t out_stride;
};

// Widens positions p0 .. p0+15 (p0 a multiple of 16) of one KV head for the
// batched attention kernels: its keys into kt ([d][16] floats, 64-byte
// aligned) and its values (elements v_off .. v_off + d of each f16 row) into
// v (16 rows of d floats). Positions outside [lo, hi) are written as zeros
// (their rows may not exist).
void widen_kv_block(const KeyView& keys, const uint16_t* const* value_rows, int64_t v_off, int64_t p0, int64_t lo,
                    int64_t hi, float* kt, float* v);

// Single-query attention (decode): H = n_heads query rows of one token (q,
// d floats each, f16-rounded) against positions [first, end) whose K and V
// are read as f16 straight from the KV store (head h's keys are those of
// KeyView{key_rows, k_off[h], key_group, d}, its values start at v_off[h]
// elements of each value row). The arithmetic per (query, key) is that of
// attend_interleaved in kernels.cpp, so results are identical; the kernel
// interleaves the heads so their serial f16 accumulator chains overlap.
struct AttnRowsArgs {
  const float* q;
  int64_t n_heads;
  const int64_t* k_off;
  const int64_t* v_off;
  const uint16_t* const* key_rows;
  int64_t key_group;
  const uint16_t* const* value_rows;
  int64_t first;
  int64_t end;
  int64_t d;
  float scale;
  float* out;  // n_heads rows of d floats
};

// glibc's expf (Arm optimized-routines: 32-entry 2^(i/32) table, cubic in
// double precision), used by attention's online softmax exactly as ggml's
// flash attention calls expf. Vector versions reproduce it bit for bit.
namespace glibc_expf {
inline constexpr uint64_t kTable[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
// The same entries as 32-bit halves, for in-register lookups (AVX2 gathers
// cost ~24 cycles per 4 lanes on CPUs with the gather-data-sampling
// microcode fix, as measured on the 2-vCPU VM).
struct SplitTable {
  alignas(32) uint32_t lo[32];
  alignas(32) uint32_t hi[32];
};
inline constexpr SplitTable kSplitTable = [] {
  SplitTable t{};
  for (int i = 0; i < 32; ++i) {
    t.lo[i] = static_cast<uint32_t>(kTable[i]);
    t.hi[i] = static_cast<uint32_t>(kTable[i] >> 32);
  }
  return t;
}();
constexpr double kN = 32;
constexpr double kInvLn2N = 0x1.71547652b82fep+0 * kN;
constexpr double kShift = 0x1.8p+52;
constexpr double kC0 = 0x1.c6af84b912394p-5 / kN / kN / kN;
constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / kN / kN;
constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / kN;
constexpr float kOverflow = 0x1.62e42ep6f;    // above: +inf
constexpr float kUnderflow = -0x1.9fe368p6f;  // below: +0
}  // namespace glibc_expf

struct IsaKernels {
  const char* name;
  void (*matmul_f32)(const MatmulArgs&);
  void (*matmul_f16)(const MatmulArgs&);
  void (*matmul_bf16)(const MatmulArgs&);
  void (*matmul_q8_0)(const MatmulArgs&);
  void (*matmul_q4_0)(const MatmulArgs&);
  void (*matmul_q4_1)(const MatmulArgs&);
  void (*matmul_q5_0)(const MatmulArgs&);
  void (*matmul_q5_1)(const MatmulArgs&);
  void (*matmul_q2_k)(const MatmulArgs&);
  void (*matmul_q3_k)(const MatmulArgs&);
  void (*matmul_q4_k)(const MatmulArgs&);
  void (*matmul_q5_k)(const MatmulArgs&);
  void (*matmul_q6_k)(const MatmulArgs&);
  // Q6_K or Q3_K groups widened to bytes (the "Q6_K wide" layout): the same
  // bits as matmul_q6_k / matmul_q3_k without unpacking the quants for every token tile.
  void (*matmul_q6_k_wide)(const MatmulArgs&);
  void (*matmul_iq4_nl)(const MatmulArgs&);
  void (*matmul_iq4_xs)(const MatmulArgs&);
  // Sums bytes [0, n) of p (n a multiple of 512) with the widest loads,
  // read as `streams` (8 or 1) sequential streams; the result only defeats
  // dead-code elimination.
  uint64_t (*read_sum)(const uint8_t* p, size_t n, int streams);
  // Packs nt <= tile token rows of x (n_in floats each) into one activation
  // tile ([k][tile] floats; tokens nt..tile-1 zero), rounding each value to
  // f16 (round = 1), bf16 (round = 2) or not at all (round = 0). Null: the
  // driver's generic path.
  void (*pack_f_tile)(const float* x, int64_t n_in, int nt, int tile, int round, float* out);
  // Quantizes n_blocks consecutive 32-float blocks of x to Q8_0 activation
  // blocks out[b * out_stride] by ggml's AVX2 rule (kernels_avx2.cpp), the
  // same bits on every ISA.
  void (*quantize_q8)(const float* x, int64_t n_blocks, XBlock* out, int64_t out_stride);
  // Quantizes n_sections 256-float sections to Q8_K activation blocks by
  // quantize_q8_k's rule (below), the same bits on every ISA.
  void (*quantize_q8_k)(const float* x, int64_t n_sections, XBlock* out, int64_t out_stride);
  // Null when the ISA has no batched attention kernel, or for head sizes it
  // does not handle (attention_supports).
  void (*attention)(const AttnArgs&);
  bool (*attention_supports)(int64_t head_dim);
  // Null when the ISA has no decode attention kernel, or for head sizes it
  // does not handle (attend_rows_supports).
  void (*attend_rows)(const AttnRowsArgs&);
  bool (*attend_rows_supports)(int64_t head_dim);
  // Prompt rows with the tiled numerics (attention_tiled.h); every ISA's
  // gives the same bits.
  void (*attend_tiled)(const TiledKv& kv, const TiledGroup* groups, int n_groups, float scale);
  // Decode rows with the same numerics, K and V read as f16 rows in place
  // (attend_tiled_rows in attention_tiled.h).
  void (*attend_tiled_rows)(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t d,
                            int64_t key_group, const TiledGroup* groups, int n_groups, float scale);
  // The super-group PackedMatrix interleaves by default for the F types, the
  // 32-element block types and the K types: the decode tile's width, where
  // that measured faster (docs/performance.md, Interleaved super-groups).
  int interleave_f;
  int interleave_q;
  int interleave_k;
  // Q6_K's and Q3_K's own: their AVX-512 decode tiles read one group at a
  // time, each a single sequential stream in the contiguous layout (1):
  // 60M tg128 Q6_K 1.13x, Q3_K 1.37x the 4-group tile over 4 interleaved
  // groups or regions (docs/performance.md, Q6_K and Q3_K decode read one
  // stream).
  int interleave_q6_k;
  // The regions (kernels_impl.h's layout) PackedMatrix deals the F types',
  // the K types' and the 32-element block types' groups to by default,
  // instead of interleaving them: the decode tile's width, where that
  // measured faster; 0 keeps the interleaved layout (AVX-512's block types
  // read one interleaved stream faster).
  int regions_f;
  // The F types' regions for matrices of more than kLongMatrixBytes
  // (kernels.cpp): where a thread's share of a product is long, more
  // streams read it faster; short products start fewer streams faster.
  int regions_f_long;
  int regions_k;
  int regions_q;
  // Q6_K's and Q3_K's own (Q3_K runs Q6_K's rule): AVX-512 reads them
  // from contiguous groups (interleave_q6_k), AVX2 from regions.
  int regions_q6_k;
  // Q8_0's own: on AVX-512 its single-token tile reads 8 regions' streams
  // faster than one interleaved stream, and its small batches read whole
  // region rows in one pass (tile_q_rows); the other block types keep
  // regions_q.
  int regions_q8_0;
  // Heads of different KV heads a decode attention task takes together
  // when each has one query (multi-head attention): 2 where
  // attend_tiled_rows interleaves two heads' FMA chains (AVX-512).
  int tiled_heads_together;
  // How far ahead (bytes) decode tiles prefetch each weight stream into L1
  // (MatmulArgs::prefetch) for the F types, the 32-element block types and
  // the K types; tuned per ISA on the 2-vCPU VM (docs/performance.md,
  // Decode prefetch distances). On AVX-512 the F types read 4 or 8 region
  // streams (regions_f, regions_f_long), 256 bytes ahead each; the block
  // types one interleaved stream, which the distance reaches in whole rows
  // (tile_runner.h, rows_ahead): 1088 is 2 rows of Q8_0 (8.7 KB), 4 of Q4_0.
  int64_t decode_prefetch_f;
  int64_t decode_prefetch_q;
  int64_t decode_prefetch_k;
  // The selective scans (ssm_scan.h); every ISA's give the same bits.
  void (*mamba1_scan)(const Mamba1Scan& s);
  void (*mamba2_scan)(const Mamba2Scan& s);
  // g[i] = silu(g[i]) * u[i] (gelu_mul: GELU's sigmoid form) for the
  // leading elements that fill whole vectors; returns how many it did, and
  // the driver's (kernels.cpp) 8-lane loop does the rest. The same
  // operations per element as the driver's, so the same bits. Null: the
  // driver does all.
  int64_t (*silu_mul)(float* g, const float* u, int64_t n);
  int64_t (*gelu_mul)(float* g, const float* u, int64_t n);
};

// The AVX-512 tiled attention kernel (attention_tiled_avx512.cpp).
void attend_tiled_avx512(const TiledKv& kv, const TiledGroup* groups, int n_groups, float scale);
void attend_tiled_rows_avx512(const uint16_t* const* key_rows, const uint16_t* const* value_rows, int64_t d,
                              int64_t key_group, const TiledGroup* groups, int n_groups, float scale);

// The AVX2 batched attention (attention_avx2.cpp): the AVX2 table's kernel,
// and the fallback for head sizes another ISA's kernel does not take.
void attention_avx2(const AttnArgs& a);
bool attention_avx2_supports(int64_t head_dim);
// The per-key score (kernels.cpp, Attention) of one query q (f16 values)
// against the 16 keys of a widened tile kt ([d][16] floats: element i of key
// j at kt[16 i + j]), into out[0..15], computed with the keys across lanes.
void score16_avx2(const float* q, const float* kt, int64_t d, float* out);

const IsaKernels& avx2_kernels();
// avx2_kernels() with vpdpbusd for the integer products
// (kernels_avx2_vnni.cpp): the same bits. Only valid when the CPU supports
// AVX-VNNI.
const IsaKernels& avx2_vnni_kernels();
// The table of the instruction set kernel_isa() selects (kernels.cpp).
const IsaKernels& isa_kernels();
// Quantizes n_sections consecutive 256-float sections of x to Q8_K
// activations (8 XBlocks each, out[b * out_stride] for block b) by ggml's
// quantize_row_q8_K: per section, max = the first element of largest
// magnitude, q = clamp(round-half-even(x * (-127 / max)), -128, 127) (the
// clamp only matters for non-finite x), d = 1 / (-127 / max); an all-zero
// section has d = 0. The AVX2 implementation (every supported CPU's
// baseline) is the rule's; IsaKernels::quantize_q8_k of every ISA gives its
// bits.
void quantize_q8_k(const float* x, int64_t n_sections, XBlock* out, int64_t out_stride);
// The largest |x| of one 32-element block for Q8_0 activations by the rule's
// max tree (kernels_avx2.cpp quantize_q8, ggml's AVX2 order), which keeps or
// drops a NaN by its position in the block; for a block without NaN, simply
// the largest |x|. AVX2; other ISAs call it for blocks that hold a NaN.
float q8_0_block_amax(const float* x);
// Q6_K sections (packed layout) to the Q6_K wide layout, n_sections of them
// (a group holds n_in / 256). AVX2 is every supported CPU's baseline.
void widen_q6_k_sections(const uint8_t* src, int64_t n_sections, uint8_t* dst);
// The same for Q3_K sections (u = q + 32: the same integers, Q6_K's rule).
void widen_q3_k_sections(const uint8_t* src, int64_t n_sections, uint8_t* dst);
// Only valid when the CPU supports AVX-512 F/BW/VL/DQ and VNNI.
const IsaKernels& avx512_kernels();

}  // namespace reprise::kernels
