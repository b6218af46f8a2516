// Reference (scalar) conversions between f32 rows and the on-disk GGUF types
// reprise computes with: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
// IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
//
// The quantizers of the 32-element types reproduce ggml's reference
// quantizers bit for bit (quantize_row_q8_0_ref etc., evaluated without
// fused multiply-add), so files written by the model maker look exactly like files
// llama-quantize would write, and kernel tests can build expected values from
// the same blocks ggml would have produced. The K-type quantizers are simpler
// than llama-quantize's (which searches for error-minimizing scales): they
// take each sub-block's range, so they write valid blocks of a little lower
// quality. Dequantization follows ggml's dequantize_row_* exactly.
#pragma once
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/quant_blocks.h"

namespace reprise {

// True for the types quantize_row/dequantize_row handle.
bool quantize_supported(DType t);

// Converts n f32 values to type t's layout at dst (dtype_row_bytes(t, n)
// bytes). n must be a multiple of t's block size. Throws reprise::Error for
// unsupported types or a bad n.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Expands n elements of type t at src to f32. Same preconditions.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Per-type entry points (n a multiple of 32 for the 32-element blocks, of 256 for the K types).
void quantize_row_f16(const float* src, uint16_t* dst, int64_t n);
void quantize_row_bf16(const float* src, uint16_t* dst, int64_t n);
// d = max|x| / 127, q = round(x / d) (as x * (1/d), like ggml).
void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n);
// d = (the x of largest magnitude, with its sign) / -8,
// q = min(15, trunc(x * (1/d) + 8.5)).
void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t n);

// ggml's quantize_row_q4_1_ref / q5_0_ref / q5_1_ref: Q4_1 and Q5_1 take
// d = (max - min) / levels and m = min; Q5_0 maps the signed extreme to -16.
void quantize_row_q4_1(const float* src, BlockQ4_1* dst, int64_t n);
void quantize_row_q5_0(const float* src, BlockQ5_0* dst, int64_t n);
void quantize_row_q5_1(const float* src, BlockQ5_1* dst, int64_t n);
// Per 256-element super-block: each sub-block's scale from its range (Q2_K,
// Q4_K, Q5_K: [min(0, x), max(x)]; Q6_K: the value of largest magnitude maps to
// -32), the sub-block scales quantized against the largest.
void quantize_row_q2_k(const float* src, BlockQ2_K* dst, int64_t n);
void quantize_row_q4_k(const float* src, BlockQ4_K* dst, int64_t n);
void quantize_row_q5_k(const float* src, BlockQ5_K* dst, int64_t n);
void quantize_row_q6_k(const float* src, BlockQ6_K* dst, int64_t n);
// Q3_K: as Q6_K, the largest magnitude of each 16 maps to -4.
void quantize_row_q3_k(const float* src, BlockQ3_K* dst, int64_t n);
// IQ4_NL: the largest magnitude maps to the table's -127; each element takes
// the nearest table value (llama-quantize also searches d).
void quantize_row_iq4_nl(const float* src, BlockIQ4_NL* dst, int64_t n);
// IQ4_XS: each sub-block's largest magnitude maps to the table's -127, the
// sub-block scales quantized against d = largest |scale| / 32 to -32..31;
// each element takes the nearest table value at its sub-block's step.
void quantize_row_iq4_xs(const float* src, BlockIQ4_XS* dst, int64_t n);

void dequantize_row_f16(const uint16_t* src, float* dst, int64_t n);
void dequantize_row_bf16(const uint16_t* src, float* dst, int64_t n);
void dequantize_row_q8_0(const BlockQ8_0* src, float* dst, int64_t n);
void dequantize_row_q4_0(const BlockQ4_0* src, float* dst, int64_t n);
void dequantize_row_q4_1(const BlockQ4_1* src, float* dst, int64_t n);
void dequantize_row_q5_0(const BlockQ5_0* src, float* dst, int64_t n);
void dequantize_row_q5_1(const BlockQ5_1* src, float* dst, int64_t n);
void dequantize_row_q4_k(const BlockQ4_K* src, float* dst, int64_t n);
void dequantize_row_q5_k(const BlockQ5_K* src, float* dst, int64_t n);
void dequantize_row_q6_k(const BlockQ6_K* src, float* dst, int64_t n);
void dequantize_row_q2_k(const BlockQ2_K* src, float* dst, int64_t n);
void dequantize_row_q3_k(const BlockQ3_K* src, float* dst, int64_t n);
void dequantize_row_iq4_nl(const BlockIQ4_NL* src, float* dst, int64_t n);
void dequantize_row_iq4_xs(const BlockIQ4_XS* src, float* dst, int64_t n);

}  // namespace reprise
