#include "model/team_step.h"

#include "model/lora_apply.h"
#include "tensor/thread_pool.h"

namespace reprise {

std::vector<float>& TeamStepState::begin(std::span<const PassSegment> segments, int64_t n_vocab, ThreadPool& pool) {
  const auto n = static_cast<int64_t>(segments.size());
  if (!team || team->size() != pool.size()) team = std::make_unique<DecodeTeam>(pool);
  std::vector<float>& out = n == 1 ? *segments[0].logits : logits;
  out.resize(n * n_vocab);
  plan_team_step(firsts, n, plan, pool);
  return out;
}

void TeamStepState::end(std::span<const PassSegment> segments, int64_t n_vocab, ThreadPool& pool) {
  // A step with adapters times their deltas inside its products' windows:
  // reported, it would teach the tuner distances for products that are not
  // what the base model's steps run.
  if (!pass_has_loras(segments)) report_team_step(plan, pool);
  if (segments.size() > 1)
    for (size_t r = 0; r < segments.size(); ++r)
      segments[r].logits->assign(logits.begin() + static_cast<int64_t>(r) * n_vocab,
                                 logits.begin() + static_cast<int64_t>(r + 1) * n_vocab);
}

}  // namespace reprise
