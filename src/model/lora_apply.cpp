#include "model/lora_apply.h"

#include <algorithm>
#include <cmath>

#include "model/for_tokens.h"
#include "tensor/kernels.h"

namespace reprise {

namespace {

// Per pool, reused from pass to pass (ThreadPool::caller_local).
struct LoraScratch {
  std::vector<float> low;    // rows x rank: A x
  std::vector<float> delta;  // rows x n_out: B (A x)
  // A decode step's delta is a few thousand multiply-adds: dispatching it
  // to the pool costs more than computing it on the calling thread, which a
  // pool of one thread does (with the same results: the kernels' do not
  // depend on the threads).
  std::unique_ptr<ThreadPool> inline_pool = std::make_unique<ThreadPool>(1);
};

// Segments of at most this many rows compute their deltas inline.
constexpr int64_t kInlineRows = 4;

}  // namespace

void add_scaled(float* y, const float* d, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(s, d[i], y[i]);
}

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
      ThreadPool& run_on = rows <= kInlineRows ? *scratch->inline_pool : pool;
      matmul(pair->a, x + begin * n_in, rows, scratch->low.data(), run_on);
      matmul(pair->b, scratch->low.data(), rows, scratch->delta.data(), run_on);
      const float s = use.scale * pair->factor;
      const float* d = scratch->delta.data();
      float* out = y + begin * n_out;
      for_tokens(rows, pool, [&](int64_t r) { add_scaled(out + r * n_out, d + r * n_out, s, n_out); });
    }
  }
}

LoraRowDeltas::LoraRowDeltas() : inline_pool_(std::make_unique<ThreadPool>(1)) {}
LoraRowDeltas::~LoraRowDeltas() = default;

void LoraRowDeltas::compute(std::span<const PassSegment> segments, const std::string& tensor, const float* x,
                            int64_t n_in, int64_t n_out) {
  entries_.clear();
  size_t size = 0;
  for (size_t r = 0; r < segments.size(); ++r)
    for (const LoraUse& use : segments[r].batch.loras)
      if (const LoraPair* pair = use.adapter->find(tensor)) {
        entries_.push_back({static_cast<int64_t>(r), use.scale * pair->factor, size});
        size += static_cast<size_t>(n_out);
      }
  values_.resize(size);
  size_t e = 0;
  for (size_t r = 0; r < segments.size(); ++r)
    for (const LoraUse& use : segments[r].batch.loras)
      if (const LoraPair* pair = use.adapter->find(tensor)) {
        low_.resize(pair->rank());
        matmul(pair->a, x + static_cast<int64_t>(r) * n_in, 1, low_.data(), *inline_pool_);
        matmul(pair->b, low_.data(), 1, values_.data() + entries_[e++].offset, *inline_pool_);
      }
}

void LoraRowDeltas::add(int64_t row, float* y, int64_t e0, int64_t e1) const {
  for (const Entry& e : entries_)
    if (e.row == row) add_scaled(y + e0, values_.data() + e.offset + e0, e.scale, e1 - e0);
}

}  // namespace reprise
