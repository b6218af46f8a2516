// What a model's decode-team step (tensor/decode_team.h) keeps between
// steps, one per pool (ThreadPool::caller_local), and the steps every
// architecture takes around DecodeTeam::run: the team sized to the pool,
// the decode prefetch plan of the step's products, and each sequence's
// logits. (Models of one class share their pool's state: the plan is
// made anew each step, and a team serves any step on its pool.)
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/pass_segments.h"
#include "tensor/decode_team.h"
#include "tensor/kernels.h"

namespace reprise {

struct TeamStepState {
  std::unique_ptr<DecodeTeam> team;
  TeamStepPlan plan;
  // Each product's first matrix, in the order the step runs them (the
  // model fills it before begin()): what the prefetch tuner keys on.
  std::vector<const PackedMatrix*> firsts;
  std::vector<float> logits;  // every sequence's, in order (passes of several)

  // Whether a team may run now (none made yet, or not standing down).
  bool ready() const { return !team || team->ready(); }
  // Readies the team for `pool` and plans `firsts` for the pass's
  // sequences (one row each); returns the buffer the output product
  // writes: the only sequence's own logits, or `logits` for several.
  std::vector<float>& begin(std::span<const PassSegment> segments, int64_t n_vocab, ThreadPool& pool);
  // After the run: reports the products' times to the tuner (not for steps
  // with adapters, whose windows hold their deltas too) and hands each
  // sequence its logits.
  void end(std::span<const PassSegment> segments, int64_t n_vocab, ThreadPool& pool);
};

}  // namespace reprise
