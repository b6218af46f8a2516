// Sampler: greedy picks the highest penalised logit with the lowest id on
// ties (checked against a plain statement of that rule on random logits with
// many ties), and seeded sampling is reproducible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <cstring>
#include <unordered_set>

#include "engine/logit_order.h"
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

// Speculative sampling draws every distribution into buffers it keeps
// across tokens: a reused buffer, whatever it held and however long it was,
// must come out exactly as a fresh one.
TEST(Sampler, DistributionIntoAReusedBufferEqualsAFreshOne) {
  std::mt19937 rng(12);
  std::vector<float> reused(7, 123.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int n_vocab = std::uniform_int_distribution<int>(1, 600)(rng);
    std::vector<float> logits(n_vocab);
    for (auto& l : logits) l = std::normal_distribution<float>(0, 3)(rng);
    std::vector<int32_t> history(std::uniform_int_distribution<int>(0, 40)(rng));
    for (auto& h : history) h = std::uniform_int_distribution<int>(0, n_vocab - 1)(rng);
    SamplingParams p;
    p.temperature = trial % 4 == 0 ? 0.0f : 0.8f;
    p.top_k = trial % 3 == 0 ? 0 : 40;
    p.repeat_penalty = 1.2f;
    Sampler fresh_sampler(p), reuse_sampler(p);
    const std::vector<float> fresh = fresh_sampler.distribution(logits, history);
    if (trial % 2) std::fill(reused.begin(), reused.end(), 0.5f);  // stale mass where the candidates are not
    reuse_sampler.distribution(logits, history, reused);
    ASSERT_EQ(reused.size(), fresh.size()) << trial;
    ASSERT_EQ(std::memcmp(reused.data(), fresh.data(), fresh.size() * sizeof(float)), 0) << trial;
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

bool by_logit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

// order_by_logit gives std::sort's order, on values with many ties, both
// zeros, infinities, subnormals and a wide range of magnitudes.
TEST(LogitOrder, MatchesStdSort) {
  std::mt19937 rng(11);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf, 1e-40f, -1e-40f, 3.5f, -3.5f, 1e30f, -1e30f};
  std::vector<std::pair<float, int32_t>> got, want, scratch;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = static_cast<int>(rng() % 3000);
    got.clear();
    for (int i = 0; i < n; ++i) {
      float v;
      switch (rng() % 3) {
        case 0: v = specials[rng() % std::size(specials)]; break;
        case 1: v = static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.25f; break;  // ties
        default: v = std::normal_distribution<float>(0.0f, 1.0f + static_cast<float>(trial))(rng); break;
      }
      got.push_back({v, i});
    }
    want = got;
    std::sort(want.begin(), want.end(), by_logit);
    order_by_logit(got, scratch);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].second, want[i].second) << "trial " << trial << " position " << i;
      ASSERT_EQ(std::memcmp(&got[i].first, &want[i].first, sizeof(float)), 0);
    }
  }
}

// Random logits of the kinds LogitOrder.MatchesStdSort draws.
std::vector<float> tricky_logits(std::mt19937& rng, int n, int trial) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf, 1e-40f, -1e-40f, 3.5f, -3.5f, 1e30f, -1e30f};
  std::vector<float> v(n);
  for (auto& x : v) {
    switch (rng() % 4) {
      case 0: x = specials[rng() % std::size(specials)]; break;
      case 1: x = static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.25f; break;  // ties
      default: x = std::normal_distribution<float>(0.0f, 1.0f + static_cast<float>(trial % 7))(rng); break;
    }
  }
  return v;
}

// select_top_k gives the first k of std::partial_sort over all candidates,
// at every k and length (chunks of 64 and short tails), with ties, both
// zeros and infinities; and refuses NaN.
TEST(LogitOrder, SelectTopKMatchesPartialSort) {
  std::mt19937 rng(21);
  std::vector<std::pair<float, int32_t>> got, want;
  std::vector<float> scratch;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = trial < 300 ? 2 + static_cast<int>(rng() % 2000) : 32000;
    std::vector<float> v = tricky_logits(rng, n, trial);
    if (trial % 5 == 0)  // a peaked distribution, as a model's logits are
      for (auto& x : v) x = std::normal_distribution<float>(0.0f, 2.0f)(rng) + (rng() % 500 == 0 ? 15.0f : 0.0f);
    const size_t k = trial % 4 == 0 ? 1 : trial % 4 == 1 ? n - 1 : 1 + rng() % std::min(n - 1, 200);
    want.clear();
    for (int i = 0; i < n; ++i) want.push_back({v[i], i});
    std::partial_sort(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(k), want.end(), by_logit);
    ASSERT_TRUE(select_top_k(v, k, got, scratch)) << trial;
    ASSERT_EQ(got.size(), k);
    for (size_t i = 0; i < k; ++i) {
      ASSERT_EQ(got[i].second, want[i].second) << "trial " << trial << " n " << n << " k " << k << " position " << i;
      ASSERT_EQ(std::memcmp(&got[i].first, &want[i].first, sizeof(float)), 0);
    }
    v[rng() % n] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_FALSE(select_top_k(v, k, got, scratch)) << trial;
  }
}

