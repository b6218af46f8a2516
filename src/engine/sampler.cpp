#include "engine/sampler.h"

#include "engine/logit_order.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace reprise {

std::string SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0 || temperature > 100)
    return "temperature must be between 0 and 100";
  if (!std::isfinite(top_p) || top_p <= 0 || top_p > 1) return "top_p must be in (0, 1]";
  if (!std::isfinite(min_p) || min_p < 0 || min_p > 1) return "min_p must be in [0, 1]";
  if (top_k < 0) return "top_k must be >= 0";
  if (!std::isfinite(repeat_penalty) || repeat_penalty <= 0 || repeat_penalty > 10)
    return "repeat_penalty must be in (0, 10]";
  if (repeat_last_n < 0) return "repeat_last_n must be >= 0";
  if (!std::isfinite(frequency_penalty) || frequency_penalty < -2 || frequency_penalty > 2)
    return "frequency_penalty must be in [-2, 2]";
  if (!std::isfinite(presence_penalty) || presence_penalty < -2 || presence_penalty > 2)
    return "presence_penalty must be in [-2, 2]";
  for (const auto& [id, bias] : logit_bias)
    if (id < 0 || !std::isfinite(bias) || bias < -100 || bias > 100)
      return "logit_bias needs token ids >= 0 and biases in [-100, 100]";
  return {};
}

namespace {

// The sum of exp(l - max) over the logits, in their order: the normaliser of
// their softmax (top-p's, the logprobs').
double exp_sum(std::span<const float> logits, float max) {
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - max);
  return sum;
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double Sampler::uniform() {
  // 53 random bits: identical on every platform.
  return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);
}

void Sampler::prepare(std::span<const float> logits, std::span<const int32_t> history) {
  const int64_t n_vocab = static_cast<int64_t>(logits.size());
  // llama.cpp's chain: the logit bias, then the repetition, frequency and
  // presence penalties over the recent window (each token's count in it).
  std::unordered_map<int32_t, int> counts;
  const bool penalties =
      params_.repeat_penalty != 1.0f || params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f;
  if (penalties && params_.repeat_last_n > 0) {
    const size_t start = history.size() > static_cast<size_t>(params_.repeat_last_n)
                             ? history.size() - params_.repeat_last_n : 0;
    for (size_t i = start; i < history.size(); ++i)
      if (history[i] >= 0 && history[i] < n_vocab) ++counts[history[i]];
  }
  auto penalised = [&](float l, int count) {
    if (params_.repeat_penalty != 1.0f) l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    return l - (static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty);
  };
  // The biased and penalised logits (a copy only when something applies).
  std::span<const float> v = logits;
  bool biased = false;
  for (const auto& [id, bias] : params_.logit_bias) biased |= id < n_vocab;
  if (!counts.empty() || biased) {
    penalised_logits_.assign(logits.begin(), logits.end());
    for (const auto& [id, bias] : params_.logit_bias)
      if (id < n_vocab) penalised_logits_[id] += bias;
    for (const auto& [id, count] : counts) penalised_logits_[id] = penalised(penalised_logits_[id], count);
    v = penalised_logits_;
  }
  if (params_.temperature <= 0.0f) {
    // Greedy: the highest (penalised) logit, the lowest id on ties (the
    // order below), found without building the candidate list: this runs
    // once per generated token.
    const int32_t best = highest_logit(v);
    candidates_.assign(1, {n_vocab > 0 ? v[best] : 0.0f, best});
    weights_.assign(1, 1.0);
    return;
  }
  // Top-k off with top-p or min-p: only the nucleus's part of the order is
  // needed (prepare_nucleus); NaN logits, and the cases below, sort as before.
  const bool top_k = params_.top_k > 0 && params_.top_k < n_vocab;
  if (!top_k && (params_.top_p < 1.0f || params_.min_p > 0.0f) && prepare_nucleus(v)) return;
  // Sorted descending (ties by id for determinism), then truncated.
  size_t keep = static_cast<size_t>(n_vocab);
  if (top_k && select_top_k(v, static_cast<size_t>(params_.top_k), candidates_, chunk_scratch_)) {
    keep = params_.top_k;
  } else {
    candidates_.resize(n_vocab);
    for (int64_t i = 0; i < n_vocab; ++i) candidates_[i] = {v[i], static_cast<int32_t>(i)};
    if (top_k) {
      keep = params_.top_k;
      std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), logit_before);
    } else {
      order_by_logit(candidates_, order_scratch_);  // the order std::sort with logit_before gives
    }
  }
  candidates_.resize(keep);

  // Probabilities at temperature 1 for top-p / min-p (llama.cpp's order:
  // truncation first, temperature last).
  std::vector<double>& probs = probs_;  // kept: a vocabulary-sized vector per token was faulted in each time
  probs.resize(keep);
  const float max_logit = candidates_[0].first;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(double(candidates_[i].first) - max_logit);
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += probs[n] / sum;
      ++n;
      if (cum >= params_.top_p) break;
    }
    keep = std::max<size_t>(n, 1);
  }
  if (params_.min_p > 0.0f) {
    size_t n = 1;
    while (n < keep && probs[n] / probs[0] >= params_.min_p) ++n;
    keep = n;
  }
  set_weights(keep, max_logit);
}

