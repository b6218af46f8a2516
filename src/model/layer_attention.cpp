#include "model/layer_attention.h"

#include <algorithm>
#include <vector>

#include "tensor/kernels.h"

namespace reprise {

void attend_layer(const ForwardBatch& batch, SequenceMemory& memory, int layer, const LayerAttentionShape& shape,
                  const float* q, float* out, ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  thread_local std::vector<int64_t> first, end;
  thread_local std::vector<const uint16_t*> key_rows, value_rows;
  first.resize(n);
  end.resize(n);
  int64_t max_end = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = batch.pos0 + t;
    int64_t last = pos;
    if (t >= batch.bidir_begin && t < batch.bidir_end) last = batch.pos0 + batch.bidir_end - 1;
    first[t] = shape.window > 0 ? std::max<int64_t>(0, pos - shape.window + 1) : 0;
    end[t] = last + 1;
    max_end = std::max(max_end, end[t]);
  }
  key_rows.resize(max_end);
  value_rows.resize(max_end);
  const int64_t lo = *std::min_element(first.begin(), first.end());
  if (lo < max_end) memory.kv_rows(layer, lo, max_end, key_rows.data() + lo, value_rows.data() + lo);
  AttentionBatch a;
  a.q = q;
  a.n_tokens = n;
  a.n_head = shape.n_head;
  a.n_head_kv = shape.n_head_kv;
  a.head_dim = shape.head_dim;
  a.scale = shape.scale;
  a.first = first.data();
  a.end = end.data();
  a.key_rows = key_rows.data();
  a.value_rows = value_rows.data();
  a.out = out;
  attention(a, pool);
}

}  // namespace reprise
