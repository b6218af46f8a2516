// CPU kernels used by the model forward passes.
//
// Determinism contract (the prefix cache relies on it): every output element
// of matmul depends only on its weight row and its activation row, never on
// how many tokens are in the batch, how the work is tiled or how many threads
// run. So a token's hidden state is bit-identical whether it was prefilled
// alone, in a long batch, or restored from cache and continued.
//
// The kernels keep it by giving every output one canonical accumulation:
//   F32/F16/BF16 weights: y = fma(w[k], x[k], y) for k = 0, 1, ..., n_in-1,
//     starting from +0, with x rounded to the weight's type first;
//   Q8_0/Q4_0 weights: x is quantized to Q8_0 blocks, then for each block b
//     in order y = fma(f32(dw[b]) * f32(dx[b]), float(isum[b]), y), where
//     isum[b] is the exact integer dot product of the block's quants;
//   the K types likewise per 256-element super-block against Q8_K
//     activations (kernels_impl.h states every type's rule).
// Vectors run across output rows (16 at a time), never along k, so the GEMV
// (decode), every GEMM tile shape and both instruction sets (AVX2, AVX-512)
// produce the same bits. Attention is likewise per query (see below).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tensor/decode_team.h"
#include "tensor/matrix.h"
#include "tensor/prefetch_tuner.h"
#include "tensor/thread_pool.h"

namespace reprise {

// ---------------------------------------------------------------------------
// Instruction set selection. Chosen once from the CPU: AVX-512 F/BW/VL/DQ +
// VNNI when present, else AVX2 with AVX-VNNI's integer dots when present,
// else AVX2. REPRISE_ISA=avx2 or avx2vnni in the environment forces one of
// the narrower ones (when the CPU has it). Results are identical either way.
enum class KernelIsa { Avx2, Avx2Vnni, Avx512 };
KernelIsa kernel_isa();
bool kernel_isa_supported(KernelIsa isa);
// For tests and benchmarks; throws reprise::Error when unsupported.
void set_kernel_isa(KernelIsa isa);
const char* kernel_isa_name(KernelIsa isa);

// ---------------------------------------------------------------------------
// Matrix products.

// The bytes PackedMatrix takes for an n_out x n_in matrix of a supported
// type in its default layout on the current instruction set (more than the
// file's for the K types and IQ4_XS, whose scales are unpacked: a few
// percent, Q2_K's about a quarter; plus up to a few padding groups where
// groups are dealt to regions).
size_t packed_matrix_bytes(DType type, int64_t n_in, int64_t n_out);

// A weight matrix rearranged for the kernels (rows interleaved in groups of
// 16; groups interleaved in super-groups so that a decode tile reads one
// sequential stream, or dealt to regions so that it reads one stream per
// region). Packing copies the data once; the source view stays valid for
// row lookups (embeddings). Copies share the packed storage.
class PackedMatrix {
 public:
  PackedMatrix() = default;
  // interleave: groups per super-group (kernels_impl.h); 0 takes the current
  // instruction set's layout for the type (groups dealt to as many regions
  // as its decode tile has groups, or interleaved in super-groups of that
  // width, whichever measured faster: IsaKernels::regions_*). regions > 1
  // deals the groups to that many regions instead (interleave must be 0 or
  // 1). Any layout gives the same results with either instruction set; only
  // speed differs.
  explicit PackedMatrix(const MatrixView& w, int interleave = 0, int regions = 0);

  bool empty() const { return data_ == nullptr; }
  const MatrixView& view() const { return view_; }
  DType type() const { return view_.type; }
  int64_t n_in() const { return view_.n_in; }
  int64_t n_out() const { return view_.n_out; }
  size_t packed_bytes() const { return group_bytes_ * stored_groups_; }

  // Internal layout (kernels_impl.h).
  const uint8_t* groups() const { return data_.get(); }
  size_t group_bytes() const { return group_bytes_; }
  int64_t n_groups() const { return n_groups_; }
  int interleave() const { return interleave_; }
  int regions() const { return regions_; }

