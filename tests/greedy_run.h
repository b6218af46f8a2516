// Helpers of the cached-vs-cold differential tests: one greedy generation
// through an Engine with every step's logits kept, their bit-for-bit
// comparison, and random multi-turn traffic.
#pragma once
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace reprise::testing_support {

struct StepOutput {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  GenerateResult result;
};

inline StepOutput run(Engine& engine, const std::vector<int32_t>& prompt, int n_gen, const std::string& salt = "",
                      const std::vector<LoraUse>& loras = {}) {
  GenerateRequest req;
  req.prompt = prompt;
  req.sampling.temperature = 0;
  req.max_tokens = n_gen;
  req.cache_salt = salt;
  req.loras = loras;
  StepOutput out;
  out.result = engine.generate(req, [&](int32_t tok, std::span<const float> logits) {
    out.tokens.push_back(tok);
    out.logits.emplace_back(logits.begin(), logits.end());
    return true;
  });
  return out;
}

// Same tokens and bit-identical logits at every step (any record with
// `tokens` and `logits` like StepOutput).
template <typename Run>
bool bit_identical(const Run& a, const Run& b) {
  if (a.tokens != b.tokens || a.logits.size() != b.logits.size()) return false;
  for (size_t i = 0; i < a.logits.size(); ++i)
    if (a.logits[i].size() != b.logits[i].size() ||
        std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// Random multi-turn traffic: each prompt continues an earlier conversation
// (its prompt and reply) or, one time in three, cuts it at a random point
// (an edit), or one time in four starts fresh; then 1..max_new random tokens
// in [1, max_token] are appended.
class ConversationScript {
 public:
  ConversationScript(std::mt19937& rng, int max_new, int max_token)
      : rng_(rng), max_new_(max_new), max_token_(max_token) {}

  std::vector<int32_t> next_prompt() {
    std::vector<int32_t> prompt;
    if (!conversations_.empty() && rnd(0, 3) > 0) {
      prompt = conversations_[rnd(0, static_cast<int>(conversations_.size()) - 1)];
      if (rnd(0, 2) == 0) prompt.resize(rnd(1, static_cast<int>(prompt.size())));
    }
    for (int i = rnd(1, max_new_); i > 0; --i) prompt.push_back(rnd(1, max_token_));
    return prompt;
  }
  // The conversation so far after `prompt` was answered with `reply`.
  void record(std::vector<int32_t> prompt, const std::vector<int32_t>& reply) {
    prompt.insert(prompt.end(), reply.begin(), reply.end());
    conversations_.push_back(std::move(prompt));
  }

 private:
  int rnd(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::mt19937& rng_;
  const int max_new_, max_token_;
  std::vector<std::vector<int32_t>> conversations_;
};

}  // namespace reprise::testing_support
