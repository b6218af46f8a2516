#include "engine/active_sequence.h"

#include "util/error.h"

namespace reprise {

ActiveSequence::ActiveSequence(Model& model, ThreadPool& pool, std::mutex& forward_mutex, PrefixCache* cache,
                               SnapshotStore* snapshots, const NamespaceKey& ns, PassBatcher* batcher,
                               std::vector<LoraUse> loras)
    : model_(model), pool_(pool), forward_mutex_(forward_mutex), batcher_(batcher), cache_(cache),
      snapshots_(snapshots), loras_(std::move(loras)) {
  if (cache_) {
    cached_ = cache_->open(ns);
    memory_ = cached_.get();
  } else {
    flat_ = std::make_unique<FlatMemory>(model_.state_spec());
    memory_ = flat_.get();
  }
}

ReuseReport ActiveSequence::attach(std::span<const int32_t> prompt, std::span<const Hash128> keys, bool reuse) {
  ReuseReport report;
  report.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (!cached_) {
    // The whole prompt's K/V at once: growing by doubling as the prompt's
    // chunks arrive would copy what is there at each step.
    flat_->prepare(0, report.prompt_tokens);
    report.stop_reason = "disabled";
    return report;
  }
  if (!reuse) {
    report.stop_reason = "not-asked";
    return report;
  }
  report = cached_->attach_prefix(prompt, keys);
  int64_t pos = report.reused_tokens;
  if (model_.state_spec().has_recurrent()) {
    // Recurrent state is restored whole from a snapshot at some position
    // P <= the KV prefix (never trimmed or partially restored); the KV blocks
    // are cut back to the same P so both describe one prefix.
    const int64_t restored =
        snapshots_ && pos > 0 ? snapshots_->restore_longest(cached_->namespace_hash(), prompt, keys, pos, *cached_)
                              : 0;
    if (restored < pos) {
      cached_->truncate(restored);
      report.stop_reason = snapshots_ ? "no-snapshot-beyond" : "recurrent-state-not-cached";
      report.stop_position = restored;
      report.reused_tokens = restored;
      pos = restored;
    }
  }
  position_ = pos;
  return report;
}

void ActiveSequence::truncate(int64_t n) {
  if (n > position_) throw Error("truncate beyond the sequence");
  if (n == position_) return;
  if (model_.state_spec().has_recurrent()) throw Error("cannot roll back recurrent state");
  if (cached_) cached_->truncate(n);
  position_ = n;
}

void ActiveSequence::hold_index_from(int64_t n) {
  if (cached_) cached_->hold_index_from(n);
}

void ActiveSequence::settle() {
  if (cached_) cached_->settle();
}

void ActiveSequence::set_decoding(bool decoding) {
  if (!batcher_) return;
  if (!decoding) membership_.reset();
  else if (!membership_) membership_.emplace(*batcher_);
}

void ActiveSequence::feed(std::span<const int32_t> tokens, std::span<const Hash128> keys, LogitsFor logits_for,
                          std::vector<float>& logits, const float* embeddings, bool bidirectional,
                          bool hidden_states) {
  if (tokens.empty()) return;
  ForwardBatch batch;
  batch.tokens = tokens;
  batch.pos0 = position_;
  batch.logits_for = logits_for;
  batch.hidden_states = hidden_states;
  batch.loras = loras_;
  if (embeddings) {
    batch.embeddings = embeddings;
    batch.embd_begin = 0;
    batch.embd_end = static_cast<int64_t>(tokens.size());
    if (bidirectional) {
      batch.bidir_begin = 0;
      batch.bidir_end = batch.embd_end;
    }
  }
  if (batcher_) {
    PassBatcher::Membership* away = partner_ && partner_->membership_ ? &*partner_->membership_ : nullptr;
    batcher_->run(batch, *memory_, logits, membership_ ? &*membership_ : nullptr, away);
  } else {
    std::lock_guard<std::mutex> lock(forward_mutex_);
    model_.forward(batch, *memory_, logits, pool_);
  }
  if (cached_) cached_->commit(tokens, keys);
  position_ += static_cast<int64_t>(tokens.size());
}

void ActiveSequence::snapshot(std::span<const int32_t> prefix, std::span<const Hash128> keys) {
  if (!keeps_snapshots()) return;
  snapshots_->put(cached_->namespace_hash(), prefix, keys, *cached_);
}

std::vector<int64_t> ActiveSequence::checkpoints(int64_t from, int64_t to) const {
  return keeps_snapshots() ? snapshots_->checkpoints(from, to) : std::vector<int64_t>{};
}

}  // namespace reprise
