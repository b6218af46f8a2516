#include "model/lora_apply.h"

#include <algorithm>
#include <vector>

#include "model/for_tokens.h"
#include "tensor/kernels.h"

namespace reprise {

namespace {

// Per pool, reused from pass to pass (ThreadPool::caller_local).
struct LoraScratch {
  std::vector<float> low;    // rows x rank: A x
  std::vector<float> delta;  // rows x n_out: B (A x)
};

}  // namespace

bool pass_has_loras(std::span<const PassSegment> segments) {
  return std::any_of(segments.begin(), segments.end(), [](const PassSegment& s) { return !s.batch.loras.empty(); });
}

void add_lora_deltas(std::span<const PassSegment> segments, const std::string& tensor, const float* x, int64_t n_in,
                     float* y, int64_t n_out, int64_t first_row, ThreadPool& pool) {
  LoraScratch* scratch = nullptr;
  for (const PassSegment& seg : segments) {
    if (seg.batch.loras.empty()) continue;
    const int64_t begin = std::max(seg.row0, first_row);
    const int64_t end = seg.row0 + static_cast<int64_t>(seg.batch.tokens.size());
    if (begin >= end) continue;
    const int64_t rows = end - begin;
    for (const LoraUse& use : seg.batch.loras) {
      const LoraPair* pair = use.adapter->find(tensor);
      if (!pair) continue;
      if (!scratch) scratch = &pool.caller_local<LoraScratch>();
      scratch->low.resize(rows * pair->rank());
      scratch->delta.resize(rows * n_out);
      matmul(pair->a, x + begin * n_in, rows, scratch->low.data(), pool);
      matmul(pair->b, scratch->low.data(), rows, scratch->delta.data(), pool);
      const float s = use.scale * pair->factor;
      const float* d = scratch->delta.data();
      float* out = y + begin * n_out;
      for_tokens(rows, pool, [&](int64_t r) {
        for (int64_t i = 0; i < n_out; ++i) out[r * n_out + i] += s * d[r * n_out + i];
      });
    }
  }
}

}  // namespace reprise
