// Internal interface between the kernel driver (kernels.cpp) and the
// per-ISA implementations (kernels_avx2.cpp, kernels_avx512.cpp).
//
// Packed weight layout ("row groups"). Rows are taken kGroupRows at a time;
// the last group is padded with zero rows. A group's bytes are contiguous:
//   F32 / F16 / BF16: for each input index k: the 16 rows' elements at k
//                     (64 / 32 / 32 bytes), k-major.
//   Q8_0: for each 32-element block b: 16 f16 scales (32 bytes), then 8 chunks
//         of 64 bytes: chunk c holds, for each row, elements 4c..4c+3 of the
//         block as unsigned bytes (q + 128). 544 bytes per block.
//   Q4_0: for each block b: 16 f16 scales (32 bytes), then 4 chunks of 64
//         bytes: chunk c holds, for each row, the block's packed bytes
//         4c..4c+3 (low nibbles: elements 4c..4c+3, high nibbles: elements
//         16+4c..16+4c+3). 288 bytes per block.
// Vectors run across the 16 rows of a group, so every output is accumulated
// on its own, in input order, by the same operations whatever the tile shape
// or instruction set:
//   F32/F16/BF16: y = fma(w[k], x[k], y) for k = 0, 1, ... (y starts at +0)
//   Q8_0/Q4_0:    y = fma(f32(dw[b]) * f32(dx[b]), float(isum[b]), y) for
//                 b = 0, 1, ..., where isum[b] is the exact integer dot of the
//                 block's quants (Q4_0 quants are nibble - 8).
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/quant_blocks.h"

namespace reprise::kernels {

constexpr int kGroupRows = 16;

// One 32-element block of Q8_0 activations in the form the integer kernels
// read: quants, scale as f32, and the offset corrections for unsigned weights
// (-128 * sum(qs) for Q8_0 stored as q + 128; -8 * sum(qs) for Q4_0 nibbles).
struct XBlock {
  int8_t qs[kQK8_0];
  float d;
  int32_t corr_q8;
  int32_t corr_q4;
};
static_assert(sizeof(XBlock) == 44);

// Computes y[t * y_stride + row0 + r] for tokens [0, n_tokens) and the rows
// of groups [0, n_groups) starting at w (groups group_bytes apart); rows at or
// beyond n_rows (relative to the first group) are not written.
// x: F-types read floats (n_in per token, x_stride floats apart); Q types
// read XBlocks (x_stride blocks apart).
struct MatmulArgs {
  const uint8_t* w;
  size_t group_bytes;
  int64_t n_groups;
  int64_t n_rows;
  const void* x;
  int64_t x_stride;
  int64_t n_tokens;
  int64_t n_in;
  float* y;
  int64_t y_stride;
};

struct IsaKernels {
  const char* name;
  void (*matmul_f32)(const MatmulArgs&);
  void (*matmul_f16)(const MatmulArgs&);
  void (*matmul_bf16)(const MatmulArgs&);
  void (*matmul_q8_0)(const MatmulArgs&);
  void (*matmul_q4_0)(const MatmulArgs&);
  // Largest token tile the matmul kernels use (drivers split tokens in
  // multiples of it).
  int token_tile;
};

const IsaKernels& avx2_kernels();
// Only valid when the CPU supports AVX-512 F/BW/VL/DQ and VNNI.
const IsaKernels& avx512_kernels();

}  // namespace reprise::kernels
