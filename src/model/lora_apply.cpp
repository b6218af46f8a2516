#include "model/lora_apply.h"

#include <algorithm>
#include <cmath>

#include "tensor/kernels.h"

namespace reprise {

namespace {

// A task's scratch for the deltas of a chunk of rows, and a pool of one
// thread (the task's: the kernels' results do not depend on the threads)
// on which it computes them.
struct ChunkScratch {
  std::vector<float> low;    // rows x rank: A x
  std::vector<float> delta;  // rows x n_out: B (A x)
  ThreadPool inline_pool{1};
};

// One scratch per task slot of a pool, kept with the pool
// (ThreadPool::caller_local), not with the threads that ran them: a
// server's request threads lead passes in turn, and would each keep one.
struct PoolChunkScratch {
  std::vector<std::unique_ptr<ChunkScratch>> slots;
};

// Rows per chunk: a chunk's deltas (up to a few hundred KB) are added while
// they are in the thread's cache; materialising a whole prompt's deltas and
// adding them afterwards streamed ~300 MB a 512-token pass of the 60M model
// through memory.
constexpr int64_t kChunkRows = 32;

// delta = B (A x) for `rows` input rows, on a pool of one thread: how every
// path computes a pair's deltas (`low` is scratch for A x).
void pair_deltas(const LoraPair& pair, const float* x, int64_t rows, std::vector<float>& low, float* delta,
                 ThreadPool& inline_pool) {
  low.resize(rows * pair.rank());
  matmul(pair.a, x, rows, low.data(), inline_pool);
  matmul(pair.b, low.data(), rows, delta, inline_pool);
}

}  // namespace

void add_scaled(float* y, const float* d, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(s, d[i], y[i]);
}

bool pass_has_loras(std::span<const PassSegment> segments) {
  return std::any_of(segments.begin(), segments.end(), [](const PassSegment& s) { return !s.batch.loras.empty(); });
}

void add_lora_deltas(std::span<const PassSegment> segments, const std::string& tensor, const float* x, int64_t n_in,
                     float* y, int64_t n_out, int64_t first_row, ThreadPool& pool) {
  for (const PassSegment& seg : segments) {
    if (seg.batch.loras.empty()) continue;
    const int64_t begin = std::max(seg.row0, first_row);
    const int64_t end = seg.row0 + static_cast<int64_t>(seg.batch.tokens.size());
    if (begin >= end) continue;
    for (const LoraUse& use : seg.batch.loras) {
      const LoraPair* pair = use.adapter->find(tensor);
      if (!pair) continue;
      const float s = use.scale * pair->factor;
      // Task t takes chunks t, t + tasks, ... with slot t's scratch. A
      // decode step's one chunk runs on the calling thread (parallel_for of
      // one task): dispatching a few thousand multiply-adds costs more.
      const int64_t chunks = (end - begin + kChunkRows - 1) / kChunkRows;
      const int64_t tasks = std::min<int64_t>(chunks, pool.size());
      std::vector<std::unique_ptr<ChunkScratch>>& slots = pool.caller_local<PoolChunkScratch>().slots;
      while (static_cast<int64_t>(slots.size()) < tasks) slots.push_back(std::make_unique<ChunkScratch>());
      pool.parallel_for(tasks, [&](int64_t t) {
        ChunkScratch& scratch = *slots[t];
        for (int64_t c = t; c < chunks; c += tasks) {
          const int64_t r0 = begin + c * kChunkRows, rows = std::min(kChunkRows, end - r0);
          scratch.delta.resize(rows * n_out);
          pair_deltas(*pair, x + r0 * n_in, rows, scratch.low, scratch.delta.data(), scratch.inline_pool);
          for (int64_t r = 0; r < rows; ++r)
            add_scaled(y + (r0 + r) * n_out, scratch.delta.data() + r * n_out, s, n_out);
        }
      });
    }
  }
}

LoraRowDeltas::LoraRowDeltas() : inline_pool_(std::make_unique<ThreadPool>(1)) {}
LoraRowDeltas::~LoraRowDeltas() = default;

void LoraRowDeltas::compute(std::span<const PassSegment> segments, const std::string& tensor, const float* x,
                            int64_t n_in, int64_t n_out) {
  entries_.clear();
  values_.clear();
  for (size_t r = 0; r < segments.size(); ++r)
    for (const LoraUse& use : segments[r].batch.loras)
      if (const LoraPair* pair = use.adapter->find(tensor)) {
        const size_t offset = values_.size();
        entries_.push_back({static_cast<int64_t>(r), use.scale * pair->factor, offset});
        values_.resize(offset + static_cast<size_t>(n_out));
        pair_deltas(*pair, x + static_cast<int64_t>(r) * n_in, 1, low_, values_.data() + offset, *inline_pool_);
      }
}

void LoraRowDeltas::add(int64_t row, float* y, int64_t e0, int64_t e1) const {
  for (const Entry& e : entries_)
    if (e.row == row) add_scaled(y + e0, values_.data() + e.offset + e0, e.scale, e1 - e0);
}

}  // namespace reprise
