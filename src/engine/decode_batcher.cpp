#include "engine/decode_batcher.h"

#include <algorithm>
#include <chrono>

namespace reprise {

namespace {
// How long a leader holding the forward lock waits for the other decoding
// sequences' steps. A member samples its next token and comes straight back
// (tens of microseconds); a member that is slower than this (a stalled
// callback) is left for the next pass rather than holding up the others.
constexpr auto kGatherWindow = std::chrono::microseconds(500);
}  // namespace

DecodeBatcher::DecodeBatcher(Model& model, ThreadPool& pool, std::mutex& forward_mutex, int max_batch)
    : model_(model), pool_(pool), forward_mutex_(forward_mutex),
      max_batch_(model.batches_sequences() ? std::max(1, max_batch) : 1) {}

DecodeBatcher::Membership::Membership(DecodeBatcher& b) : batcher_(b) {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  ++batcher_.members_;
}

DecodeBatcher::Membership::~Membership() {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  --batcher_.members_;
  // A leader may be waiting for this member's step: it will not come.
  batcher_.changed_.notify_all();
}

DecodeBatchStats DecodeBatcher::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void DecodeBatcher::step(SequenceMemory& memory, int32_t token, int64_t pos, std::vector<float>& logits) {
  Pending me;
  me.step = SequenceStep{token, pos, &memory};
  me.logits = &logits;
  std::unique_lock<std::mutex> lock(mutex_);
  pending_.push_back(&me);
  changed_.notify_all();
  while (!me.done) {
    if (!leading_) lead(lock);
    else changed_.wait(lock);
  }
  if (me.error) std::rethrow_exception(me.error);
}

void DecodeBatcher::lead(std::unique_lock<std::mutex>& lock) {
  leading_ = true;
  lock.unlock();
  // Steps that arrive while another user of the pool (a prefill) holds the
  // forward lock queue up and join this pass.
  std::unique_lock<std::mutex> forward(forward_mutex_);
  lock.lock();
  const auto deadline = std::chrono::steady_clock::now() + kGatherWindow;
  const auto wanted = [&] { return static_cast<size_t>(std::clamp(members_, 1, max_batch_)); };
  while (pending_.size() < wanted() && std::chrono::steady_clock::now() < deadline)
    changed_.wait_until(lock, deadline);
  std::vector<Pending*> batch;
  while (!pending_.empty() && batch.size() < static_cast<size_t>(max_batch_)) {
    batch.push_back(pending_.front());
    pending_.pop_front();
  }
  lock.unlock();
  run_batch(batch);
  forward.unlock();
  lock.lock();
  for (Pending* p : batch) p->done = true;
  ++stats_.passes;
  stats_.steps += batch.size();
  stats_.max_batch = std::max<uint64_t>(stats_.max_batch, batch.size());
  leading_ = false;
  changed_.notify_all();
}

void DecodeBatcher::run_batch(std::vector<Pending*>& batch) {
  const int64_t n_vocab = model_.info().n_vocab;
  if (batch.size() > 1) {
    std::vector<SequenceStep> steps;
    steps.reserve(batch.size());
    for (const Pending* p : batch) steps.push_back(p->step);
    try {
      model_.forward_steps(steps, batch_logits_, pool_);
      for (size_t i = 0; i < batch.size(); ++i)
        batch[i]->logits->assign(batch_logits_.begin() + static_cast<int64_t>(i) * n_vocab,
                                 batch_logits_.begin() + static_cast<int64_t>(i + 1) * n_vocab);
      return;
    } catch (...) {
      // Fall through: each step alone, so an error stays with its own step.
      // A model that batches sequences advances no committed state in a
      // failed pass (each step's rows are written again by its retry).
    }
  }
  for (Pending* p : batch) {
    try {
      model_.forward_steps(std::span<const SequenceStep>(&p->step, 1), *p->logits, pool_);
    } catch (...) {
      p->error = std::current_exception();
    }
  }
}

}  // namespace reprise
