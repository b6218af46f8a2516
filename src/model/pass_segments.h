// How one forward pass's rows map to sequences: a single sequence's batch is
// one segment; a multi-sequence decode step (Model::forward_steps) has one
// segment of one row per sequence. Architectures run products over all rows
// and per-sequence work (attention, recurrent scans, state writes) per
// segment, so a row's result never depends on the other segments.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/sequence_memory.h"

namespace reprise {

// Rows [row0, row0 + batch.tokens.size()) of a pass; batch's embedding and
// bidirectional ranges are relative to the segment.
struct PassSegment {
  ForwardBatch batch;
  SequenceMemory* memory = nullptr;
  int64_t row0 = 0;
};

// One segment per step (its token at its position), rows in step order.
// The spans in the result point into `steps`.
std::vector<PassSegment> segments_for_steps(std::span<const SequenceStep> steps);

// Total rows of the pass.
int64_t pass_rows(std::span<const PassSegment> segments);

// Calls memory.prepare for every segment's positions.
void prepare_segments(std::span<const PassSegment> segments);

}  // namespace reprise
