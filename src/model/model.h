// The interface every architecture implements.
#pragma once
#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/lora_adapter.h"
#include "model/sequence_memory.h"
#include "model/state_spec.h"
#include "tensor/thread_pool.h"
#include "util/error.h"

namespace reprise {

namespace gguf { class File; }

struct ModelInfo {
  std::string arch;
  std::string name;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_params = 0;
  uint64_t weight_bytes = 0;
  float attention_scale = 0;  // attention layers' query-key scale; 0 without attention
  // 128-bit hash of the architecture, hyper-parameters, state layout and
  // every tensor's bytes: the model's execution identity (not its file name).
  std::array<uint64_t, 2> fingerprint{};
};

// Which positions of a batch need logits.
enum class LogitsFor { None, Last, All };

// One contiguous run of a sequence's tokens. Positions are pos0..pos0+n-1 and
// positions < pos0 must already be present in the sequence memory.
struct ForwardBatch {
  std::span<const int32_t> tokens;
  int64_t pos0 = 0;
  LogitsFor logits_for = LogitsFor::Last;
  // Optional input embeddings that replace token embeddings (n_embd floats per
  // token; vision). Spans [embd_begin, embd_end) of the batch use them.
  const float* embeddings = nullptr;
  int64_t embd_begin = 0;
  int64_t embd_end = 0;
  // Batch indices [bidir_begin, bidir_end) attend to each other both ways
  // (gemma3 image tokens); empty range for purely causal batches.
  int64_t bidir_begin = 0;
  int64_t bidir_end = 0;
  // Embeddings: the rows logits_for asks for receive their final-norm hidden
  // state (n_embd floats each: the input of the vocabulary projection)
  // instead of logits.
  bool hidden_states = false;
  // LoRA adapters this sequence runs with (none: the base weights), applied
  // in order to every product whose matrix they adapt. A model that cannot
  // apply one refuses it in check_adapter, before any pass.
  std::span<const LoraUse> loras;
};

// One sequence's part of a multi-sequence pass: `batch` run on `memory`,
// `logits` receiving what batch.logits_for asks.
struct SequenceBatch {
  ForwardBatch batch;
  SequenceMemory* memory = nullptr;
  std::vector<float>* logits = nullptr;
};

// forward_many's report of a batch that cannot run; nothing ran.
class BatchRejected : public Error {
 public:
  BatchRejected(size_t index, std::exception_ptr cause, const std::string& message)
      : Error(message), index(index), cause(std::move(cause)) {}
  size_t index;               // into forward_many's batches
  std::exception_ptr cause;   // what the batch alone would have thrown
};

// One sequence's next token in a multi-sequence decode step: `token` at
// position `pos` of `memory` (positions < pos already present).
struct SequenceStep {
  int32_t token = 0;
  int64_t pos = 0;
  SequenceMemory* memory = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  virtual const StateSpec& state_spec() const = 0;
  // Runs the batch; `logits` receives n_vocab floats for the last position
  // (LogitsFor::Last) or for every position in order (LogitsFor::All).
  virtual void forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
                       ThreadPool& pool) = 0;
  // Continuous batching: runs several sequences' batches (decode steps,
  // prompt chunks; distinct memories; empty batches are skipped) as one
  // pass. Every batch's logits and state are bit-identical to forward() of
  // that batch alone (the kernels' results do not depend on the batch), so
  // batching never changes what a sequence generates or caches.
  // Architectures that share one pass across sequences (streaming their
  // weights once for all of them) override this; the default runs the
  // batches one at a time.
  //
  // Errors: a batch that cannot run (a token id out of range, a memory that
  // cannot hold its positions) is reported as BatchRejected naming it,
  // before any batch's state changes, so the others can be run again without
  // it. Any other exception may leave the batches' state partly advanced.
  virtual void forward_many(std::span<const SequenceBatch> batches, ThreadPool& pool);
  // True when forward_many shares one pass across its batches.
  virtual bool batches_sequences() const { return false; }
  // Sizes (and so first writes) the scratch of passes of up to n_tokens
  // rows on this pool now, rather than in the first long prompt: where
  // fresh memory is slow to fault in (a VM whose host takes back free guest
  // memory: ~4 ms per 2 MiB), that prompt paid for all of it. A server
  // calls it for the model it loads at start-up. Architectures without
  // such scratch do nothing.
  virtual void prepare_scratch(int64_t n_tokens, ThreadPool& pool) { (void)n_tokens, (void)pool; }
  // Throws reprise::Error saying why this model cannot run `adapter` (another
  // architecture, a tensor it does not have or uses differently, a shape
  // that does not match); returns when batches may carry it. Architectures
  // without adapter support refuse every adapter.
  virtual void check_adapter(const LoraAdapter& adapter) const;

  // forward_many of one-token batches; `logits` receives n_vocab floats per
  // step, in order.
  void forward_steps(std::span<const SequenceStep> steps, std::vector<float>& logits, ThreadPool& pool);
};

// Loads the architecture the GGUF names; throws reprise::Error for
// unsupported architectures or inconsistent files. The file must outlive the model.
std::unique_ptr<Model> load_model(const gguf::File& file);

// How many bytes more than the file's tensor data a loaded model's weights
// take: matrices whose packed form is larger than their stored one (the K
// types' and IQ4_XS's scales are unpacked to bytes).
// Memory accounting adds it to the file's size before loading. Every such
// matrix counts, also an untied embedding the model reads in place: an
// overestimate, never an underestimate.
uint64_t packing_growth_bytes(const gguf::File& file);

}  // namespace reprise