// highest_logit is the scan that takes index i when logits[i] > logits[best].
TEST(LogitOrder, HighestLogitIsTheFirstStrictlyGreaterScan) {
  std::mt19937 rng(22);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int trial = 0; trial < 600; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 100) + (trial % 10 == 0 ? 32000 : 0);
    std::vector<float> v = tricky_logits(rng, n, trial);
    if (trial % 3 == 0) v[rng() % n] = nan;
    if (trial % 11 == 0) v[0] = nan;
    if (trial % 13 == 0) std::fill(v.begin(), v.end(), -std::numeric_limits<float>::infinity());
    int32_t want = 0;
    for (int i = 1; i < n; ++i)
      if (v[i] > v[want]) want = i;
    ASSERT_EQ(highest_logit(v), want) << "trial " << trial << " n " << n;
  }
  EXPECT_EQ(highest_logit({}), 0);
}

// top_logprobs names the n highest logits in the comparator's order (ties:
// lower id) with their log-softmax, as a sort of every id gives; with NaN
// logits too (the sort's own path), and when every token is asked for.
TEST(Logprobs, TopLogprobsAreTheSortedIdsLogSoftmax) {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 200; ++trial) {
    const int n_vocab = trial % 20 == 0 ? 32000 : 1 + static_cast<int>(rng() % 3000);
    std::vector<float> logits = tricky_logits(rng, n_vocab, trial);
    for (auto& l : logits)
      if (std::isinf(l) || std::fabs(l) > 1e20f) l = 0.5f;  // finite, as a model's are
    if (trial % 7 == 0) logits[rng() % n_vocab] = std::numeric_limits<float>::quiet_NaN();
    const int n = trial % 9 == 0 ? n_vocab : 1 + static_cast<int>(rng() % 20);
    const LogitNormaliser z = logit_normaliser(logits);
    const std::vector<TokenProb> got = top_logprobs(logits, n, z);
    std::vector<int32_t> ids(n_vocab);
    for (int i = 0; i < n_vocab; ++i) ids[i] = i;
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const int want_n = std::min(n, n_vocab);
    ASSERT_EQ(static_cast<int>(got.size()), want_n) << trial;
    if (trial % 7 == 0) continue;  // NaN: the comparator defines no order to compare with
    // log p = logit - (max + log sum), in double, rounded once.
    const double log_z = double(z.max) + std::log(z.sum);
    for (int i = 0; i < want_n; ++i) {
      ASSERT_EQ(got[i].id, ids[i]) << "trial " << trial << " rank " << i;
      ASSERT_EQ(got[i].logprob, static_cast<float>(double(logits[ids[i]]) - log_z));
      // A chosen token's logprob is its own top entry, bit for bit.
      ASSERT_EQ(token_logprob(logits, got[i].id, z), got[i].logprob);
    }
    const int32_t id = static_cast<int32_t>(rng() % n_vocab);
    EXPECT_EQ(token_logprob(logits, id, z), static_cast<float>(double(logits[id]) - log_z));
  }
}

TEST(LogitOrder, NanSortsLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::pair<float, int32_t>> c = {{1.0f, 0}, {nan, 1}, {-2.0f, 2}, {nan, 3}, {5.0f, 4}}, scratch;
  order_by_logit(c, scratch);
  EXPECT_EQ(c[0].second, 4);
  EXPECT_EQ(c[1].second, 0);
  EXPECT_EQ(c[2].second, 2);
  EXPECT_EQ(c[3].second, 1);
  EXPECT_EQ(c[4].second, 3);
}

