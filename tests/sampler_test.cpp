// Sampler: greedy picks the highest penalised logit with the lowest id on
// ties (checked against a plain statement of that rule on random logits with
// many ties), and seeded sampling is reproducible.
#include <gtest/gtest.h>

#include <random>
#include <unordered_set>

#include "engine/sampler.h"

using namespace reprise;

namespace {

int32_t reference_greedy(std::vector<float> logits, const std::vector<int32_t>& history, float penalty, int last_n) {
  std::unordered_set<int32_t> seen;
  for (size_t i = history.size() > size_t(last_n) ? history.size() - last_n : 0; i < history.size(); ++i)
    seen.insert(history[i]);
  if (penalty != 1.0f)
    for (int32_t id : seen) logits[id] = logits[id] > 0 ? logits[id] / penalty : logits[id] * penalty;
  int32_t best = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i)
    if (logits[i] > logits[best] || (logits[i] == logits[best] && i < best)) best = i;
  return best;
}

TEST(Sampler, GreedyIsTheHighestPenalisedLogitLowestIdOnTies) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 500; ++trial) {
    const int n_vocab = std::uniform_int_distribution<int>(1, 400)(rng);
    std::vector<float> logits(n_vocab);
    // Few distinct values: ties everywhere, on both sides of zero.
    for (auto& l : logits) l = static_cast<float>(std::uniform_int_distribution<int>(-4, 4)(rng)) * 0.5f;
    std::vector<int32_t> history(std::uniform_int_distribution<int>(0, 80)(rng));
    for (auto& h : history) h = std::uniform_int_distribution<int>(0, n_vocab - 1)(rng);
    SamplingParams p;
    p.temperature = 0;
    p.repeat_penalty = trial % 3 == 0 ? 1.0f : trial % 3 == 1 ? 1.3f : 0.7f;
    p.repeat_last_n = std::uniform_int_distribution<int>(1, 64)(rng);
    Sampler s(p);
    const int32_t want = reference_greedy(logits, history, p.repeat_penalty, p.repeat_last_n);
    ASSERT_EQ(s.sample(logits, history), want) << "trial " << trial;
    const std::vector<float> dist = s.distribution(logits, history);
    ASSERT_EQ(dist[want], 1.0f);
  }
}

TEST(Sampler, SeededSamplingIsReproducible) {
  std::mt19937 rng(9);
  std::vector<float> logits(1000);
  for (auto& l : logits) l = std::normal_distribution<float>(0, 2)(rng);
  SamplingParams p;
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int32_t> history;
  for (int i = 0; i < 50; ++i) {
    const int32_t x = a.sample(logits, history);
    ASSERT_EQ(x, b.sample(logits, history));
    history.push_back(x);
  }
}

}  // namespace
