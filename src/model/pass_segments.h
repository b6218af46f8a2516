// How one forward pass's rows map to sequences: a single sequence's batch is
// one segment; a multi-sequence pass (Model::forward_many) has one segment
// per sequence, in order. Architectures run products over all rows
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
  std::vector<float>* logits = nullptr;  // receives what batch.logits_for asks
};

// One segment per non-empty batch, rows in batch order.
std::vector<PassSegment> segments_for(std::span<const SequenceBatch> batches);

// The first row whose last-layer output a pass needs: the output only
// matters for rows that produce logits (as llama.cpp's inp_out_ids), so a
// single segment asking for its last row's logits needs only that row, and
// one asking for none needs no row (pass_rows). Several segments need all
// rows. (The layer's state still advances over every row.)
int64_t last_layer_first_row(std::span<const PassSegment> segments);

// Total rows of the pass.
int64_t pass_rows(std::span<const PassSegment> segments);

// Passes of fewer sequences than this (one token each) may run as decode
// teams (tensor/decode_team.h): the products' decode-sized batches (below a
// prompt tile).
constexpr int64_t kDecodeTeamMaxSequences = 12;

// Whether a pass is a decode step a team may run, as far as the pass and
// pool tell: one token of each of fewer than kDecodeTeamMaxSequences
// sequences, each wanting its logits and fed by token id, on a pool of
// several threads that fits the CPUs and whose workers are awake, with teams
// enabled. (An architecture adds its own conditions, and whether its team
// is ready; one that takes adapters applies them in its team steps too.)
bool decode_team_may_run(std::span<const PassSegment> segments, const ThreadPool& pool);

// An architecture that runs every pass as segments: forward() is a pass of
// one segment, forward_many() a pass of one segment per batch. Both check
// each segment's token ids and prepare its memory before run(), which so
// never sees a segment that cannot run.
class SegmentedModel : public Model {
 public:
  void forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
               ThreadPool& pool) final;
  void forward_many(std::span<const SequenceBatch> batches, ThreadPool& pool) final;
  bool batches_sequences() const final { return true; }

 protected:
  // One pass over the segments' rows (at least one row; memories prepared);
  // every segment's logits vector receives what its batch asks.
  virtual void run(std::span<const PassSegment> segments, ThreadPool& pool) = 0;

 private:
  // Throws what is wrong with the segment: a token id out of range (outside
  // its embedded span), or its memory's error preparing the positions.
  void check_and_prepare(const ForwardBatch& batch, SequenceMemory& memory) const;
};

}  // namespace reprise