// With top-k off, a seeded draw is the one the rule stated plainly gives:
// all candidates sorted by logit (ties: lower id), cut by top-p over the
// whole vocabulary's probabilities (their sum taken in vocabulary order;
// `sorted_sum`: in the candidates' order, as top-k's rule takes it over its
// k), then by min-p, weights at the temperature, one uniform draw of 53 bits.
int32_t reference_draw(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng,
                       bool sorted_sum = false) {
  std::vector<std::pair<float, int32_t>> c;
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({logits[i], static_cast<int32_t>(i)});
  std::sort(c.begin(), c.end(), by_logit);
  std::vector<double> probs(c.size());
  for (size_t i = 0; i < c.size(); ++i) probs[i] = std::exp(double(c[i].first) - c[0].first);
  double sum = 0;
  if (sorted_sum)
    for (double q : probs) sum += q;
  else
    for (float l : logits) sum += std::exp(double(l) - c[0].first);
  size_t keep = c.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += probs[n] / sum;
      ++n;
      if (cum >= p.top_p) break;
    }
    keep = std::max<size_t>(n, 1);
  }
  if (p.min_p > 0.0f) {
    size_t n = 1;
    while (n < keep && probs[n] / probs[0] >= p.min_p) ++n;
    keep = n;
  }
  std::vector<double> w(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += w[i] = std::exp(double(c[i].first - c[0].first) / p.temperature);
  const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += w[i];
    if (u < acc) return c[i].second;
  }
  return c[keep - 1].second;
}

// (Top-k off with top-p or min-p finds the nucleus in prefixes of the order
// that grow until the cuts fall inside one: wide spreads and low min-p make
// it grow to thousands, peaked ones stop at the first.)
TEST(Sampler, TopKOffDrawsWhatAFullSortGives) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 80; ++trial) {
    SamplingParams p;
    p.top_k = 0;
    p.top_p = trial % 4 == 0 ? 1.0f : trial % 4 == 1 ? 0.9f : trial % 4 == 2 ? 0.5f : 0.999f;
    p.min_p = trial % 3 == 0 ? 0.0f : trial % 3 == 1 ? 0.05f : 0.001f;
    p.temperature = 0.7f;
    p.seed = 100 + trial;
    std::vector<float> logits(trial % 10 == 0 ? 32000 : trial % 5 == 1 ? 40 : 5000);
    // Many ties (quarter steps) and a spread that leaves long tails; every
    // third a peaked one, as a model's logits are.
    const float spread = trial % 3 == 2 ? 1.0f : 3.0f;
    for (auto& l : logits) l = std::round(std::normal_distribution<float>(0, spread)(rng) * 4) / 4;
    if (trial % 3 == 2)
      for (int j = 0; j < 5; ++j) logits[rng() % logits.size()] += 10.0f;
    Sampler s(p);
    std::mt19937_64 ref_rng(p.seed);
    for (int i = 0; i < 20; ++i) ASSERT_EQ(s.sample(logits, {}), reference_draw(logits, p, ref_rng)) << trial;
  }
}

// With top-k on (the default sampling), a seeded draw is the rule's: the
// whole vocabulary sorted, cut to the k highest, then top-p, min-p and the
// draw as above; with and without a repetition penalty.
TEST(Sampler, TopKDrawsWhatAFullSortGives) {
  std::mt19937 rng(14);
  for (int trial = 0; trial < 60; ++trial) {
    SamplingParams p;
    p.top_k = trial % 3 == 0 ? 1 : trial % 3 == 1 ? 40 : 300;
    p.top_p = trial % 2 == 0 ? 1.0f : 0.95f;
    p.min_p = trial % 4 < 2 ? 0.0f : 0.05f;
    p.temperature = 0.8f;
    p.repeat_penalty = trial % 5 == 0 ? 1.3f : 1.0f;
    p.seed = 200 + trial;
    const int n = trial % 6 == 0 ? 32000 : 3000 + static_cast<int>(rng() % 3000);
    std::vector<float> logits(n);
    for (auto& l : logits) l = std::round(std::normal_distribution<float>(0, 3)(rng) * 4) / 4;
    std::vector<int32_t> history(50);
    for (auto& h : history) h = static_cast<int32_t>(rng() % n);
    // The rule, stated plainly: penalised logits, all sorted, the first k.
    std::vector<float> penalised = logits;
    if (p.repeat_penalty != 1.0f) {
      std::unordered_set<int32_t> seen(history.begin(), history.end());
      for (int32_t id : seen) penalised[id] = penalised[id] > 0 ? penalised[id] / p.repeat_penalty : penalised[id] * p.repeat_penalty;
    }
    std::vector<std::pair<float, int32_t>> c;
    for (int i = 0; i < n; ++i) c.push_back({penalised[i], i});
    std::sort(c.begin(), c.end(), by_logit);
    c.resize(p.top_k);
    std::vector<float> top(n, -std::numeric_limits<float>::infinity());
    Sampler s(p);
    std::mt19937_64 ref_rng(p.seed);
    SamplingParams ref = p;
    ref.top_k = 0;
    for (int i = 0; i < 10; ++i) {
      // reference_draw over only the k kept candidates: every other logit
      // -inf weighs 0 and sorts after them.
      for (const auto& [l, id] : c) top[id] = l;
      ASSERT_EQ(s.sample(logits, history), reference_draw(top, ref, ref_rng, /*sorted_sum=*/true))
          << "trial " << trial << " draw " << i;
    }
  }
}

}  // namespace

