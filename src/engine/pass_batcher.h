// Continuous batching: concurrent sequences of one model share forward passes.
//
// Decode is bound by memory bandwidth: a single-token pass streams every
// weight once. When several requests are running, their work (each one's next
// token, or a chunk of a new prompt) can share one pass (Model::forward_many),
// which streams the weights once for all of them. Each request keeps its own
// thread and calls run(); the first caller to find no pass running becomes
// the leader: it takes the forward lock, waits briefly for the next steps of
// the sequences that are decoding (Membership), and runs everything pending
// as one pass (all pending decode steps, and at most one multi-token chunk,
// so a long prompt delays decoders by one chunk at a time); the others wait
// for their logits.
//
// Batching never changes results: forward_many gives every batch the same
// bits as a pass of its own, and a batch it rejects (bad token, exhausted
// memory) gets its error while the others' pass runs without it, so one
// request's bad input is only its own.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <vector>

#include "model/model.h"
#include "tensor/thread_pool.h"

namespace reprise {

struct PassBatchStats {
  uint64_t passes = 0;         // forward passes run by the batcher
  uint64_t sequences = 0;      // sequence batches they ran (a pass of 3 decode steps and a chunk: 4)
  uint64_t max_sequences = 0;  // the most sequences in one pass
  uint64_t mixed_passes = 0;   // passes that ran a prompt chunk together with decode steps
};

class PassBatcher {
 public:
  // max_sequences: the most sequences in one pass (1 disables batching;
  // models that do not batch sequences always run 1). The forward lock is
  // the one every pass on `pool` holds.
  PassBatcher(Model& model, ThreadPool& pool, std::mutex& forward_mutex, int max_sequences);
  PassBatcher(const PassBatcher&) = delete;
  PassBatcher& operator=(const PassBatcher&) = delete;

  // A sequence in its decode loop: while it exists, a leader waits (up to
  // the gather window) for this sequence's next step before running a pass.
  class Membership {
   public:
    explicit Membership(PassBatcher& b);
    ~Membership();
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

   private:
    PassBatcher& batcher_;
  };

  // Runs `batch` on `memory` (possibly in one pass with other sequences'
  // batches); `logits` receives what batch.logits_for asks. Rethrows the
  // error of this batch.
  void run(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits);

  // Sequences currently in their decode loops.
  int decoding() const;
  // Batches waiting for a pass (for tests).
  size_t queued() const;
  PassBatchStats stats() const;

 private:
  struct Pending {
    SequenceBatch work;
    std::exception_ptr error;
    bool done = false;
    bool single() const { return work.batch.tokens.size() == 1; }
  };
  void lead(std::unique_lock<std::mutex>& lock);
  void run_pass(std::vector<Pending*>& pass) noexcept;

  Model& model_;
  ThreadPool& pool_;
  std::mutex& forward_mutex_;
  const int max_sequences_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Pending*> pending_;
  int members_ = 0;
  bool leading_ = false;
  PassBatchStats stats_;
};

}  // namespace reprise