void Sampler::set_weights(size_t keep, float max_logit) {
  candidates_.resize(keep);
  weights_.resize(keep);
  for (size_t i = 0; i < keep; ++i)
    weights_[i] = std::exp(double(candidates_[i].first - max_logit) / params_.temperature);
}

bool Sampler::ordered_prefix(std::span<const float> v, size_t k) {
  if (k < v.size()) return select_top_k(v, k, candidates_, chunk_scratch_);
  candidates_.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) return false;
    candidates_[i] = {v[i], static_cast<int32_t>(i)};
  }
  order_by_logit(candidates_, order_scratch_);
  return true;
}

bool Sampler::prepare_nucleus(std::span<const float> v) {
  const size_t n_vocab = v.size();
  std::vector<double>& probs = probs_;
  double sum = 0;  // top-p's normaliser over the whole vocabulary
  bool first = true;
  for (size_t k = std::min<size_t>(kFirstPrefix, n_vocab);; k = std::min(n_vocab, k * 8), first = false) {
    if (!ordered_prefix(v, k)) return false;  // NaN: only the first prefix can find it
    const float max_logit = candidates_[0].first;
    if (first && params_.top_p < 1.0f) sum = exp_sum(v, max_logit);
    probs.resize(k);
    for (size_t i = 0; i < k; ++i) probs[i] = std::exp(double(candidates_[i].first) - max_logit);
    // The cuts, as prepare() makes them over the whole order: decided once
    // a cut falls inside this prefix, or the prefix is the whole order.
    bool decided = k == n_vocab;
    size_t keep = k;
    if (params_.top_p < 1.0f) {
      double cum = 0;
      size_t n = 0;
      while (n < k && cum < params_.top_p) cum += probs[n++] / sum;
      if (cum >= params_.top_p) decided = true;
      keep = std::max<size_t>(n, 1);
    }
    if (params_.min_p > 0.0f) {
      size_t n = 1;
      while (n < keep && probs[n] / probs[0] >= params_.min_p) ++n;
      if (n < keep) decided = true;
      keep = n;
    }
    if (!decided) continue;
    set_weights(keep, max_logit);
    return true;
  }
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  prepare(logits, history);
  if (candidates_.size() == 1) return candidates_[0].second;
  double total = 0;
  for (double w : weights_) total += w;
  const double u = uniform() * total;
  double acc = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    acc += weights_[i];
    if (u < acc) return candidates_[i].second;
  }
  return candidates_.back().second;
}

std::vector<float> Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history) {
  std::vector<float> p;
  distribution(logits, history, p);
  return p;
}

void Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history, std::vector<float>& out) {
  prepare(logits, history);
  out.assign(logits.size(), 0.0f);
  double total = 0;
  for (double w : weights_) total += w;
  for (size_t i = 0; i < candidates_.size(); ++i) out[candidates_[i].second] = static_cast<float>(weights_[i] / total);
}

int32_t Sampler::draw(std::span<const float> weights) {
  double total = 0;
  int32_t last_positive = 0;
  for (size_t i = 0; i < weights.size(); ++i)
    if (weights[i] > 0) total += weights[i], last_positive = static_cast<int32_t>(i);
  if (total <= 0) return argmax(weights);
  const double u = uniform() * total;
  double acc = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    acc += weights[i];
    if (weights[i] > 0 && u < acc) return static_cast<int32_t>(i);
  }
  return last_positive;
}

LogitNormaliser logit_normaliser(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  return {max, exp_sum(logits, max)};
}

// One rule for both functions below, so that a chosen token's logprob equals
// its own entry among the top ones bit for bit (clients compare them).
float logprob_of(float logit, double log_z) { return static_cast<float>(double(logit) - log_z); }

float token_logprob(std::span<const float> logits, int32_t id, const LogitNormaliser& z) {
  return logprob_of(logits[id], double(z.max) + std::log(z.sum));
}

std::vector<TokenProb> top_logprobs(std::span<const float> logits, int n, const LogitNormaliser& z) {
  const double log_z = double(z.max) + std::log(z.sum);
  n = std::clamp<int>(n, 0, static_cast<int>(logits.size()));
  std::vector<TokenProb> out;
  std::vector<std::pair<float, int32_t>> top;
  std::vector<float> scratch;
  if (n > 0 && static_cast<size_t>(n) < logits.size() && select_top_k(logits, static_cast<size_t>(n), top, scratch)) {
    for (const auto& [l, id] : top) out.push_back({id, logprob_of(l, log_z)});
    return out;
  }
  // NaN logits, or every token asked for: the comparator sort.
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (int i = 0; i < n; ++i) out.push_back({ids[i], logprob_of(logits[ids[i]], log_z)});
  return out;
}

}  // namespace reprise