namespace {

// llama.cpp's chain stated plainly: the logit bias, then per token in the
// window the repetition penalty and count * frequency + presence.
std::vector<float> reference_adjusted(std::vector<float> logits, const std::vector<int32_t>& history,
                                      const SamplingParams& p) {
  for (const auto& [id, bias] : p.logit_bias)
    if (id < static_cast<int32_t>(logits.size())) logits[id] += bias;
  std::vector<int> count(logits.size(), 0);
  for (size_t i = history.size() > size_t(p.repeat_last_n) ? history.size() - p.repeat_last_n : 0; i < history.size();
       ++i)
    ++count[history[i]];
  for (size_t id = 0; id < logits.size(); ++id) {
    if (!count[id]) continue;
    float& l = logits[id];
    if (p.repeat_penalty != 1.0f) l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
    l -= static_cast<float>(count[id]) * p.frequency_penalty + p.presence_penalty;
  }
  return logits;
}

}  // namespace

// Frequency and presence penalties and the logit bias (OpenAI's parameters,
// in llama.cpp's order): greedy picks the adjusted maximum and sampling draws
// the adjusted softmax, on random logits, windows and settings.
TEST(Sampler, PenaltiesAndLogitBiasAdjustTheLogitsInLlamaCppsOrder) {
  std::mt19937 rng(12);
  auto uni = [&](float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); };
  for (int trial = 0; trial < 300; ++trial) {
    const int n_vocab = std::uniform_int_distribution<int>(2, 300)(rng);
    std::vector<float> logits(n_vocab);
    for (auto& l : logits) l = uni(-6, 6);
    std::vector<int32_t> history(std::uniform_int_distribution<int>(0, 100)(rng));
    for (auto& h : history) h = std::uniform_int_distribution<int>(0, std::min(n_vocab, 20) - 1)(rng);
    SamplingParams p;
    p.frequency_penalty = trial % 4 == 0 ? 0.0f : uni(-2, 2);
    p.presence_penalty = trial % 5 == 0 ? 0.0f : uni(-2, 2);
    p.repeat_penalty = trial % 3 == 0 ? uni(0.5f, 2.0f) : 1.0f;
    p.repeat_last_n = std::uniform_int_distribution<int>(0, 80)(rng);
    for (int b = std::uniform_int_distribution<int>(0, 4)(rng); b > 0; --b)
      p.logit_bias.emplace_back(std::uniform_int_distribution<int>(0, n_vocab + 5)(rng), uni(-100, 100));
    ASSERT_EQ(p.validate(), "");
    const std::vector<float> want = reference_adjusted(logits, history, p);

    p.temperature = 0;
    Sampler greedy(p);
    EXPECT_EQ(greedy.sample(logits, history), static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin()))
        << "trial " << trial;

    p.temperature = 1;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    Sampler sampler(p);
    const std::vector<float> dist = sampler.distribution(logits, history);
    const float max = *std::max_element(want.begin(), want.end());
    double sum = 0;
    for (float l : want) sum += std::exp(double(l) - max);
    double total = 0;
    for (float d : dist) total += d;
    for (int i = 0; i < n_vocab; ++i)
      EXPECT_NEAR(dist[i] / total, std::exp(double(want[i]) - max) / sum, 1e-5) << "trial " << trial << " id " << i;
  }
  SamplingParams bad;
  bad.frequency_penalty = 2.5f;
  EXPECT_NE(bad.validate(), "");
  bad = {};
  bad.logit_bias = {{3, 101.0f}};
  EXPECT_NE(bad.validate(), "");
}
