#include "model/pass_segments.h"

namespace reprise {

std::vector<PassSegment> segments_for_steps(std::span<const SequenceStep> steps) {
  std::vector<PassSegment> segments(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    PassSegment& s = segments[i];
    s.batch.tokens = std::span<const int32_t>(&steps[i].token, 1);
    s.batch.pos0 = steps[i].pos;
    s.memory = steps[i].memory;
    s.row0 = static_cast<int64_t>(i);
  }
  return segments;
}

int64_t pass_rows(std::span<const PassSegment> segments) {
  if (segments.empty()) return 0;
  return segments.back().row0 + static_cast<int64_t>(segments.back().batch.tokens.size());
}

void prepare_segments(std::span<const PassSegment> segments) {
  for (const PassSegment& s : segments)
    s.memory->prepare(s.batch.pos0, s.batch.pos0 + static_cast<int64_t>(s.batch.tokens.size()));
}

}  // namespace reprise
