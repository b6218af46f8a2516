#include "model/pass_segments.h"

#include "tensor/decode_team.h"
#include "tensor/thread_pool.h"

namespace reprise {

std::vector<PassSegment> segments_for(std::span<const SequenceBatch> batches) {
  std::vector<PassSegment> segments;
  segments.reserve(batches.size());
  int64_t row = 0;
  for (const SequenceBatch& b : batches) {
    if (b.batch.tokens.empty()) continue;
    segments.push_back({b.batch, b.memory, row, b.logits});
    row += static_cast<int64_t>(b.batch.tokens.size());
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

bool decode_team_may_run(std::span<const PassSegment> segments, const ThreadPool& pool) {
  // A team's first barrier waits for every member, so a step with a worker
  // asleep (after an idle spell: ~0.5-2 ms to wake on this VM) runs
  // dispatched, where the caller starts alone and the worker joins when it
  // wakes (the dispatch wakes it); the next step finds it awake.
  if (pool.size() < 2 || segments.empty() || static_cast<int64_t>(segments.size()) >= kDecodeTeamMaxSequences ||
      !DecodeTeam::enabled() || !DecodeTeam::fits_cpus(pool.size()) || !pool.workers_awake())
    return false;
  for (const PassSegment& seg : segments) {
    const ForwardBatch& b = seg.batch;
    if (b.tokens.size() != 1 || b.embeddings || b.logits_for == LogitsFor::None || b.hidden_states || !seg.logits)
      return false;
  }
  return true;
}

void SegmentedModel::check_and_prepare(const ForwardBatch& b, SequenceMemory& memory) const {
  const int64_t n_vocab = info().n_vocab;
  for (int64_t i = 0; i < static_cast<int64_t>(b.tokens.size()); ++i) {
    if (b.embeddings && i >= b.embd_begin && i < b.embd_end) continue;  // fed as embeddings
    if (b.tokens[i] < 0 || b.tokens[i] >= n_vocab)
      throw Error("token id " + std::to_string(b.tokens[i]) + " out of range");
  }
  memory.prepare(b.pos0, b.pos0 + static_cast<int64_t>(b.tokens.size()));
}

void SegmentedModel::forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
                             ThreadPool& pool) {
  if (batch.tokens.empty()) return;
  check_and_prepare(batch, memory);
  const PassSegment one{batch, &memory, 0, &logits};
  run(std::span<const PassSegment>(&one, 1), pool);
}

void SegmentedModel::forward_many(std::span<const SequenceBatch> batches, ThreadPool& pool) {
  for (size_t i = 0; i < batches.size(); ++i) {
    if (batches[i].batch.tokens.empty()) continue;
    try {
      check_and_prepare(batches[i].batch, *batches[i].memory);
    } catch (const std::exception& e) {
      throw BatchRejected(i, std::current_exception(), e.what());
    }
  }
  const std::vector<PassSegment> segments = segments_for(batches);
  if (!segments.empty()) run(segments, pool);
}

}  // namespace reprise
