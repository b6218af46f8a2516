// CPU kernels used by the model forward passes.
//
// Determinism contract (the prefix cache relies on it): every output element
// of matmul depends only on its weight row and its activation row, never on
// how many tokens are in the batch or how work is split across threads. So a
// token's hidden state is bit-identical whether it was prefilled alone, in a
// long batch, or restored from cache and continued.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/matrix.h"
#include "tensor/thread_pool.h"

namespace reprise {

// y[t * n_out + r] = dot(W.row(r), x[t * n_in ...]) for t < n_tokens.
// Activations are converted to the weight's dot type first, as ggml does
// (F16 weights -> F16 activations, Q8_0/Q4_0 -> Q8_0 blocks, BF16 -> BF16).
void matmul(const MatrixView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

// Dequantizes row r of w into out (n_in floats): embedding lookups.
void dequantize_row(const MatrixView& w, int64_t r, float* out);

// out = x / rms(x) * weight, over n elements (weight may be null: no scale).
void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out);
// Standard layer norm with optional weight and bias.
void layer_norm(const float* x, const float* weight, const float* bias, float eps, int64_t n,
                float* out);

enum class RopeStyle { Normal, Neox };
// Rotates the first n_rot dims of each of n_heads heads (head_dim apart) at pos.
void rope(float* x, int n_heads, int head_dim, int n_rot, int64_t pos, float freq_base,
          float freq_scale, RopeStyle style);

void softmax_inplace(float* x, int64_t n);
float silu(float x);
float gelu_tanh(float x);

void convert_f32_to_f16(const float* src, uint16_t* dst, int64_t n);

// One query head attending to key/value rows [first, end) stored as f16.
// Numerics follow ggml's CPU flash-attention path (query rounded to f16,
// online softmax, f16 value accumulator) so logits track llama.cpp closely.
// Rows are fetched through callbacks so paged storage needs no copy.
using RowFetch = const uint16_t* (*)(const void* ctx, int64_t pos);
void attend_one_query(const float* q, int64_t head_dim, int64_t first, int64_t end, float scale,
                      RowFetch key, RowFetch value, const void* ctx, float* out);

// Scalar dot of two f32 rows with the same summation order as matmul's F32 path.
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace reprise
