#include "model/layer_attention.h"

#include <algorithm>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/key_layout.h"

namespace reprise {

namespace {

// Row bookkeeping of one sequence's batch: each query's visible range and the
// K/V row pointers for the positions any query sees.
struct SequenceRows {
  std::vector<int64_t> first, end;
  std::vector<const uint16_t*> key_rows, value_rows;
};

AttentionBatch prepare_rows(const ForwardBatch& batch, SequenceMemory& memory, int layer,
                            const LayerAttentionShape& shape, const float* q, float* out, SequenceRows& rows) {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  rows.first.resize(n);
  rows.end.resize(n);
  int64_t max_end = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = batch.pos0 + t;
    int64_t last = pos;
    if (t >= batch.bidir_begin && t < batch.bidir_end) last = batch.pos0 + batch.bidir_end - 1;
    rows.first[t] = shape.window > 0 ? std::max<int64_t>(0, pos - shape.window + 1) : 0;
    rows.end[t] = last + 1;
    max_end = std::max(max_end, rows.end[t]);
  }
  rows.key_rows.resize(max_end);
  rows.value_rows.resize(max_end);
  // From the start of the first visible position's key group.
  const int64_t group = memory.key_group(layer);
  int64_t lo = *std::min_element(rows.first.begin(), rows.first.end());
  lo -= lo % group;
  if (lo < max_end) memory.kv_rows(layer, lo, max_end, rows.key_rows.data() + lo, rows.value_rows.data() + lo);
  AttentionBatch a;
  a.q = q;
  a.n_tokens = n;
  a.n_head = shape.n_head;
  a.n_head_kv = shape.n_head_kv;
  a.head_dim = shape.head_dim;
  a.scale = shape.scale;
  a.first = rows.first.data();
  a.end = rows.end.data();
  a.kv_head_stride = memory.kv_head_stride(layer);
  a.key_group = group;
  a.key_rows = rows.key_rows.data();
  a.value_rows = rows.value_rows.data();
  a.out = out;
  return a;
}

}  // namespace

void store_kv(SequenceMemory& memory, int layer, int64_t pos, int64_t n_kv_heads, int64_t head_dim, const float* k,
              const float* v) {
  const int64_t stride = memory.kv_head_stride(layer), group = memory.key_group(layer);
  uint16_t* kg = memory.key(layer, pos - pos % group);
  uint16_t* vr = memory.value(layer, pos);
  for (int64_t j = 0; j < n_kv_heads; ++j) {
    store_key(kg + j * stride, group, pos, k + j * head_dim, head_dim);
    convert_f32_to_f16(v + j * head_dim, vr + j * stride, head_dim);
  }
}

void attend_layer(const ForwardBatch& batch, SequenceMemory& memory, int layer, const LayerAttentionShape& shape,
                  const float* q, float* out, ThreadPool& pool) {
  const SequenceAttention one{&batch, &memory, q, out};
  attend_layer_many(std::span<const SequenceAttention>(&one, 1), layer, shape, pool);
}

void attend_layer_many(std::span<const SequenceAttention> sequences, int layer, const LayerAttentionShape& shape,
                       ThreadPool& pool) {
  thread_local std::vector<SequenceRows> rows;
  thread_local std::vector<AttentionBatch> batches;
  if (rows.size() < sequences.size()) rows.resize(sequences.size());
  batches.resize(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    const SequenceAttention& s = sequences[i];
    batches[i] = prepare_rows(*s.batch, *s.memory, layer, shape, s.q, s.out, rows[i]);
  }
  attention_many(batches, pool);
}

}  // namespace reprise
