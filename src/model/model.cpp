#include "model/model.h"

#include <algorithm>

namespace reprise {

void Model::forward_steps(std::span<const SequenceStep> steps, std::vector<float>& logits, ThreadPool& pool) {
  const int64_t n_vocab = info().n_vocab;
  logits.resize(steps.size() * n_vocab);
  std::vector<float> one;
  for (size_t i = 0; i < steps.size(); ++i) {
    ForwardBatch batch;
    batch.tokens = std::span<const int32_t>(&steps[i].token, 1);
    batch.pos0 = steps[i].pos;
    batch.logits_for = LogitsFor::Last;
    forward(batch, *steps[i].memory, one, pool);
    std::copy(one.begin(), one.end(), logits.begin() + static_cast<int64_t>(i) * n_vocab);
  }
}

}  // namespace reprise
