#include "engine/pass_batcher.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace reprise {

namespace {
// How long a leader holding the forward lock waits for the decoding
// sequences' next steps. A member samples its next token and comes straight
// back (tens of microseconds); a member slower than this (a stalled callback)
// is left for the next pass rather than holding up the others.
constexpr auto kGatherWindow = std::chrono::microseconds(500);
// Each arrival restarts the window (members that come back together, e.g.
// after sampling several verify rows each on fewer cores than requests, take
// a little longer in all), up to this much in total.
constexpr auto kGatherCap = std::chrono::microseconds(2000);
}  // namespace

PassBatcher::PassBatcher(Model& model, ThreadPool& pool, std::mutex& forward_mutex, int max_sequences,
                         int64_t max_chunk_tokens)
    : model_(model), pool_(pool), forward_mutex_(forward_mutex),
      max_sequences_(model.batches_sequences() ? std::max(1, max_sequences) : 1),
      max_chunk_tokens_(max_chunk_tokens) {}

PassBatcher::Membership::Membership(PassBatcher& b) : batcher_(b) {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  ++batcher_.members_;
}

PassBatcher::Membership::~Membership() {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  --batcher_.members_;
  if (away_) --batcher_.away_;
  // A leader may be waiting for this member's step: it will not come.
  batcher_.changed_.notify_all();
}

void PassBatcher::Membership::set_away(bool away) {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  if (away_ == away) return;
  away_ = away;
  batcher_.away_ += away ? 1 : -1;
  batcher_.changed_.notify_all();
}

PassBatcher::Decoder::Decoder(PassBatcher& b) : batcher_(b) {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  ++batcher_.decoders_;
}

PassBatcher::Decoder::~Decoder() {
  std::lock_guard<std::mutex> lock(batcher_.mutex_);
  --batcher_.decoders_;
}

int PassBatcher::decoding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return decoders_;
}

size_t PassBatcher::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

PassBatchStats PassBatcher::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void PassBatcher::run(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
                      const Membership* member, Membership* away_from) {
  if (batch.tokens.empty()) return;
  Pending me;
  me.work = SequenceBatch{batch, &memory, &logits};
  me.from_member = member != nullptr;
  me.away_from = away_from;
  // Back from away on every exit, if the leader has not already done it.
  struct AwayGuard {
    Pending& p;
    ~AwayGuard() {
      if (p.away_from) p.away_from->set_away(false);
    }
  } away_guard{me};
  if (away_from) away_from->set_away(true);
  std::unique_lock<std::mutex> lock(mutex_);
  pending_.push_back(&me);
  changed_.notify_all();
  while (!me.done) {
    if (leading_) {
      changed_.wait(lock);
      continue;
    }
    try {
      lead(lock);
    } catch (...) {
      // lead() throws only before taking anything from the queue (see
      // there): our item must not outlive this frame.
      pending_.erase(std::find(pending_.begin(), pending_.end(), &me));
      throw;
    }
  }
  if (me.error) std::rethrow_exception(me.error);
}

void PassBatcher::lead(std::unique_lock<std::mutex>& lock) {
  // The only allocation: done before this thread becomes the leader, so
  // nothing after it throws (a failed pass is reported to its batches).
  std::vector<Pending*> pass;
  pass.reserve(max_sequences_);
  lead_pass(lock, pass);
}

void PassBatcher::lead_pass(std::unique_lock<std::mutex>& lock, std::vector<Pending*>& pass) noexcept {
  leading_ = true;
  // Wait for the members' batches before taking the forward lock, so the
  // wait overlaps whatever else runs on the pool (another model's batcher,
  // the vision encoder) instead of stalling it; members come and go while we
  // wait (one that finishes will not step again).
  auto members_in = [&] {
    return std::count_if(pending_.begin(), pending_.end(), [](Pending* p) { return p->from_member; });
  };
  auto gather = [&] {
    const auto start = std::chrono::steady_clock::now();
    auto deadline = start + kGatherWindow;
    auto in = members_in();
    while (max_sequences_ > 1 && in < std::clamp(members_ - away_, 0, max_sequences_)) {
      if (std::chrono::steady_clock::now() >= deadline) break;
      changed_.wait_until(lock, deadline);
      if (const auto now_in = members_in(); now_in > in) {
        in = now_in;
        deadline = std::min(std::chrono::steady_clock::now() + kGatherWindow, start + kGatherCap);
      }
    }
  };
  gather();
  lock.unlock();
  // Work that arrives while another user of the pool holds the forward lock
  // queues up and joins this pass. A member that was away in that user's
  // pass (a speculative request verifying while the others draft) is back
  // once it ends: give the members one more window, or the two groups stay
  // out of step, each pass running without the other. Members still away
  // (queued behind this lock) are not waited for.
  std::unique_lock<std::mutex> forward(forward_mutex_, std::try_to_lock);
  if (!forward.owns_lock()) {
    forward.lock();
    lock.lock();
    gather();
  } else {
    lock.lock();
  }
  // In queue order: every single-token step, and multi-token chunks while
  // they total at most max_chunk_tokens_ (the first one whatever its size).
  int64_t chunk_tokens = 0;
  bool chunk_taken = false;
  for (auto it = pending_.begin(); it != pending_.end() && pass.size() < static_cast<size_t>(max_sequences_);) {
    const int64_t n = static_cast<int64_t>((*it)->work.batch.tokens.size());
    const bool take = (*it)->single() || !chunk_taken || chunk_tokens + n <= max_chunk_tokens_;
    if (take) {
      if (!(*it)->single()) {
        chunk_taken = true;
        chunk_tokens += n;
      }
      pass.push_back(*it);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  lock.unlock();
  run_pass(pass);
  // Members away from another batcher for these batches are back before
  // they wake (lock order: forward lock, then a batcher's own).
  for (Pending* p : pass)
    if (p->away_from) std::exchange(p->away_from, nullptr)->set_away(false);
  forward.unlock();
  lock.lock();
  for (Pending* p : pass) p->done = true;
  ++stats_.passes;
  stats_.sequences += pass.size();
  stats_.max_sequences = std::max<uint64_t>(stats_.max_sequences, pass.size());
  if (chunk_taken && pass.size() > 1) ++stats_.mixed_passes;
  leading_ = false;
  changed_.notify_all();
}

void PassBatcher::run_pass(std::vector<Pending*>& pass) noexcept {
  // A batch that cannot run is rejected before anything runs: it gets its
  // error and the pass runs again without it. Any other failure may have
  // advanced some state, so every batch of the pass gets it.
  std::vector<Pending*> left;
  try {
    left = pass;
    while (!left.empty()) {
      std::vector<SequenceBatch> batches;
      batches.reserve(left.size());
      for (const Pending* p : left) batches.push_back(p->work);
      try {
        model_.forward_many(batches, pool_);
        return;
      } catch (const BatchRejected& rejected) {
        left[rejected.index]->error = rejected.cause;
        left.erase(left.begin() + static_cast<std::ptrdiff_t>(rejected.index));
      }
    }
  } catch (...) {
    for (Pending* p : left.empty() ? pass : left)
      if (!p->error) p->error = std::current_exception();
  }
}

}  // namespace reprise
