// Continuous batching of decode steps across concurrent sequences of one model.
//
// Decode is bound by memory bandwidth: a single-token forward pass streams
// every weight once. When several requests are generating at the same time,
// their next tokens can share one pass (Model::forward_steps), which streams
// the weights once for all of them. Each request keeps its own thread and
// calls step(); the first caller to find no pass running becomes the leader:
// it takes the forward lock, waits briefly for the steps of the other
// sequences that are decoding (joined()), and runs everything pending as one
// pass; the others wait for their logits.
//
// Batching never changes results: forward_steps gives every step the same
// bits as a pass of its own, and a pass whose batch fails is retried step by
// step, so one request's error (bad token, exhausted memory) is only its own.
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

struct DecodeBatchStats {
  uint64_t passes = 0;     // forward passes run by the batcher
  uint64_t steps = 0;      // sequence steps they advanced
  uint64_t max_batch = 0;  // the most steps in one pass
};

class DecodeBatcher {
 public:
  // max_batch: the most steps in one pass (1 disables batching; models that
  // do not batch sequences always run 1). The forward lock is the one every
  // pass on `pool` holds.
  DecodeBatcher(Model& model, ThreadPool& pool, std::mutex& forward_mutex, int max_batch);
  DecodeBatcher(const DecodeBatcher&) = delete;
  DecodeBatcher& operator=(const DecodeBatcher&) = delete;

  // A sequence in its decode loop: while it exists, a leader waits (up to
  // the gather window) for this sequence's next step before running a pass.
  class Membership {
   public:
    explicit Membership(DecodeBatcher& b);
    ~Membership();
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

   private:
    DecodeBatcher& batcher_;
  };

  // Runs `token` at `pos` of `memory` (possibly together with other
  // sequences' steps) and returns its n_vocab logits. Rethrows the error of
  // this step's pass.
  void step(SequenceMemory& memory, int32_t token, int64_t pos, std::vector<float>& logits);

  DecodeBatchStats stats() const;
  int max_batch() const { return max_batch_; }

 private:
  struct Pending {
    SequenceStep step;
    std::vector<float>* logits;
    std::exception_ptr error;
    bool done = false;
  };
  void lead(std::unique_lock<std::mutex>& lock);
  void run_batch(std::vector<Pending*>& batch);

  Model& model_;
  ThreadPool& pool_;
  std::mutex& forward_mutex_;
  const int max_batch_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Pending*> pending_;
  int members_ = 0;
  bool leading_ = false;
  DecodeBatchStats stats_;
  std::vector<float> batch_logits_;
};

}  // namespace reprise
