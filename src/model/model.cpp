#include "model/model.h"

#include <algorithm>

#include "tensor/thread_pool.h"
#include "util/error.h"

namespace reprise {

void Model::check_adapter(const LoraAdapter& adapter) const {
  throw Error(adapter.path() + ": LoRA adapters are not supported for '" + info().arch +
              "' models (supported: llama, qwen2, qwen3, gemma3)");
}

void Model::forward_many(std::span<const SequenceBatch> batches, ThreadPool& pool) {
  for (const SequenceBatch& b : batches)
    if (!b.batch.tokens.empty()) forward(b.batch, *b.memory, *b.logits, pool);
}

void Model::forward_steps(std::span<const SequenceStep> steps, std::vector<float>& logits, ThreadPool& pool) {
  const int64_t n_vocab = info().n_vocab;
  // Each step's logits land in a vector of its own first. These keep their
  // capacity from call to call (once per pool, as a pass's scratch): fresh
  // 128 KB vectors every step were given fresh pages, whose faults took
  // ~10 % of a 4-sequence decode step.
  struct StepLogits {
    std::vector<std::vector<float>> per_step;
  };
  std::vector<std::vector<float>>& per_step = pool.caller_local<StepLogits>().per_step;
  if (per_step.size() < steps.size()) per_step.resize(steps.size());
  std::vector<SequenceBatch> batches(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    batches[i].batch.tokens = std::span<const int32_t>(&steps[i].token, 1);
    batches[i].batch.pos0 = steps[i].pos;
    batches[i].batch.logits_for = LogitsFor::Last;
    batches[i].memory = steps[i].memory;
    batches[i].logits = &per_step[i];
  }
  forward_many(batches, pool);
  logits.resize(steps.size() * n_vocab);
  for (size_t i = 0; i < steps.size(); ++i)
    std::copy(per_step[i].begin(), per_step[i].end(), logits.begin() + static_cast<int64_t>(i) * n_vocab);
}

}  // namespace reprise
