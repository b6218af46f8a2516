// One model's state for one request: cached (paged blocks + snapshots) or
// flat, with the bookkeeping that keeps the cache consistent as tokens are
// fed, checkpointed and rolled back. Used by the engine for the target model
// and, with speculative decoding, for the draft model.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "cache/prefix_cache.h"
#include "cache/snapshot_store.h"
#include "engine/pass_batcher.h"
#include "engine/flat_memory.h"
#include "model/model.h"
#include "tensor/thread_pool.h"

namespace reprise {

class ActiveSequence {
 public:
  // `cache` null: flat, uncached state. `forward_mutex` serialises forward
  // passes on the shared pool. With a `batcher` (the model's), every batch
  // runs through it, sharing passes with other sequences. Every batch runs
  // with `loras` (model/lora_adapter.h), which `ns` must name.
  ActiveSequence(Model& model, ThreadPool& pool, std::mutex& forward_mutex, PrefixCache* cache,
                 SnapshotStore* snapshots, const NamespaceKey& ns, PassBatcher* batcher = nullptr,
                 std::vector<LoraUse> loras = {});

  // Reuses the longest valid cached prefix of `prompt` (leaving at least one
  // token to compute). For models with recurrent layers the prefix is cut back
  // to the longest snapshot. Call once, on a new sequence. With `reuse`
  // false nothing is reused (the caller needs every position computed).
  ReuseReport attach(std::span<const int32_t> prompt, std::span<const Hash128> keys, bool reuse = true);

  // Forgets positions >= n. Attention-only models (recurrent state cannot be
  // rolled back without a snapshot; callers restrict this).
  void truncate(int64_t n);

  // Positions from n on are speculative until settle(): the prefix cache
  // indexes none of them, so the rejected ones never become cached prefixes
  // (CachedSequence::hold_index_from). No-op for flat state.
  void hold_index_from(int64_t n);
  void settle();

  // Runs `tokens` at the current position and appends them. Logits as asked
  // (or, with `hidden_states`, the asked rows' final-norm hidden states).
  // With `embeddings` (tokens.size() x n_embd floats) the batch is fed as
  // input embeddings, attending bidirectionally within itself if asked.
  void feed(std::span<const int32_t> tokens, std::span<const Hash128> keys, LogitsFor logits_for,
            std::vector<float>& logits, const float* embeddings = nullptr, bool bidirectional = false,
            bool hidden_states = false);

  // Whether this sequence is in a phase where more batches follow at once
  // (a decode loop): while it is, it is a member of its batcher, so a pass
  // waits briefly for its next batch. Leave before the last batch (a pass
  // would otherwise wait for one that never comes). No-op without a batcher.
  void set_decoding(bool decoding);

  // Another sequence of the same request, on another model's batcher (the
  // target and its draft): while a batch of this one is queued or running,
  // the partner's membership counts as away, so that batcher's leaders do
  // not wait for the partner meanwhile.
  void set_partner(ActiveSequence* partner) { partner_ = partner; }

  // Stores a recurrent snapshot of the state after `prefix` (== everything fed
  // so far) when this sequence keeps snapshots.
  void snapshot(std::span<const int32_t> prefix, std::span<const Hash128> keys);
  bool keeps_snapshots() const { return cached_ && snapshots_ && model_.state_spec().has_recurrent(); }
  // Whether a snapshot taken now could be restored by a later request: the
  // store keeps entries and the prefix cache keeps the KV blocks beside it.
  bool snapshots_restorable() const {
    return keeps_snapshots() && snapshots_->config().budget_bytes > 0 && snapshots_->config().max_entries > 0 &&
           cache_->enabled();
  }
  int snapshot_chunk_tokens() const { return snapshots_ ? snapshots_->config().chunk_tokens : 0; }
  std::vector<int64_t> checkpoints(int64_t from, int64_t to) const;

  int64_t position() const { return position_; }
  Model& model() { return model_; }

 private:
  Model& model_;
  ThreadPool& pool_;
  std::mutex& forward_mutex_;
  PassBatcher* batcher_;
  std::optional<PassBatcher::Membership> membership_;
  ActiveSequence* partner_ = nullptr;
  PrefixCache* cache_;
  SnapshotStore* snapshots_;
  std::unique_ptr<CachedSequence> cached_;
  std::unique_ptr<FlatMemory> flat_;
  SequenceMemory* memory_;
  std::vector<LoraUse> loras_;
  int64_t position_ = 0;
};

}  // namespace reprise
