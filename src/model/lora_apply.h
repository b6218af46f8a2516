// Applying a pass's LoRA adapters (model/lora_adapter.h) to a product's
// output, segment by segment: each sequence runs with its own adapters (or
// none), so sequences with different adapters share one pass over the base
// weights.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "model/pass_segments.h"
#include "tensor/thread_pool.h"

namespace reprise {

// For every segment row r >= first_row whose adapters adapt `tensor`:
//   y[r] += scale * factor * B (A x[r])
// for each such adapter in the segment's order. x holds the pass's input
// rows (n_in floats each, row r at x + r * n_in), y its output rows (n_out
// floats each). A row's result depends on its own input and adapters only.
void add_lora_deltas(std::span<const PassSegment> segments, const std::string& tensor, const float* x, int64_t n_in,
                     float* y, int64_t n_out, int64_t first_row, ThreadPool& pool);

// Whether any segment of the pass runs with adapters.
bool pass_has_loras(std::span<const PassSegment> segments);

}  // namespace reprise
