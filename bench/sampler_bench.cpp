// Google Benchmark micro-benchmarks for token sampling (src/engine/sampler.h):
// one draw per iteration from a model-like logit vector (a normal spread with
// a few much higher logits), at a 32 000-token vocabulary (llama 2, the 60M
// shape) and a 151 936-token one (qwen2/qwen3). Args: vocabulary size, mode
// (0 greedy, 1 the defaults: top-k 40, top-p 0.95, min-p 0.05, temperature
// 0.8; 2 the same with a repetition penalty of 1.1 over the last 64 tokens;
// 3 top-k off); and the logprobs the server reports.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/sampler.h"

namespace {

using reprise::Sampler;
using reprise::SamplingParams;

void BM_Sample(benchmark::State& state) {
  const int n_vocab = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  std::mt19937 rng(5);
  std::vector<float> logits(n_vocab);
  for (float& l : logits) l = std::normal_distribution<float>(0.0f, 2.5f)(rng);
  for (int i = 0; i < 20; ++i) logits[rng() % n_vocab] += 12.0f;
  std::vector<int32_t> history(64);
  for (int32_t& h : history) h = static_cast<int32_t>(rng() % n_vocab);
  SamplingParams p;
  if (mode == 0) p.temperature = 0.0f;
  if (mode == 2) p.repeat_penalty = 1.1f;
  if (mode == 3) p.top_k = 0;
  Sampler sampler(p);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits, history));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Sample)->ArgsProduct({{32000, 151936}, {0, 1, 2, 3}})->Unit(benchmark::kMicrosecond);

// A token's logprobs as the server reports them with `top_logprobs`: the
// chosen token's log-softmax and the n most likely tokens'. Args: vocabulary
// size, n.
void BM_Logprobs(benchmark::State& state) {
  const int n_vocab = static_cast<int>(state.range(0));
  std::mt19937 rng(6);
  std::vector<float> logits(n_vocab);
  for (float& l : logits) l = std::normal_distribution<float>(0.0f, 2.5f)(rng);
  for (int i = 0; i < 20; ++i) logits[rng() % n_vocab] += 12.0f;
  for (auto _ : state) {
    const reprise::LogitNormaliser z = reprise::logit_normaliser(logits);
    benchmark::DoNotOptimize(reprise::token_logprob(logits, 7, z));
    benchmark::DoNotOptimize(reprise::top_logprobs(logits, static_cast<int>(state.range(1)), z));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Logprobs)->ArgsProduct({{32000, 151936}, {5, 20}})->Unit(benchmark::kMicrosecond);

}  // namespace
