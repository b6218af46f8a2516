// Continuous batching: concurrent sequences of one model share forward passes.
//
// Decode is bound by memory bandwidth: a single-token pass streams every
// weight once. When several requests are running, their work (each one's next
// token, or a chunk of a new prompt) can share one pass (Model::forward_many),
// which streams the weights once for all of them. Each request keeps its own
// thread and calls run(); the first caller to find no pass running becomes
// the leader: it waits briefly for the next batches of the sequences that are
// decoding (Membership), takes the forward lock, and runs everything pending
// as one pass: every single-token step, and multi-token chunks (prompt
// chunks, speculative verify batches, a draft's catch-up) in queue order up
// to a token budget, the first always, so a long prompt delays decoders by
// one chunk at a time; the others wait for their logits.
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
  uint64_t mixed_passes = 0;   // passes that ran a multi-token chunk together with other batches
};

class PassBatcher {
 public:
  // max_sequences: the most sequences in one pass (1 disables batching;
  // models that do not batch sequences always run 1). max_chunk_tokens: a
  // pass takes a second or later multi-token chunk only while its chunks
  // total at most this many tokens. The forward lock is the one every pass on
  // `pool` holds.
  PassBatcher(Model& model, ThreadPool& pool, std::mutex& forward_mutex, int max_sequences,
              int64_t max_chunk_tokens = 128);
  PassBatcher(const PassBatcher&) = delete;
  PassBatcher& operator=(const PassBatcher&) = delete;

  // A sequence in its decode loop: while it exists, a leader waits (up to
  // the gather window) for this sequence's next batch (run with the
  // membership) before running a pass.
  class Membership {
   public:
    explicit Membership(PassBatcher& b);
    ~Membership();
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

    // Away: the member's current batch is in another batcher's queue or pass
    // (a speculative request verifying while a member of its draft's
    // batcher), so no leader here waits for it meanwhile. See run().
    void set_away(bool away);

   private:
    PassBatcher& batcher_;
    bool away_ = false;  // guarded by batcher_.mutex_
  };

  // Runs `batch` on `memory` (possibly in one pass with other sequences'
  // batches); `logits` receives what batch.logits_for asks. Rethrows the
  // error of this batch. `member`: the caller's membership, if it holds one
  // (its batch is one a leader waits for). `away_from`: the caller's
  // membership of another batcher, away from the moment the batch is queued
  // until its pass has run (cleared before the caller wakes, so the other
  // batcher's leader waits for the caller's next batch there).
  void run(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
           const Membership* member = nullptr, Membership* away_from = nullptr);

  // Held by a sequence for its whole decode loop, also through phases in
  // which it is not a member (a speculative request while it drafts).
  class Decoder {
   public:
    explicit Decoder(PassBatcher& b);
    ~Decoder();
    Decoder(const Decoder&) = delete;
    Decoder& operator=(const Decoder&) = delete;

   private:
    PassBatcher& batcher_;
  };

  // Sequences in their decode loops (holding a Decoder): while there are
  // any, new prompts prefill in smaller chunks.
  int decoding() const;
  // Batches waiting for a pass (for tests).
  size_t queued() const;
  PassBatchStats stats() const;

 private:
  struct Pending {
    SequenceBatch work;
    std::exception_ptr error;
    bool done = false;
    bool from_member = false;
    Membership* away_from = nullptr;  // cleared (set_away(false)) once the pass has run
    bool single() const { return work.batch.tokens.size() == 1; }
  };
  void lead(std::unique_lock<std::mutex>& lock);
  void lead_pass(std::unique_lock<std::mutex>& lock, std::vector<Pending*>& pass) noexcept;
  void run_pass(std::vector<Pending*>& pass) noexcept;

  Model& model_;
  ThreadPool& pool_;
  std::mutex& forward_mutex_;
  const int max_sequences_;
  const int64_t max_chunk_tokens_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Pending*> pending_;
  int members_ = 0;
  int away_ = 0;  // members that are away
  int decoders_ = 0;
  bool leading_ = false;
  PassBatchStats stats_;
};

}  // namespace reprise
