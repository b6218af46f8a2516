// Attention of a batch's queries against one attention layer's K/V rows in a
// SequenceMemory (the batch's own rows already written): causal, optionally
// limited to a sliding window, and with the batch's bidirectional span (image
// tokens) attending to each other both ways. Shared by every architecture
// with attention layers, so they all get the same kernels and numerics.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/pass_segments.h"
#include "model/sequence_memory.h"
#include "tensor/kernels.h"
#include "tensor/thread_pool.h"

namespace reprise {

struct LayerAttentionShape {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t window = 0;  // > 0: a query sees only the last `window` positions
  float scale = 1.0f;
};

// Stores the K and V rows of a pass (row t: n_kv_heads x head_dim floats at
// k + t * n_kv_heads * head_dim, likewise v) of attention layer `layer` as
// f16 in each segment's memory, keys into their groups (see
// SequenceMemory::key). A task per key group, so no two threads write one.
void store_kv(std::span<const PassSegment> segments, int layer, int64_t n_kv_heads, int64_t head_dim, const float* k,
              const float* v, ThreadPool& pool);

// Asks the caches for the lines store_kv will write for decode-sized
// segments (a few positions each). A position's keys touch every line of
// its key group (32 lines per KV head for head_dim 64), which the previous
// token's weight stream has evicted: fetched when store_kv runs, they kept
// the other thread waiting ~1 us per layer. Called before the layer's K/V
// projection, they arrive while it runs.
void prefetch_kv_slots(std::span<const PassSegment> segments, int layer, int64_t n_kv_heads, int64_t head_dim);

// q: n_tokens x n_head x head_dim; out: the same shape.
void attend_layer(const ForwardBatch& batch, SequenceMemory& memory, int layer, const LayerAttentionShape& shape,
                  const float* q, float* out, ThreadPool& pool);

// One sequence's rows of a multi-sequence pass.
struct SequenceAttention {
  const ForwardBatch* batch = nullptr;
  SequenceMemory* memory = nullptr;
  const float* q = nullptr;
  float* out = nullptr;
};
// attend_layer for each sequence, dispatched together where the kernels allow.
void attend_layer_many(std::span<const SequenceAttention> sequences, int layer, const LayerAttentionShape& shape,
                       ThreadPool& pool);

// For single-token steps run by a DecodeTeam (tensor/decode_team.h), whose
// attention tasks each store and attend whole KV heads.

// A token's row bookkeeping: its visible range and the K/V row pointers of
// the positions it sees. Each team member keeps its own.
struct AttentionRows {
  std::vector<int64_t> first, end;
  std::vector<const uint16_t*> key_rows, value_rows;
};
// The attention batch of a one-token `batch` at `layer`, its rows in `rows`.
AttentionBatch one_token_attention(const ForwardBatch& batch, SequenceMemory& memory, int layer,
                                   const LayerAttentionShape& shape, const float* q, float* out, AttentionRows& rows);
// store_kv for KV heads [j0, j1) of one token at position pos (k and v: the
// token's n_kv_heads x head_dim rows).
void store_kv_heads(SequenceMemory& memory, int layer, int64_t pos, int64_t j0, int64_t j1, int64_t head_dim,
                    const float* k, const float* v);
// prefetch_kv_slots for KV heads [j0, j1) of one token at position pos.
void prefetch_kv_slot_heads(SequenceMemory& memory, int layer, int64_t pos, int64_t j0, int64_t j1,
                            int64_t head_dim);

}  // namespace reprise
