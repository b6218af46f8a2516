#include "model/pass_segments.h"

namespace reprise {

std::vector<PassSegment> segments_for(std::span<const SequenceBatch> batches) {
  std::vector<PassSegment> segments(batches.size());
  int64_t row = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    segments[i] = {batches[i].batch, batches[i].memory, row, batches[i].logits};
    row += static_cast<int64_t>(batches[i].batch.tokens.size());
  }
  return segments;
}

int64_t last_layer_first_row(std::span<const PassSegment> segments) {
  if (segments.size() != 1) return 0;
  const int64_t n = pass_rows(segments);
  switch (segments[0].batch.logits_for) {
    case LogitsFor::All: return 0;
    case LogitsFor::Last: return n - 1;
    case LogitsFor::None: return n;
  }
  return 0;
}

int64_t pass_rows(std::span<const PassSegment> segments) {
  if (segments.empty()) return 0;
  return segments.back().row0 + static_cast<int64_t>(segments.back().batch.tokens.size());
}

void prepare_segments(std::span<const PassSegment> segments) {
  for (const PassSegment& s : segments)
    s.memory->prepare(s.batch.pos0, s.batch.pos0 + static_cast<int64_t>(s.batch.tokens.size()));
}

void SegmentedModel::forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
                             ThreadPool& pool) {
  if (batch.tokens.empty()) return;
  const PassSegment one{batch, &memory, 0, &logits};
  run(std::span<const PassSegment>(&one, 1), pool);
}

void SegmentedModel::forward_many(std::span<const SequenceBatch> batches, ThreadPool& pool) {
  const std::vector<PassSegment> segments = segments_for(batches);
  if (pass_rows(segments) > 0) run(segments, pool);
}

}  // namespace reprise
