#include "model/layer_attention.h"

#include <algorithm>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/key_layout.h"

namespace reprise {

namespace {

// Row bookkeeping of one sequence's batch: each query's visible range and the
// K/V row pointers for the positions any query sees.
using SequenceRows = AttentionRows;

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

// Stores KV heads [j0, j1) of n consecutive positions from pos0, all in
// one key group (k and v: the first position's row; rows row_stride
// floats apart).
void store_run_heads(SequenceMemory& memory, int layer, int64_t pos0, int64_t n, int64_t j0, int64_t j1,
                     int64_t head_dim, const float* k, const float* v, int64_t row_stride) {
  const int64_t stride = memory.kv_head_stride(layer), group = memory.key_group(layer);
  uint16_t* kg = memory.key(layer, pos0 - pos0 % group);
  for (int64_t j = j0; j < j1; ++j) store_keys(kg + j * stride, group, pos0, n, k + j * head_dim, row_stride, head_dim);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t* vr = memory.value(layer, pos0 + i);
    for (int64_t j = j0; j < j1; ++j)
      convert_f32_to_f16(v + i * row_stride + j * head_dim, vr + j * stride, head_dim);
  }
}

}  // namespace

// The lines position p's K/V rows of KV heads [j0, j1) occupy; its key
// group's only where p starts the group or the run (`whole_group`).
void prefetch_position_heads(SequenceMemory& memory, int layer, int64_t p, bool whole_group, int64_t j0, int64_t j1,
                             int64_t head_dim) {
  const int64_t stride = memory.kv_head_stride(layer), group = memory.key_group(layer);
  // The group's lines (written at every position of it) once per group.
  if (whole_group || p % group == 0) {
    const char* kg = reinterpret_cast<const char*>(memory.key(layer, p - p % group));
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t off = 0; off < group * head_dim * 2; off += 64) __builtin_prefetch(kg + j * stride * 2 + off, 1);
  }
  const char* vr = reinterpret_cast<const char*>(memory.value(layer, p));
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t off = 0; off < head_dim * 2; off += 64) __builtin_prefetch(vr + j * stride * 2 + off, 1);
}

void prefetch_kv_slots(std::span<const PassSegment> segments, int layer, int64_t n_kv_heads, int64_t head_dim) {
  constexpr int64_t kMaxPositions = 4;  // prompts write whole groups: the hardware prefetcher follows those
  for (const PassSegment& seg : segments) {
    const int64_t n = static_cast<int64_t>(seg.batch.tokens.size());
    if (n > kMaxPositions) continue;
    for (int64_t p = seg.batch.pos0; p < seg.batch.pos0 + n; ++p)
      prefetch_position_heads(*seg.memory, layer, p, p == seg.batch.pos0, 0, n_kv_heads, head_dim);
  }
}

void prefetch_kv_slot_heads(SequenceMemory& memory, int layer, int64_t pos, int64_t j0, int64_t j1,
                            int64_t head_dim) {
  prefetch_position_heads(memory, layer, pos, true, j0, j1, head_dim);
}

void store_kv_heads(SequenceMemory& memory, int layer, int64_t pos, int64_t j0, int64_t j1, int64_t head_dim,
                    const float* k, const float* v) {
  store_run_heads(memory, layer, pos, 1, j0, j1, head_dim, k, v, 0);
}

AttentionBatch one_token_attention(const ForwardBatch& batch, SequenceMemory& memory, int layer,
                                   const LayerAttentionShape& shape, const float* q, float* out, AttentionRows& rows) {
  return prepare_rows(batch, memory, layer, shape, q, out, rows);
}

void store_kv(std::span<const PassSegment> segments, int layer, int64_t n_kv_heads, int64_t head_dim, const float* k,
              const float* v, ThreadPool& pool) {
  // Runs of positions within one key group of one segment.
  struct Run {
    SequenceMemory* memory;
    int64_t pos0, row0, n;
  };
  // (Bound to a reference so the pool's threads see this thread's instance.)
  thread_local std::vector<Run> runs_buf;
  std::vector<Run>& runs = runs_buf;
  runs.clear();
  for (const PassSegment& seg : segments) {
    const int64_t group = seg.memory->key_group(layer);
    const int64_t pos0 = seg.batch.pos0, end = pos0 + static_cast<int64_t>(seg.batch.tokens.size());
    for (int64_t p = pos0; p < end;) {
      const int64_t run_end = std::min(end, (p / group + 1) * group);
      runs.push_back({seg.memory, p, seg.row0 + (p - pos0), run_end - p});
      p = run_end;
    }
  }
  const int64_t kv_dim = n_kv_heads * head_dim;
  auto store_run = [&](const Run& r) {
    store_run_heads(*r.memory, layer, r.pos0, r.n, 0, n_kv_heads, head_dim, k + r.row0 * kv_dim,
                    v + r.row0 * kv_dim, kv_dim);
  };
  if (runs.size() < 4) {  // decode steps: not worth a dispatch
    for (const Run& r : runs) store_run(r);
    return;
  }
  pool.parallel_for(static_cast<int64_t>(runs.size()), [&](int64_t i) { store_run(runs[i]); });
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