 private:
  MatrixView view_;
  std::shared_ptr<uint8_t[]> data_;
  size_t group_bytes_ = 0;
  int64_t n_groups_ = 0;
  int64_t stored_groups_ = 0;  // n_groups_, or regions_ whole regions (the last ones padded)
  int interleave_ = 1;
  int regions_ = 0;
};

// y[t * n_out + r] = dot(W.row(r), x[t * n_in ...]) for t < n_tokens.
// Activations are converted to the weight's dot type first, as ggml does
// (F16 weights -> F16 activations, Q8_0/Q4_0/Q5_0... -> Q8_0 blocks, the K
// types -> Q8_K sections of 256, BF16 -> BF16).
void matmul(const PackedMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);
// Same results from an unpacked view (packs the rows it needs on the fly;
// prefer PackedMatrix for weights used repeatedly).
void matmul(const MatrixView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

// Several products of the same input in one parallel pass (e.g. Q, K and V):
// ys[i] = W_i x. All matrices must have the same n_in.
struct MatmulOutput {
  const PackedMatrix* w;
  float* y;
};
void matmul_many(std::span<const MatmulOutput> outputs, const float* x, int64_t n_tokens, ThreadPool& pool);

// Whether decode products on `pool` prefetch their weights, as its tuner has
// decided per weight type ("F16 off, Q8_0 on"; see prefetch_tuner.h), or
// "fixed N bytes" under REPRISE_PREFETCH=N. For reports.
std::string decode_prefetch_summary(ThreadPool& pool);

// Dequantizes row r of w into out (n_in floats): embedding lookups.
void dequantize_row(const MatrixView& w, int64_t r, float* out);

// ---------------------------------------------------------------------------
// Element-wise and row operations.

// out = x / rms(x) * weight, over n elements (weight may be null: no scale).
// The sum of squares is accumulated in double, as ggml does.
void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out);
// Standard layer norm with optional weight and bias.
void layer_norm(const float* x, const float* weight, const float* bias, float eps, int64_t n,
                float* out);

enum class RopeStyle { Normal, Neox };
// Rotates the first n_rot dims of each of n_heads heads (head_dim apart) at pos.
void rope(float* x, int n_heads, int head_dim, int n_rot, int64_t pos, float freq_base,
          float freq_scale, RopeStyle style);
// The same rotation with precomputed cos/sin (n_rot / 2 each; rope_table).
// Pair i's angle is freq_scale * (pos * freq_base^(-2i/n_rot) / freq_factors[i]),
// in ggml's order of operations; freq_factors (n_rot / 2 values, Llama 3.1's
// `rope_freqs.weight`) may be null, meaning all ones.
void rope_table(int n_rot, int64_t pos, float freq_base, float freq_scale, const float* freq_factors, float* cos_out,
                float* sin_out);
void rope_apply(float* x, int n_heads, int head_dim, int n_rot, const float* cos_v, const float* sin_v,
                RopeStyle style);

void softmax_inplace(float* x, int64_t n);
float silu(float x);
float gelu_tanh(float x);
// g[i] = silu(g[i]) * u[i] (vectorized; silu uses expf_vec below).
void silu_mul(float* g, const float* u, int64_t n);
// x[i] = silu(x[i]), each element's bits those of silu() wherever it falls.
void silu_in_place(float* x, int64_t n);
// GELU's tanh form as x / (1 + e^(-2y)) on the vector exp (expf_vec's
// algorithm): within a few ulp of gelu_tanh, the same bits for an element
// wherever it falls in a row.
float gelu_sigmoid(float x);
// g[i] = gelu_sigmoid(g[i]) * u[i].
void gelu_mul(float* g, const float* u, int64_t n);
// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);

// e^x with ggml's vector expf algorithm (max error ~1.5 ulp), the same bits
// on every instruction set; used by SiLU, as ggml's vector SiLU does.
float expf_vec(float x);
void expf_vec(const float* x, float* out, int64_t n);
// The C library's expf (glibc >= 2.28 algorithm) vectorized with identical
// results; attention's online softmax uses it, as ggml's flash attention
// calls expf.
void expf_exact(const float* x, float* out, int64_t n);

void convert_f32_to_f16(const float* src, uint16_t* dst, int64_t n);

// ---------------------------------------------------------------------------
// Attention over f16 K/V rows.

// Batched attention for one layer: n_tokens queries of n_head heads
// (q[(t * n_head + h) * head_dim + d]) attend to positions [first[t], end[t]).
// Values: value_rows[p] points at position p's value of KV head 0, and KV
// head j's is kv_head_stride elements further (0: head_dim, whole rows; only
// with key_group 1). Keys are stored in groups of
// key_group positions (tensor/key_layout.h): KV head j's group starting at
// position g is at key_rows[g] + j * kv_head_stride, for every group start g
// of a visible position (key_rows[p] for other p is not read). Numerics follow
// ggml's CPU flash-attention path (f16 query, online softmax with expf, f16
// value accumulator) so logits track llama.cpp closely, and each query's
// result is independent of the batch it is computed in.
struct AttentionBatch {
  const float* q = nullptr;
  int64_t n_tokens = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  const int64_t* first = nullptr;
  const int64_t* end = nullptr;
  const uint16_t* const* key_rows = nullptr;
  const uint16_t* const* value_rows = nullptr;
  int64_t kv_head_stride = 0;
  int64_t key_group = 1;
  float* out = nullptr;
};
void attention(const AttentionBatch& batch, ThreadPool& pool);
// Several independent batches (one per sequence of a multi-sequence decode
// pass) in one dispatch where their kernels allow; each output is what
// attention() gives for its own batch.
void attention_many(std::span<const AttentionBatch> batches, ThreadPool& pool);

// ---------------------------------------------------------------------------
// A decode step (one token per sequence) run by a DecodeTeam
// (decode_team.h): its products and attention, split between the members
// as matmul_many and attention_many split them, each followed by a
// barrier. Same bits as the dispatched forms.

// The decode prefetch of a team step's products, one plan per product in
// the order the step runs them (by its first matrix), from the pool's tuner
// (prefetch_tuner.h); member 0 times the products it asks to time. Plan it
// before DecodeTeam::run and report it after, on the pool's caller.
struct TeamStepPlan {
  int64_t n_tokens = 1;  // the step's tokens (one per sequence), fewer than a prompt tile
  std::vector<PrefetchTuner::Plan> plans;
  std::vector<int64_t> distance;
  std::vector<double> seconds;  // member 0: from the barrier before a product to the one after it
  double last_barrier = 0.0;    // member 0's clock at its latest barrier
};
void plan_team_step(std::span<const PackedMatrix* const> firsts, int64_t n_tokens, TeamStepPlan& plan,
                    ThreadPool& pool);
void report_team_step(const TeamStepPlan& plan, ThreadPool& pool);

// Product `index` of the step (ys[i] = W_i x for plan.n_tokens tokens, or
// n_tokens > 0 of them: a mixture-of-experts layer's expert takes the rows
// routed to it, under the plan made for plan.n_tokens), for member m: the
// member converts x to the weights' dot type itself, claims tiles of the
// matrices with the others, and returns after the barrier that follows.
void team_matmul_many(std::span<const MatmulOutput> outputs, const float* x, DecodeTeam::Member& m,
                      TeamStepPlan& plan, int index, int64_t n_tokens = 0);

// A barrier after a step's own pass between products (attention, or a
// recurrent layer's scan and gate, split between the members by the
// model): the next product's time in plan starts after it, as after a
// product, and so also holds what member 0 does before its first claim.
void team_barrier(DecodeTeam::Member& m, TeamStepPlan& plan);

// Whether team_attention takes a token's attention at every layer of a
// model, its query seeing positions up to `end` (the token's position + 1):
// a decode kernel on this instruction set, in tasks of whole KV heads.
bool team_attention_takes(int64_t head_dim, int64_t n_head, int64_t n_head_kv, int64_t end);
// One token's attention per sequence (each batch's n_tokens == 1) for
// member m, split in the tasks attention_many runs; before a task attends,
// prepare(ctx, i, h0, h1) readies batch i's query heads [h0, h1) and their
// KV heads (whole), which no other task reads. Returns after the barrier
// that follows (which starts the next product's time in plan).
void team_attention(std::span<const AttentionBatch> batches, DecodeTeam::Member& m,
                    void (*prepare)(void*, size_t, int64_t, int64_t), void* ctx, TeamStepPlan& plan);

// Dot of two f32 rows with the same summation order as matmul's F32 path.
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace reprise
