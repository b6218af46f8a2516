// Token sampling: repetition penalty, top-k, top-p, min-p, temperature, and a
// seeded draw. The same seed, logits and history always give the same token.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace reprise {

struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy (argmax)
  int top_k = 40;            // <= 0: disabled
  float top_p = 0.95f;       // >= 1: disabled
  float min_p = 0.05f;       // <= 0: disabled
  float repeat_penalty = 1.0f;  // 1: disabled
  // OpenAI's penalties: a token's logit loses frequency_penalty per time it
  // occurs in the window and presence_penalty once if it occurs (0: off).
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int repeat_last_n = 64;  // the window of the three penalties (tokens; 0: none)
  // Added to the listed tokens' logits before anything else (OpenAI's
  // logit_bias); ids outside the vocabulary are ignored.
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0xC0FFEE;

  // Empty when valid, otherwise a message naming the bad field.
  std::string validate() const;
};

struct TokenProb {
  int32_t id;
  float logprob;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token. `history` is the sequence so far (for penalties).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // The distribution sample() draws from, over the whole vocabulary (zero
  // outside the kept candidates; one-hot for greedy). For speculative sampling.
  std::vector<float> distribution(std::span<const float> logits, std::span<const int32_t> history);
  // The same into `out` (resized to the vocabulary), so a caller drawing
  // many distributions reuses one buffer instead of a fresh vocabulary-sized
  // vector, and its fresh pages, per token.
  void distribution(std::span<const float> logits, std::span<const int32_t> history, std::vector<float>& out);
  // Draws a token from an (unnormalised, non-negative) distribution.
  int32_t draw(std::span<const float> weights);
  const SamplingParams& params() const { return params_; }

 private:
  // Applies penalties and truncation; leaves the kept candidates (sorted by
  // logit) in candidates_ and their unnormalised weights in weights_.
  void prepare(std::span<const float> logits, std::span<const int32_t> history);
  // Top-k off with top-p or min-p: the first candidates of the order in
  // prefixes of growing length until the cuts fall inside one, so a peaked
  // distribution's nucleus is found without sorting the vocabulary. Top-p's
  // normaliser is the whole vocabulary's, summed in vocabulary order. False
  // (nothing set) when a logit is NaN.
  bool prepare_nucleus(std::span<const float> v);
  // The first min(k, size) candidates of the order into candidates_; false
  // when a logit is NaN.
  bool ordered_prefix(std::span<const float> v, size_t k);
  // Truncates candidates_ to `keep` and sets their weights at the temperature.
  void set_weights(size_t keep, float max_logit);
  static constexpr size_t kFirstPrefix = 64;
  double uniform();
  std::vector<double> weights_;
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> penalised_logits_;  // the logits after the bias and penalties, when any applies
  std::vector<std::pair<float, int32_t>> order_scratch_;
  std::vector<float> chunk_scratch_;  // select_top_k's
  std::vector<double> probs_;
};

// Index of the largest logit (lowest id on ties).
int32_t argmax(std::span<const float> logits);
// The raw logits' log-softmax normaliser: their maximum and the sum of
// exp(logit - max) over the vocabulary, taken once per token for both
// functions below (each pass is an exp per vocabulary entry).
struct LogitNormaliser {
  float max;
  double sum;
};
LogitNormaliser logit_normaliser(std::span<const float> logits);
// log-softmax of the raw logits for `id`, and the n most likely tokens
// (highest first, lower ids first on ties).
float token_logprob(std::span<const float> logits, int32_t id, const LogitNormaliser& z);
std::vector<TokenProb> top_logprobs(std::span<const float> logits, int n, const LogitNormaliser& z);

}  // namespace reprise
