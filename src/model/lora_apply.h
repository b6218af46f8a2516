// Applying a pass's LoRA adapters (model/lora_adapter.h) to a product's
// output, segment by segment: each sequence runs with its own adapters (or
// none), so sequences with different adapters share one pass over the base
// weights.
//
// Every path computes a row's delta d = B (A x) with the kernels' matmul
// (whose results never depend on the batch or the threads) and adds it as
// add_scaled does, use by use in the segment's order: so a pass run by the
// pool and a decode step run by a team give the same bits.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/pass_segments.h"
#include "tensor/thread_pool.h"

namespace reprise {

// y[i] = fma(s, d[i], y[i]) for i < n.
void add_scaled(float* y, const float* d, float s, int64_t n);

// For every segment row r >= first_row whose adapters adapt `tensor`:
//   y[r] += scale * factor * B (A x[r])
// for each such adapter in the segment's order. x holds the pass's input
// rows (n_in floats each, row r at x + r * n_in), y its output rows (n_out
// floats each). A row's result depends on its own input and adapters only.
void add_lora_deltas(std::span<const PassSegment> segments, const std::string& tensor, const float* x, int64_t n_in,
                     float* y, int64_t n_out, int64_t first_row, ThreadPool& pool);

// Whether any segment of the pass runs with adapters.
bool pass_has_loras(std::span<const PassSegment> segments);

// The deltas of a decode step's rows (one token per segment), computed by
// the calling thread alone and added where the caller reads a product's
// output: a decode team's members each compute them all (a few hundred
// thousand multiply-adds a layer) instead of waiting at one more barrier.
class LoraRowDeltas {
 public:
  LoraRowDeltas();
  ~LoraRowDeltas();
  // Row r = segment r's token (input x + r * n_in): each of its segment's
  // uses that adapt `tensor` gets its delta B (A x_r) (n_out floats).
  void compute(std::span<const PassSegment> segments, const std::string& tensor, const float* x, int64_t n_in,
               int64_t n_out);
  // y (row r's output) += the row's deltas over elements [e0, e1), as
  // add_lora_deltas adds them.
  void add(int64_t row, float* y, int64_t e0, int64_t e1) const;
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    int64_t row;
    float scale;  // the use's scale times the pair's factor
    size_t offset;  // into values_
  };
  std::vector<Entry> entries_;  // by row, uses in order
  std::vector<float> values_, low_;
  std::unique_ptr<ThreadPool> inline_pool_;  // one thread: the caller's
};

}  // namespace reprise
